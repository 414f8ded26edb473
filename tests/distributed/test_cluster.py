"""Ray as an optional dependency: without it, asking for the Ray backend says what to install (runs without Ray)."""

import sys

import pytest

from rlvr.distributed import import_ray
from rlvr.errors import ConfigurationError
from rlvr.rl import DistributedConfig, LoopConfig, train
from rlvr.tasks import ArithmeticSource


def test_without_ray_the_backend_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now fails, as when it is not installed
    with pytest.raises(ConfigurationError, match=r"pip install 'rlvr\[ray\]'"):
        import_ray()
    config = LoopConfig(base_model="tiny", out=str(tmp_path), distributed=DistributedConfig(backend="ray"))
    with pytest.raises(ConfigurationError, match=r"pip install 'rlvr\[ray\]'"):
        train(config, ArithmeticSource(levels=(1,), num_train=4, num_test=2))
