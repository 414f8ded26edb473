"""The synchronous loop on tiny with a synthetic task: learning, exact resume, crash safety, stale samplers."""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from rlvr import types
from rlvr.engine.cpu.packed import bfloat16_supported
from rlvr.errors import ConfigurationError, SamplingError
from rlvr.fileio import read_jsonl
from rlvr.rl import LoopConfig, check_sampler_fresh, check_vllm_arithmetic, train
from rlvr.rl.checkpoints import last_checkpoint
from rlvr.rl.config import DistributedConfig
from rlvr.rl.run_record import recorded_precision
from rlvr.tasks.base import Problem, ProblemSource


def fraction_lowercase(prompt, response, meta=None) -> float:
    """Synthetic verifiable reward: the share of lowercase ASCII letters in the answer (about 1 in 10 bytes of
    the random tiny model's output, so groups have signal from the first step)."""
    return sum("a" <= c <= "z" for c in response) / max(len(response), 1)


class SayA(ProblemSource):
    """Problems whose best answer is lowercase letters: learnable by a random tiny model within a few steps."""

    name = "say-a"

    def __init__(self) -> None:
        super().__init__(reward=fraction_lowercase)

    def splits(self):
        return ("train", "test")

    def load(self, split):
        return [Problem(id=f"say-a/{split}/{i}", question=f"Say a, {i}.", answer="a") for i in range(16)]


def config(tmp_path, **overrides):
    values = dict(base_model="tiny", rank=8, steps=6, problems_per_step=2, group_size=4, max_tokens=6,
                  learning_rate=2e-2, eval_problems=4, reward_timeout=5.0, out=str(tmp_path / "run"), seed=1)
    values.update(overrides)
    return LoopConfig(**values)


def metrics_of(tmp_path):
    return read_jsonl(tmp_path / "run" / "metrics.jsonl")


LINE_BREAKERS = "\u2028\u2029\x85\x1c\x1d\x1e\x0b\x0c"  # str.splitlines() splits on each; JSONL must not


class SayAWithLineBreaks(SayA):
    """SayA whose questions hold every character str.splitlines() breaks on: they reach the rollout records (the
    prompt text), as a model's answers with such characters do."""

    def load(self, split):
        return [Problem(id=f"say-a/{split}/{i}", question=f"Say a{LINE_BREAKERS}{i}.", answer="a") for i in range(16)]


def test_reward_rises(tmp_path):
    result = train(config(tmp_path, steps=10), SayA())
    assert result["plot"].read_bytes()[:4] == b"\x89PNG"
    rewards = [m["env/all/reward/mean"] for m in metrics_of(tmp_path)]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.1, rewards
    first = metrics_of(tmp_path)[0]
    assert abs(first["optim/kl_sample_train_v1"]) < 1e-3  # sampler and trainer agree before the first update
    assert first["env/all/reward/errors:sum"] == 0
    for key in ("env/all/correct", "optim/grad_norm", "optim/lr", "by_group/frac_mixed", "time/sample",
                "time/reward", "time/train", "time/total", "tokens_per_s", "optim/entropy"):
        assert key in first, key


@pytest.mark.slow
def test_resume_matches_an_uninterrupted_run(tmp_path):
    straight = train(config(tmp_path / "a", steps=4), SayA())
    train(config(tmp_path / "b", steps=2, save_every=2), SayA())
    resumed = train(config(tmp_path / "b", steps=4, resume=True), SayA())
    a, b = metrics_of(tmp_path / "a"), metrics_of(tmp_path / "b")
    assert [m["step"] for m in b] == [0, 1, 2, 3]
    for key in ("env/all/reward/mean", "optim/loss:sum"):
        assert [m.get(key) for m in a] == pytest.approx([m.get(key) for m in b], rel=1e-6)
    wa, wb = straight["training_client"].parameters(), resumed["training_client"].parameters()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_resume_with_nothing_left_says_so(tmp_path):
    train(config(tmp_path, steps=2), SayA())
    with pytest.raises(ConfigurationError, match="nothing remains to train"):
        train(config(tmp_path, steps=2, resume=True), SayA())
    with pytest.raises(ConfigurationError, match="no checkpoints.jsonl entry"):
        train(config(tmp_path / "empty", resume=True), SayA())


