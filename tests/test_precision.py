"""rlvr.numerics: the one list of precisions and how a run picks one, without torch."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import rlvr
from rlvr.errors import ConfigurationError
from rlvr.numerics import PRECISIONS, base_precision


def test_precision_is_float32_unless_asked_and_names_are_checked(monkeypatch):
    monkeypatch.delenv("RLVR_PRECISION", raising=False)
    assert PRECISIONS == ("float32", "bfloat16")
    assert base_precision() == "float32"
    assert base_precision("bfloat16") == "bfloat16"  # a name only: whether this CPU can is the engine's check
    with pytest.raises(ConfigurationError, match=r"precision='float16': choose one of \['float32', 'bfloat16'\]"):
        base_precision("float16")
    monkeypatch.setenv("RLVR_PRECISION", "bfloat16")
    assert base_precision() == "bfloat16"
    assert base_precision("float32") == "float32"  # an explicit choice wins over the environment
    monkeypatch.setenv("RLVR_PRECISION", "fp8")
    with pytest.raises(ConfigurationError, match="RLVR_PRECISION='fp8'"):
        base_precision()


def test_choosing_a_precision_does_not_load_torch():
    code = ("import sys\nfrom rlvr.numerics import base_precision\nbase_precision('bfloat16')\n"
            "print('torch' in sys.modules)")
    src = str(Path(rlvr.__file__).parents[1])  # the rlvr under test, not whichever one is installed
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": src})
    assert out.stdout.strip() == "False"


def test_a_run_takes_bfloat16_only_for_a_large_model_on_a_cpu_that_multiplies_it():
    from rlvr.numerics import AUTO_BFLOAT16_PARAMS, run_default_precision

    qwen = 493_961_216  # Qwen2.5-0.5B's linear weights (see test_client); SmolLM2-135M has 134.5M
    assert AUTO_BFLOAT16_PARAMS == 300_000_000
    assert run_default_precision(qwen, native_bfloat16=True) == "bfloat16"
    assert run_default_precision(qwen, native_bfloat16=False) == "float32"
    assert run_default_precision(134_479_872, native_bfloat16=True) == "float32"
    assert run_default_precision(AUTO_BFLOAT16_PARAMS, native_bfloat16=True) == "bfloat16"
    assert run_default_precision(None, native_bfloat16=True) == "float32"  # a size nobody could read
