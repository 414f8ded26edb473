"""verifiers 0.4's v1 stack against rlvr (integrations/verifiers_v1.py, integrations/verifiers_v1_harness.py,
server/generate.py): its own
``TrainClient`` sampling from ``rlvr serve``'s generate route (token ids and logprobs equal to the engine's, a refused
request answered with a 4xx naming the field and the next one served), and v1 tasksets (``tests/verifiers_v1_sums.py``
single-turn, ``tests/verifiers_v1_again.py`` multi-turn) played by verifiers' own env and interception server through
rlvr's in-process chat harness (and, where ``uv`` is on the PATH, verifiers' own ``null`` chat program under ``uv``
in its subprocess runtime): the tokens trained are the tokens sampled, user turns are observation, the taskset's
rewards are the reward and reach ``metrics.jsonl``, a reward function that raises is a counted failure.

Needs verifiers 0.4 (and with it openai 2.x), which cannot share a virtual environment with the dev extra's verifiers
0.3: ``tests/integrations/test_verifiers_v1_venv.py`` runs this file in ``.venv-verifiers4``
(``scripts/ensure-venv-verifiers4.sh``)."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import shutil
import socket
import threading
import time

import pytest

verifiers = pytest.importorskip("verifiers", reason="verifiers 0.4: tests/integrations/test_verifiers_v1_venv.py "
                                                     "runs this file in .venv-verifiers4")
if not verifiers.__version__.startswith("0.4"):  # 0.3.x carries an early verifiers.v1 that 0.4 changed throughout
    pytest.skip(f"verifiers {verifiers.__version__} is not 0.4: tests/integrations/test_verifiers_v1_venv.py runs "
                "this file in .venv-verifiers4", allow_module_level=True)
pytest.importorskip("fastapi", reason="the endpoint the episodes sample through: rlvr[server]")

import verifiers.v1 as vf  # noqa: E402

from rlvr import types  # noqa: E402
from rlvr.engine.models.tiny import build_tiny_tokenizer  # noqa: E402
from rlvr.errors import ConfigurationError  # noqa: E402
from rlvr.integrations.verifiers_v1 import VerifiersV1Dataset  # noqa: E402
from rlvr.rl import LoopConfig, train  # noqa: E402
from rlvr.rl.envs import trajectory_datums  # noqa: E402
from verifiers_v1_sums import text_score  # noqa: E402

KEY = "tml-verifiers-v1-test-key-0123"
PARAMS = types.SamplingParams(max_tokens=6, temperature=1.0, seed=0)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def sampler(service):
    return service.create_lora_training_client(base_model="tiny", rank=4, seed=3).save_weights_and_get_sampling_client()


@pytest.fixture(scope="module")
def served(rlvr_home, service):
    """``rlvr serve``'s app (``create_app``, behind KEY) on a loopback port, for the module."""
    import uvicorn

    from rlvr.server import create_app

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app([KEY], service=service), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def engine_logprobs(sampler, prompt: list[int], tokens: list[int]) -> list[float]:
    return sampler.compute_logprobs(types.ModelInput.from_ints(prompt + tokens)).result()[len(prompt):]


# -- verifiers' own TrainClient against rlvr serve ---------------------------------------------------------------------

