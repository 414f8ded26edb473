"""A short RL loop on CUDA, through the client API, on a random Qwen3-shaped model: its reward rises on a task it
can learn (``rl_task``: answer with the letter "a"), in bfloat16 (the CUDA default).

Run on a machine with an NVIDIA GPU: ``pytest tests/gpu -m gpu``."""

import pytest
import rl_task
import torch

import rlvr
from rlvr.engine import Engine
from rlvr.engine.models.random_models import small_config, write_model_folder

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_reward_rises_on_a_learnable_task(tmp_path):
    # Four layers of width 128, Qwen3's blocks (q/k norms, tied head); on the CPU this loop goes from 0.0 to 1.0 in
    # about four steps.
    config = small_config("qwen3", hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                          num_attention_heads=8, num_key_value_heads=4, head_dim=16)
    folder = write_model_folder(config, tmp_path / "qwen3", seed=0)
    rewards = rl_task.run(rlvr.ServiceClient(Engine(device="cuda")), str(folder), steps=12)
    assert rewards[0] < 0.1, rewards
    assert sum(rewards[-3:]) / 3 > 0.6, rewards
