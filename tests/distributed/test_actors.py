"""The model-holding actors, built in this process (no Ray): their engines multiply in the run's precision."""

import shutil

import pytest

from rlvr.distributed.actors import SamplerActor, TrainerActor
from rlvr.engine.packed import bfloat16_supported
from rlvr.errors import ConfigurationError


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_actors_build_their_engines_in_the_runs_precision(precision):
    if precision == "bfloat16" and not bfloat16_supported():
        with pytest.raises(ConfigurationError, match="bfloat16"):
            TrainerActor(1, precision)
        return
    trainer, sampler = TrainerActor(1, precision), SamplerActor(0, 1, precision)
    try:
        assert trainer._service.engine.precision == precision
        assert sampler._engine.precision == precision
    finally:
        shutil.rmtree(sampler._dir, ignore_errors=True)