def test_a_torn_checkpoint_line_falls_back_to_the_previous(tmp_path):
    train(config(tmp_path, steps=2, save_every=1), SayA())
    run = tmp_path / "run"
    with open(run / "checkpoints.jsonl", "a") as handle:
        handle.write('{"step": 3, "state_pa')  # a write killed midway
    assert last_checkpoint(run)["step"] == 2


@pytest.mark.slow
def test_sigkill_during_checkpoint_write_resumes_from_the_previous(tmp_path):
    # A child process trains with save_every=1 and is SIGKILLed inside its second checkpoint's state write.
    script = f"""
import os, signal, sys
sys.path.insert(0, {str(os.path.dirname(__file__))!r})
from test_loop import SayA, config
from pathlib import Path
import rlvr.engine.checkpoint as ckpt
writes = 0
original = ckpt.write
def dying_write(path, files):
    global writes
    writes += 1
    if writes == 2:
        files = dict(files)
        import torch
        real = torch.save
        def save_then_die(obj, f, *a, **k):
            real(obj, f, *a, **k)
            os.kill(os.getpid(), signal.SIGKILL)
        torch.save = save_then_die
    return original(path, files)
ckpt.write = dying_write
from rlvr.rl.loop import train
train(config(Path({str(tmp_path)!r}), steps=3, save_every=1), SayA())
"""
    env = {**os.environ}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    run = tmp_path / "run"
    assert last_checkpoint(run)["step"] == 1  # the second checkpoint never completed
    resumed = train(config(tmp_path, steps=3, resume=True), SayA())
    assert resumed["after"]["test/reward/scored:sum"] == 4


def test_a_run_with_no_precision_set_takes_its_models_default_and_a_resume_keeps_the_recorded_one(tmp_path,
                                                                                                 monkeypatch):
    from rlvr import numerics as precision
    from rlvr.engine import Engine
    from rlvr.engine.cpu import packed
    from rlvr.rl.config import save_config
    from rlvr.rl.phases import _precision

    monkeypatch.delenv("RLVR_PRECISION", raising=False)
    monkeypatch.setenv("RLVR_DEVICE", "cpu")
    monkeypatch.setattr(packed, "native_bfloat16", lambda: True)
    monkeypatch.setattr(Engine, "_default", None)  # as in a fresh process: no engine to follow yet
    assert _precision(config(tmp_path), tmp_path / "run") == "float32"  # tiny is small
    monkeypatch.setattr(precision, "AUTO_BFLOAT16_PARAMS", 0)  # every model counts as large
    assert _precision(config(tmp_path), tmp_path / "run") == "bfloat16"
    assert _precision(config(tmp_path, precision="float32"), tmp_path / "run") == "float32"
    (tmp_path / "run").mkdir()
    save_config(config(tmp_path, precision="float32"), tmp_path / "run" / "config.yaml")
    assert _precision(config(tmp_path, resume=True), tmp_path / "run") == "float32"  # what the run recorded


