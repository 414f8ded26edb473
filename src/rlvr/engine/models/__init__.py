"""Models and LoRA: loading a base model by name (``load.py``: tiny, the embedded SmolLM2, a GGUF file, a Hugging
Face folder or hub id), the test models (``tiny.py``, ``random_models.py``: published shapes with random weights) and
the LoRA adapters on a base model (``lora.py``).

Not here: where the model computes (``engine.device``), what trains or samples it (``train/``, ``sample/``).
"""