def test_verifiers_train_client_gets_the_engines_tokens_and_logprobs_from_rlvr_serve(served, service, tokenizer,
                                                                                      tmp_path, monkeypatch):
    from renderers import DefaultRendererConfig
    from verifiers.v1.clients import TrainClient
    from verifiers.v1.dialects.chat import ChatDialect

    tokenizer.save_pretrained(tmp_path)
    monkeypatch.setenv("RLVR_TEST_KEY", KEY)
    config = vf.TrainClientConfig(base_url=f"{served}/v1", api_key_var="RLVR_TEST_KEY",
                                  renderer_model_name=str(tmp_path), renderer=DefaultRendererConfig())
    messages = [{"role": "user", "content": "What is 2+2?"}]

    async def ask(**sampling):
        client = TrainClient(config)
        try:
            return await client.get_response(ChatDialect(), {"model": "tiny", "messages": messages},
                                             vf.SamplingConfig(**sampling))
        finally:
            await client.close()

    response = asyncio.run(ask(max_tokens=8, temperature=1.0, seed=3))
    tokens = response.tokens
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                              add_special_tokens=False)
    assert tokens.prompt_ids == prompt  # the renderer's prompt is the chat template's, and the route echoes it
    engine = service.create_sampling_client(base_model="tiny")
    same = engine.sample(types.ModelInput.from_ints(prompt), 1, types.SamplingParams(
        max_tokens=8, temperature=1.0, seed=3, stop=[tokenizer.eos_token_id])).result().sequences[0]
    assert tokens.completion_ids == same.tokens
    assert max(abs(a - b) for a, b in zip(tokens.completion_logprobs, engine_logprobs(engine, prompt, same.tokens),
                                          strict=True)) < 1e-4
    # a setting rlvr's sampler does not have: a 400 naming it, which verifiers raises as a ProviderError
    with pytest.raises(vf.ProviderError) as refused:
        asyncio.run(ask(max_tokens=8, min_p=0.1))
    assert refused.value.status_code == 400 and "sampling_params.min_p" in str(refused.value)
    assert asyncio.run(ask(max_tokens=4, seed=3)).tokens.completion_ids == same.tokens[:4]  # and the next is served


# -- episodes ---------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_single_turn_episodes_train_the_sampled_tokens_with_the_tasksets_rewards(tokenizer, sampler):
    dataset = VerifiersV1Dataset("verifiers_v1_sums", tokenizer, groups_per_batch=2, group_size=2)
    groups = dataset.rollout(sampler, dataset.get_batch(0), PARAMS, max_turns=1, seed=0, timing={})
    assert [len(g.trajectories) for g in groups] == [2, 2]
    for builder, group in zip(dataset.get_batch(0), groups, strict=True):
        for trajectory in group.trajectories:
            [turn] = trajectory.transitions
            assert trajectory.failure is None and 0 < len(turn.action) == len(turn.logprobs) <= 6
            assert tokenizer.decode(turn.observation).endswith(f"Say {builder.task.data.answer}.<|im_end|>\n"
                                                               "<|im_start|>assistant\n")
            assert max(abs(a - b) for a, b in zip(turn.logprobs, engine_logprobs(sampler, turn.observation,
                                                                                 turn.action), strict=True)) < 1e-4
            reply = tokenizer.decode(turn.action, skip_special_tokens=True).strip()
            said = float(builder.task.data.answer in reply)
            assert turn.metrics == {"reward_fn/scored": pytest.approx(text_score(reply)),
                                    "reward_fn/said_it": said, "metric/reply_chars": len(reply)}
            assert trajectory.reward == pytest.approx(text_score(reply) + 0.5 * said)
    assert len({tuple(t.transitions[0].action) for t in groups[0].trajectories}) > 1  # seeds of their own


@pytest.mark.slow
def test_a_multi_turn_env_plays_its_turns_and_trains_only_sampled_tokens(tokenizer, sampler):
    dataset = VerifiersV1Dataset("verifiers_v1_again", tokenizer, groups_per_batch=1, group_size=2)
    [group] = dataset.rollout(sampler, dataset.get_batch(0), PARAMS, max_turns=8, seed=1, timing={})
    for trajectory in group.trajectories:
        turns = trajectory.transitions
        assert len(turns) == 3 and trajectory.failure is None and trajectory.reward == 1.0
        assert [t.reward for t in turns] == [0.0, 0.0, 1.0]  # the taskset's reward on the last turn
        for turn in turns:  # each turn's observation is exactly the prompt its tokens were sampled after
            assert max(abs(a - b) for a, b in zip(turn.logprobs, engine_logprobs(sampler, turn.observation,
                                                                                 turn.action), strict=True)) < 1e-4
        for before, after in itertools.pairwise(turns):
            assert len(after.observation) > len(before.observation) + len(before.action) - 2
            assert tokenizer.decode(after.observation).endswith("Again.<|im_end|>\n<|im_start|>assistant\n")
        # tiny writes bytes that its chat template tokenises back otherwise, so a turn may start a datum of its own;
        # either way the weighted targets are exactly the sampled tokens and the user's turns are not among them
        weighted, unweighted = [], []
        for datum, mask in trajectory_datums(trajectory, advantage=1.0):
            targets = datum.loss_fn_inputs["target_tokens"].tolist()
            weighted += [t for t, m in zip(targets, mask, strict=True) if m]
            unweighted += [t for t, m in zip(targets, mask, strict=True) if not m]
        assert weighted == [tok for t in turns for tok in t.action]
        assert tokenizer.decode(unweighted).count("Again.") >= 2