def test_a_run_records_its_precision_and_a_resume_keeps_it(tmp_path):
    from rlvr.engine import Engine

    train(config(tmp_path / "a", steps=1), SayA())
    assert recorded_precision(tmp_path / "a" / "run") == Engine.default().precision  # resolved, not None
    if not bfloat16_supported():
        pytest.skip("no oneDNN bfloat16 matmul on this CPU")
    # In a fresh process: a run in bfloat16 (its frozen linears packed so), then its resume with precision unset.
    script = f"""
import sys
sys.path.insert(0, {os.path.dirname(__file__)!r})
from pathlib import Path
from test_loop import SayA, config
from rlvr.engine import Engine
from rlvr.engine.cpu.packed import model_kind
from rlvr.rl.loop import train
out = Path({str(tmp_path / "b")!r})
first = train(config(out, steps=1, save_every=1, precision="bfloat16"), SayA())
train(config(out, steps=2, resume=True), SayA())  # precision unset: the run's own, not float32
print("@@", Engine.default().precision, model_kind(Engine.default().host("tiny").model))
"""
    env = {k: v for k, v in os.environ.items() if k != "RLVR_PRECISION"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "@@ bfloat16 bf16" in done.stdout
    assert recorded_precision(tmp_path / "b" / "run") == "bfloat16"
    assert [m["step"] for m in metrics_of(tmp_path / "b")] == [0, 1]
    # This process's engine is float32: resuming the bfloat16 run here is refused, whichever way it is asked.
    with pytest.raises(ConfigurationError, match="trained with precision=bfloat16; resuming it with precision="
                                                 "float32"):
        train(config(tmp_path / "b", steps=3, resume=True, precision="float32"), SayA())
    with pytest.raises(ConfigurationError, match="already multiplies in float32"):
        train(config(tmp_path / "b", steps=3, resume=True), SayA())


def test_vllm_samplers_that_would_fail_the_freshness_probe_are_refused(tmp_path):
    """The probe tells stale weights from fresh ones only when sampler and trainer compute alike: a bfloat16 trainer
    beside float32 vLLM differs by ~0.1 per token (measured on smollm2), so at the default tolerance every publication
    would be reported stale. Such runs stop before Ray starts, naming both sides and the way out."""
    vllm = DistributedConfig(backend="ray", sampler="vllm")
    with pytest.raises(ConfigurationError, match="dtype=float32 while this run's trainer uses precision=bfloat16"):
        train(config(tmp_path, precision="bfloat16", distributed=vllm), SayA())
    half = DistributedConfig(backend="ray", sampler="vllm", vllm_options={"dtype": "bfloat16"})
    with pytest.raises(ConfigurationError, match="dtype=bfloat16 while this run's trainer uses precision=float32"):
        train(config(tmp_path, precision="float32", distributed=half), SayA())
    # Alike (float32 both sides, however vLLM's dtype is spelled), or a tolerance raised on purpose: allowed.
    for options in ({}, {"dtype": "float32"}, {"dtype": "float"}, {"dtype": "torch.float32"}):
        alike = DistributedConfig(backend="ray", sampler="vllm", vllm_options=options)
        assert check_vllm_arithmetic(config(tmp_path, distributed=alike), "float32") is None
    assert check_vllm_arithmetic(config(tmp_path, distributed=vllm, sampler_tolerance=0.2), "bfloat16") is None
    assert check_vllm_arithmetic(config(tmp_path, distributed=half, sampler_tolerance=2.0), "float32") is None


def test_a_stale_sampler_is_detected(service):
    training_client = service.create_lora_training_client(base_model="tiny", rank=4, seed=0)
    old = training_client.save_weights_and_get_sampling_client()
    probe = [5, 6, 7, 8, 9, 10]
    assert check_sampler_fresh(training_client, old, probe, 1e-3) < 1e-3
    datum = types.Datum(model_input=types.ModelInput.from_ints(probe[:-1]),
                        loss_fn_inputs={"target_tokens": probe[1:], "weights": [1.0] * 5})
    training_client.forward_backward([datum], "cross_entropy")
    training_client.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    with pytest.raises(SamplingError, match="does not use the current weights"):
        check_sampler_fresh(training_client, old, probe, 1e-3)


def test_kl_penalty_runs_and_reports_kl_to_the_base(tmp_path):
    train(config(tmp_path, steps=3, kl_penalty_coef=0.1), SayA())
    kls = [m["kl_policy_base"] for m in metrics_of(tmp_path) if "kl_policy_base" in m]
    assert len(kls) >= 2
    assert abs(kls[0]) < 1e-3  # before any update the policy is the base model
    assert kls[-1] != pytest.approx(0.0, abs=1e-4)  # after updates it has moved


class Graded(SayA):
    """SayA with difficulties 1, 2 and 3 (ids ending in the difficulty), for the curriculum."""

    def load(self, split):
        return [Problem(id=f"graded/{split}/{i}-d{1 + i % 3}", question=f"Say a, {i}.", answer="a",
                        difficulty=float(1 + i % 3)) for i in range(12)]


def test_curriculum_stages_pick_problems_by_difficulty(tmp_path):
    train(config(tmp_path, steps=3, curriculum={0: 1, 2: 2}, eval_problems=2), Graded())
    seen = {}
    for step in range(3):
        path = tmp_path / "run" / "rollouts" / f"step-{step:06d}.jsonl"
        seen[step] = {int(json.loads(line)["problem_id"][-1]) for line in path.read_text().splitlines()}
    assert seen[0] == seen[1] == {1} and seen[2] <= {1, 2} and 2 in seen[2]   # problems_per_step=2 of 4 and 8
    assert [m["curriculum/max_difficulty"] for m in metrics_of(tmp_path)] == [1.0, 1.0, 2.0]


def test_a_curriculum_stage_without_problems_is_refused(tmp_path):
    with pytest.raises(ConfigurationError, match=r"difficulty <= 0.5.*\[1.0, 2.0, 3.0\]"):
        train(config(tmp_path, curriculum={0: 0.5}), Graded())
    with pytest.raises(ConfigurationError, match="first 0"):
        config(tmp_path, curriculum={3: 1})


@pytest.mark.slow
def test_entropy_bonus_raises_the_policys_entropy(tmp_path):
    # Same seed and task; a strong bonus (entropy_coef 1) ends with a more spread-out policy than no bonus
    # (optim/entropy: the sampled per-token entropy estimate), and a negative weight is refused.
    ends = []
    for coef in (0.0, 1.0):
        train(config(tmp_path / str(coef), steps=6, entropy_coef=coef, out=str(tmp_path / str(coef) / "run")),
              SayA())
        lines = (tmp_path / str(coef) / "run" / "metrics.jsonl").read_text().splitlines()
        entropies = [json.loads(line)["optim/entropy"] for line in lines if "optim/entropy" in json.loads(line)]
        ends.append(sum(entropies[-2:]) / 2)
    assert ends[1] > ends[0] + 0.1, ends
    with pytest.raises(ConfigurationError, match="entropy_coef=-0.1: must be >= 0"):
        config(tmp_path, entropy_coef=-0.1)


@pytest.mark.slow
def test_streamed_minibatches_give_the_synchronous_update(tmp_path):
    # Two parts of one step, each trained as soon as it is scored, one optim_step after both: the gradient is the
    # sum over the same datums, so the weights and the rewards equal the synchronous run's (to summation order).
    # With num_substeps=2 each part gets its own optim_step: a different update (guards the equality above).
    runs = {}
    for name, extra in {"sync": {}, "stream": {"stream_minibatches": 2},
                        "stream-2-substeps": {"stream_minibatches": 2, "num_substeps": 2}}.items():
        result = train(config(tmp_path / name, steps=3, out=str(tmp_path / name / "run")), SayA()) if not extra \
            else train(config(tmp_path / name, steps=3, out=str(tmp_path / name / "run"), **extra), SayA())
        runs[name] = (metrics_of(tmp_path / name), result["training_client"].parameters())
    (sync, w_sync), (stream, w_stream), (two, w_two) = runs["sync"], runs["stream"], runs["stream-2-substeps"]
    assert [m["optim/steps"] for m in sync] == [m["optim/steps"] for m in stream] == [1, 1, 1]
    assert [m["optim/steps"] for m in two] == [2, 2, 2]  # one after each streamed part, not one per split of it
    assert [m["env/all/reward/mean"] for m in stream] == pytest.approx([m["env/all/reward/mean"] for m in sync])
    for key in w_sync:
        torch.testing.assert_close(w_stream[key], w_sync[key], atol=2e-5, rtol=1e-4)  # Adam: lr 2e-2 x rounding
    assert any((w_two[k] - w_sync[k]).abs().max() > 1e-4 for k in w_sync)


@pytest.mark.slow
def test_off_policy_batches_sample_with_older_weights(tmp_path):
    # max_steps_off_policy=1: step s trains on a batch sampled with the weights of step s-1 (step 0: its own). The
    # sampler/trainer KL shows it: ~0 at step 0 and in every synchronous step, clearly not 0 once a batch is one
    # update old. The reward still rises (seed 2 at this learning rate: 0.07 -> 1.0; seed 1 rises only 0.07).
    train(config(tmp_path / "async", steps=12, max_steps_off_policy=1, learning_rate=1e-2, seed=2,
                 out=str(tmp_path / "async" / "run")), SayA())
    train(config(tmp_path / "sync", steps=3, out=str(tmp_path / "sync" / "run")), SayA())
    stale, fresh = metrics_of(tmp_path / "async"), metrics_of(tmp_path / "sync")
    assert [m["async/steps_off_policy"] for m in stale] == [0] + [1] * 11
    assert all(abs(m["optim/kl_sample_train_v1"]) < 1e-3 for m in fresh)
    assert abs(stale[0]["optim/kl_sample_train_v1"]) < 1e-3
    assert all(abs(m["optim/kl_sample_train_v1"]) > 5e-3 for m in stale[1:3]), [m["optim/kl_sample_train_v1"]
                                                                                 for m in stale]
    rewards = [m["env/all/reward/mean"] for m in stale]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.3, rewards


def test_text_with_line_separators_does_not_end_a_run(tmp_path):
    train(config(tmp_path, steps=2), SayAWithLineBreaks())
    records = read_jsonl(tmp_path / "run" / "rollouts" / "step-000001.jsonl")
    assert len(records) == 8 and all(LINE_BREAKERS in r["prompt"] for r in records)
    assert [m["step"] for m in metrics_of(tmp_path)] == [0, 1]


def test_failing_auxiliary_outputs_are_counted_and_training_goes_on(tmp_path, monkeypatch):
    import rlvr.rl.loop as loop
    from rlvr.rl.rollout_log import RolloutLog

    def broken(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(RolloutLog, "write", broken)
    monkeypatch.setattr(loop, "plot_run", broken)
    result = train(config(tmp_path, steps=2), SayA())
    assert [m["aux/failures"] for m in metrics_of(tmp_path)] == [1, 2]  # the rollout page of each step
    assert result["plot"] is None and result["after"]["test/reward/scored:sum"] == 4
    assert last_checkpoint(tmp_path / "run")["step"] == 2


@pytest.mark.slow
def test_step_metrics_cover_every_minibatch(tmp_path):
    # Streamed in two parts with one optim_step after both, a step trains on the same datums with the same weights
    # as the synchronous step: its loss (a sum) must be the whole step's, not the last part's. With two substeps,
    # the grad norm is reported per optimizer step as a mean and a max.
    extra = {"loss_fn": "cispo", "problems_per_step": 4}  # cispo: a loss far from 0; two groups per part
    train(config(tmp_path / "sync", steps=2, out=str(tmp_path / "sync" / "run"), **extra), SayA())
    train(config(tmp_path / "stream", steps=2, out=str(tmp_path / "stream" / "run"), stream_minibatches=2, **extra),
          SayA())
    sync, stream = metrics_of(tmp_path / "sync"), metrics_of(tmp_path / "stream")
    assert all(abs(m["optim/loss:sum"]) > 1e-3 for m in sync)
    for key in ("optim/loss:sum", "optim/clip_fraction:mean", "train/datums"):
        assert [m[key] for m in stream] == pytest.approx([m[key] for m in sync], rel=1e-4, abs=1e-6), key
    train(config(tmp_path / "two", steps=2, out=str(tmp_path / "two" / "run"), num_substeps=2, **extra), SayA())
    two = metrics_of(tmp_path / "two")
    assert all(m["optim/steps"] == 2 and m["optim/grad_norm:max"] >= m["optim/grad_norm"] > 0 for m in two)


def fails_on_problem_1(prompt, response, meta=None) -> float:
    """fraction_lowercase, except that it raises on every answer to problem 1 and on answers of odd length."""
    if prompt.endswith(" 1.") or len(response) % 2:
        raise ValueError("cannot score this answer")
    return fraction_lowercase(prompt, response)


class SayAFailing(SayA):
    def __init__(self) -> None:
        ProblemSource.__init__(self, reward=fails_on_problem_1)


def test_a_failed_reward_stays_visible_and_is_never_scored_zero(tmp_path):
    from rlvr.rewards import RewardRunner
    from rlvr.rl.problems import SourceDataset
    from rlvr.rl.rollouts import Rollouts

    source = SayAFailing()
    result = train(config(tmp_path, steps=2), source)
    metrics = metrics_of(tmp_path)
    assert any(m["env/all/reward/errors:sum"] > 0 for m in metrics)
    assert all((m["env/all/reward/errors:sum"] > 0) == (m["by_group/frac_failed"] > 0) for m in metrics), metrics
    records = read_jsonl(tmp_path / "run" / "rollouts" / "step-000000.jsonl")
    failed = [r for r in records if r["failure"]]
    assert failed and all(r["reward"] is None and r["advantage"] is None for r in failed)
    # The trajectories the loop trains from carry NaN for a failed reward, not 0.
    client = result["training_client"]
    sampler = client.save_weights_and_get_sampling_client()
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=3)
    with RewardRunner(source.reward(), timeout=5.0) as runner:
        loop_config = config(tmp_path, problems_per_step=16)
        rollouts = Rollouts(SourceDataset(source, loop_config), client.get_tokenizer(), loop_config, runner)
        rollout = rollouts.collect(rollouts.start(0, sampler, params)[0])
        rollouts.close()
    rewards = [t.reward for group in rollout.trajectories for t in group]
    scores = [r for group in rollout.rewards for r in group]
    assert any(s is None for s in scores)
    assert all((r != r) if s is None else r == s for r, s in zip(rewards, scores, strict=True))
