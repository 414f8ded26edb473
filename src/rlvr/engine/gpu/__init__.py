"""The GPU paths: the trainer's packed rows (``packing.py``) and the sampler whose state stays on the device, its
decode step replayed as a CUDA graph (``device_sampler.py``). Plain PyTorch: a CPU engine given ``GpuPaths`` runs
them too, which is how the CPU tests check them. Beside them, rlvr's own decode step (``decode.py``) on Triton kernels
(``triton_kernels.py``) or their plain-torch references (``kernels.py``), which the sampler takes only when
``GpuPaths.decode_step`` asks.

Not here: the CPU kernels (``cpu/``), which path an engine takes (``engine.py``).
"""