def test_a_full_context_is_a_counted_failure_and_any_other_refusal_stops_the_step():
    from types import SimpleNamespace

    from verifiers.v1.trace import Error

    from rlvr.errors import SamplingError
    from rlvr.integrations.verifiers_v1 import episode_trajectory

    def episode(message: str) -> SimpleNamespace:
        trace = SimpleNamespace(agent=SimpleNamespace(trainable=True, name="agent"), branches=[], rewards={},
                                metrics={}, stop_condition=None, reward=0.0,
                                errors=[Error(type="ProviderError", status_code=400, message=message)])
        return SimpleNamespace(traces=[trace], errors=[], task=SimpleNamespace(type="SayTask",
                                                                               data=SimpleNamespace(idx=3)))

    full = episode_trajectory(episode("Error code: 400 - {'error': {'message': 'token_ids: the prompt has 1024 "
                                      "tokens...', 'code': 'context_length_exceeded'}}"))
    assert math.isnan(full.reward) and "context_length_exceeded" in full.failure
    with pytest.raises(SamplingError, match=r"refused a request of SayTask \(task 3\).*sampling_params.min_p"):
        episode_trajectory(episode("sampling_params.min_p=0.1 is not supported"))


# -- the loop ---------------------------------------------------------------------------------------------------------

def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def loop_config(path, **overrides) -> LoopConfig:
    values = dict(base_model="tiny", rank=4, steps=1, group_size=2, max_tokens=6, learning_rate=2e-2,
                  out=str(path / "run"), seed=1)
    return LoopConfig(**{**values, **overrides})


@pytest.mark.slow
def test_a_v1_taskset_trains_through_the_loop_with_each_reward_in_metrics(tmp_path, tokenizer):
    train(loop_config(tmp_path), VerifiersV1Dataset("verifiers_v1_sums", tokenizer, groups_per_batch=2, group_size=2))
    run = tmp_path / "run"
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0]
    for m in metrics:
        records = read_jsonl(run / "rollouts" / f"step-{m['step']:06d}.jsonl")
        rewards = [r["reward"] for r in records]
        assert len(rewards) == 4 and all(r["failure"] is None for r in records)
        assert m["env/all/reward/mean"] == pytest.approx(sum(rewards) / 4)
        assert m["env/all/reward/mean"] == pytest.approx(m["env/all/reward_fn/scored"]
                                                         + 0.5 * m["env/all/reward_fn/said_it"])
        assert "env/all/metric/reply_chars" in m and m["env/all/reward/errors:sum"] == 0
    assert sum(m["train/datums"] for m in metrics) > 0 and all("optim/loss:sum" in m for m in metrics)


@pytest.mark.slow
def test_a_multi_turn_taskset_trains_through_the_loop(tmp_path, tokenizer):
    train(loop_config(tmp_path), VerifiersV1Dataset("verifiers_v1_again", tokenizer, groups_per_batch=1,
                                                             group_size=2))
    [m] = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert m["env/all/reward_fn/answered"] == 1.0 and m["env/all/reward/errors:sum"] == 0


