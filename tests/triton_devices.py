"""The Triton kernels for the GPU decode step's tests, on each device they can run on here: "cpu" runs them in Triton's
interpreter (``TRITON_INTERPRET=1``, which ``conftest.py`` sets where no GPU is visible, before triton is imported),
"cuda" compiled, marked ``gpu`` (``scripts/gpu-check`` runs those). Skipped, with the reason, where triton is missing
or this process runs the kernels in the other mode."""

from __future__ import annotations

import pytest
import torch

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                                reason="needs a CUDA GPU")])]


def triton_kernels_on(device: str):
    """``kernels.triton_kernels()`` able to run on ``device``, or a skip saying why not."""
    from rlvr.engine.gpu import kernels

    if not kernels.triton_available():
        pytest.skip("triton is not installed (`pip install triton`: the dev extra holds it)")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    found = kernels.triton_kernels()
    from rlvr.engine.gpu import triton_kernels

    if triton_kernels.INTERPRETED != (device == "cpu"):
        pytest.skip(f"this process runs Triton {'interpreted' if triton_kernels.INTERPRETED else 'compiled'}: the "
                    f"{device} tests need TRITON_INTERPRET={int(device == 'cpu')} set before triton is imported")
    return found
