"""The model-holding actors, built in this process (no Ray): their engines multiply in the run's precision, and a
sampler replica sent no files for an adapter it lacks says so."""

import shutil
import tempfile

import pytest

from rlvr import types
from rlvr.distributed.actors import SamplerActor, TrainerActor
from rlvr.distributed.vllm_sampler import VLLMSampler
from rlvr.engine.cpu.packed import bfloat16_supported
from rlvr.errors import ConfigurationError, SamplingError


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_actors_build_their_engines_in_the_runs_precision(precision):
    if precision == "bfloat16" and not bfloat16_supported():
        with pytest.raises(ConfigurationError, match="bfloat16"):
            TrainerActor(1, precision)
        return
    trainer, sampler = TrainerActor(1, precision), SamplerActor(0, 1, precision)
    assert trainer._service.engine.precision == precision
    assert sampler._engine.precision == precision


@pytest.mark.parametrize(("replica", "name"), [(SamplerActor, "sampler replica 2"),
                                               (VLLMSampler, "vLLM sampler replica 2")])
def test_a_replica_sent_no_files_for_an_adapter_it_lacks_names_itself_and_the_adapter(replica, name):
    sampler = replica(2)  # the vLLM one starts vLLM only once it has an adapter's files
    try:
        for files in (None, {}):
            with pytest.raises(SamplingError, match=f"^{name} was asked for adapter 'rlvr://r/sampler_weights/s', "
                                                    "which it does not hold, and was given no files"):
                sampler.load("rlvr://r/sampler_weights/s", "0" * 64, files)
        assert sampler.held() == {}
    finally:
        shutil.rmtree(getattr(sampler, "_dir", ""), ignore_errors=True)  # the vLLM replica's adapter folders


def test_a_sampler_replica_leaves_no_folder_behind(tmp_path, monkeypatch):
    """The files of a published adapter pass through a temporary folder into the replica's engine, which samples
    from memory after: the folder is gone once the adapter is loaded (Ray may end the actor without a finalizer)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    trainer, sampler = TrainerActor(1), SamplerActor(0)
    model_id = trainer.create_lora_training_client(base_model="tiny", rank=4, seed=0)
    path, files, digest = trainer.publish(model_id, None)
    assert sampler.load(path, digest, files) == digest and sampler.held() == {path: digest}
    assert sampler.sample(path, digest, [None], [72, 105], 2, types.SamplingParams(max_tokens=3, seed=1), False)
    assert list(tmp_path.iterdir()) == []