@pytest.mark.slow
def test_a_reward_function_that_raises_is_a_counted_failure_not_a_zero(tmp_path, tokenizer):
    plugged = {"task": {"rewards": {"flaky": {"fn": "verifiers_v1_sums:flaky"}}}}
    dataset = VerifiersV1Dataset("verifiers_v1_sums", tokenizer, groups_per_batch=2, group_size=2,
                                 taskset_args=plugged)
    failing = sum(b.task.data.answer in "abcd" for b in dataset.get_batch(0))
    assert 0 < failing < 2  # batch 0 holds a task of each kind
    train(loop_config(tmp_path), dataset)
    [m] = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    records = read_jsonl(tmp_path / "run" / "rollouts" / "step-000000.jsonl")
    failed = [r for r in records if r["failure"]]
    assert len(failed) == 2 * failing and m["env/all/reward/errors:sum"] == 2 * failing
    assert all("KeyError: 'no grader for this answer'" in r["failure"] and r["advantage"] is None for r in failed)
    assert all(not math.isnan(r["reward"]) for r in records if not r["failure"])
    assert m["by_group/frac_failed"] == failing / 2


# -- through rlvr serve, and what is refused --------------------------------------------------------------------------

def test_episodes_sample_from_a_running_rlvr_serve(served, service, tokenizer):
    dataset = VerifiersV1Dataset("verifiers_v1_sums", tokenizer, groups_per_batch=1, group_size=2, endpoint=served,
                                 api_key=KEY)
    engine = service.create_sampling_client(base_model="tiny")  # the server serves it as model "tiny"
    [group] = dataset.rollout(engine, dataset.get_batch(0), PARAMS, max_turns=1, seed=0, timing={})
    for trajectory in group.trajectories:
        [turn] = trajectory.transitions
        assert trajectory.failure is None
        assert max(abs(a - b) for a, b in zip(turn.logprobs, engine_logprobs(engine, turn.observation, turn.action),
                                              strict=True)) < 1e-4


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not on the PATH "
                    "(tests/integrations/test_verifiers_v1_venv.py puts .venv-verifiers4's on it)")
def test_a_harness_that_is_a_uv_script_runs_in_the_subprocess_runtime(tokenizer, sampler):
    dataset = VerifiersV1Dataset("verifiers_v1_sums", tokenizer, groups_per_batch=1, group_size=2, harness="null")
    assert {h.config.id for h in dataset.env._harnesses.values()} == {"null"}  # verifiers' own chat program, via uv
    [builder] = dataset.get_batch(0)
    [group] = dataset.rollout(sampler, [builder], PARAMS, max_turns=1, seed=0, timing={})
    for trajectory in group.trajectories:
        [turn] = trajectory.transitions
        assert trajectory.failure is None
        assert max(abs(a - b) for a, b in zip(turn.logprobs, engine_logprobs(sampler, turn.observation,
                                                                             turn.action), strict=True)) < 1e-4
        reply = tokenizer.decode(turn.action, skip_special_tokens=True).strip()
        assert trajectory.reward == pytest.approx(text_score(reply) + 0.5 * (builder.task.data.answer in reply))


def test_a_harness_that_needs_uv_is_refused_without_it_naming_the_fix(tokenizer, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    with pytest.raises(ConfigurationError, match=r"harness 'null' runs its program as a PEP 723 script under uv.*"
                                                 r"pip install uv"):
        VerifiersV1Dataset("verifiers_v1_sums", tokenizer, harness="null")


def test_unknown_tasksets_and_half_an_endpoint_are_clear_errors(tokenizer):
    with pytest.raises(ConfigurationError, match="'no_such_taskset'.*did not load"):
        VerifiersV1Dataset("no_such_taskset", tokenizer)
    with pytest.raises(ConfigurationError, match="endpoint= and api_key= go together"):
        VerifiersV1Dataset("verifiers_v1_sums", tokenizer, endpoint="http://127.0.0.1:1")
