"""What runs only on a CPU: the C kernels and their build (``native.py``, ``amx_linear.py`` with ``amx_linear.c``,
``fused_attention.py`` with ``decode_attention.c``, ``vector_exp.h``), prepacked matmuls for frozen weights
(``packed.py``), the Llama-family decode step on them (``decode.py``) and the C heap's settings (``heap.py``).
Imported on the CPU paths only: a CUDA engine never loads them (a test checks it).

Not here: anything a GPU runs (``gpu/``).
"""
