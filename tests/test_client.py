"""ServiceClient's constructor: the shared engine in a chosen precision, an engine of one's own, Tinker's
connection settings ignored; and the LoRA alpha the client exports is the one adapters are built with."""

import pytest

import rlvr
from rlvr import client
from rlvr.engine import Engine
from rlvr.errors import ConfigurationError


def test_precision_picks_the_shared_engine_and_is_checked_against_it():
    shared = Engine.default()
    assert rlvr.ServiceClient().engine is shared
    assert rlvr.ServiceClient(precision=shared.precision).engine is shared
    other = "bfloat16" if shared.precision == "float32" else "float32"
    with pytest.raises(ConfigurationError, match=f"precision='{other}'"):  # one engine per process: no silent switch
        rlvr.ServiceClient(precision=other)
    with pytest.raises(ConfigurationError, match=r"precision='fp16': choose one of"):
        rlvr.ServiceClient(precision="fp16")


def test_an_engine_of_ones_own_is_kept_and_must_agree_with_precision():
    own = Engine(precision="float32")
    assert rlvr.ServiceClient(own).engine is own
    assert rlvr.ServiceClient(engine=own, precision="float32").engine is own
    with pytest.raises(ConfigurationError, match=r"precision='bfloat16'\): that engine multiplies in float32"):
        rlvr.ServiceClient(engine=own, precision="bfloat16")


def test_tinkers_connection_settings_are_ignored():
    service = rlvr.ServiceClient(api_key="tml-unused", base_url="http://localhost:1")
    assert service.engine is Engine.default()


def test_the_exported_lora_alpha_is_the_adapters(service):
    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=0)
    trainer = tc._trainer
    assert trainer.host.peft_config(trainer.adapter).lora_alpha == client.LORA_ALPHA == 32
