"""The Ray backend under the RL loop: same metrics as in-process, samplers that die mid-request, stale weights.

One in-process run and one Ray run (trainer, 2 samplers, 2 reward workers on ``ray.init(num_cpus=2)``) of the same
seeded loop are shared by the tests (module-scoped: starting actors costs seconds each on 2 cores). In the Ray run
the sampler that step 1's first rollout request goes to is killed as it is sent, and so is the reward worker that
step 2's first chunk of rewards goes to, so its metrics also show that restarts and retries change nothing.
"""

import json
import math

import pytest
import torch

ray = pytest.importorskip("ray")

from rlvr import types  # noqa: E402
from rlvr.distributed.clients import RaySamplingClient, _Publication  # noqa: E402
from rlvr.distributed.cluster import Replicas  # noqa: E402
from rlvr.errors import SamplingError, WorkerLostError  # noqa: E402
from rlvr.rewards import resolve_reward  # noqa: E402
from rlvr.rewards.builtin import LengthPenalty  # noqa: E402
from rlvr.rl import DistributedConfig, LoopConfig, check_sampler_fresh, train  # noqa: E402
from rlvr.tasks import ArithmeticSource  # noqa: E402

pytestmark = pytest.mark.slow  # a Ray cluster and whole runs on it

# Tolerance of the Ray run against the in-process run. Sampling draws the same tokens (each request carries its
# seed), so rewards, counts and advantages are identical. Floating-point values may differ in the last bits: a
# replica batches other requests with a prompt than the single in-process engine does (padding and batch size
# change a logit's last bits, see rlvr.engine.sample.sampler), and the trainer sums gradients in its own process.
# Measured on this test: at most 4.7e-7 relative on values above 1e-3 (losses, grad norms), 9.5e-7 absolute on values
# that are float noise around 0 (sampler/max_logprob_gap, kl_sample_train), and 7.7e-6 on the final LoRA weights (|w| up
# to 0.13: Adam divides each gradient by its own running scale, so last-bit differences in near-zero gradients move
# a weight by a fraction of the learning rate). The tolerances are 20x, 10x and 13x that, and far below any real
# difference: one changed token moves a reward by >= 0.1, a loss by > 1e-2 and a weight by ~ the learning rate.
REL, ABS, WEIGHTS_ABS = 1e-5, 1e-5, 1e-4
NOT_COMPARED = ("time/", "tokens_per_s", "step", "distributed/")


def source() -> ArithmeticSource:
    # math_correct plus a reward for short answers: the random tiny model is never correct, but its answers vary in
    # length, so groups have signal and every step trains.
    reward = resolve_reward("combine", rewards={"math_correct": 1.0,
                                                LengthPenalty(target_length=0, penalty_scale=0.1, unit="chars"): 1.0})
    return ArithmeticSource(levels=(1,), num_train=16, num_test=4, reward=reward,
                            instruction="Answer with only the number.")


def config(out, **overrides) -> LoopConfig:
    """A 3-step loop on tiny; kl_penalty_coef > 0 makes it sample the base model too (a second set of weights)."""
    values = dict(base_model="tiny", rank=8, steps=3, problems_per_step=2, group_size=4, max_tokens=8,
                  learning_rate=2e-2, kl_penalty_coef=0.01, eval_problems=4, reward_timeout=5.0, out=str(out), seed=1)
    values.update(overrides)
    return LoopConfig(**values)


def metrics_of(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


class Chaos:
    """Stands in for ``Replicas.future`` (``original``): once per ``kill[(kind, method)] = step``, it kills the actor
    a request is about to be sent to and waits for its process to end, so the request meets a dead actor. (Killing
    it just after sending races the reply: a reward chunk takes ~5 ms.) ``progress`` is the loop's callback."""

    def __init__(self, original, kill_and_wait, kill: dict[tuple[str, str], int]) -> None:
        self.original, self.kill_and_wait, self.kill = original, kill_and_wait, kill
        self.step = 0
        self.killed: list[tuple[str, int, int]] = []
        """(kind, replica, step) of each kill."""

    def future(self, replicas, index, method, *args):
        if self.kill.get((replicas.kind, method)) == self.step:
            del self.kill[(replicas.kind, method)]
            self.kill_and_wait(replicas.handles[index], replicas.incarnations[index].pid)
            self.killed.append((replicas.kind, index, self.step))
        return self.original(replicas, index, method, *args)

    def progress(self, step, metrics):
        self.step = step + 1


@pytest.fixture(scope="module")
def runs(ray_cluster, kill_and_wait, tmp_path_factory):
    base = tmp_path_factory.mktemp("loop")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each model actor on this 2-core machine; 2 threads here would fight the actors
    try:
        local = train(config(base / "local"), source())
    finally:
        torch.set_num_threads(threads)

    chaos = Chaos(Replicas.future, kill_and_wait, {("sampler", "sample"): 1, ("reward", "score"): 2})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Replicas, "future", lambda replicas, *args: chaos.future(replicas, *args))
        distributed = train(config(base / "ray", distributed=DistributedConfig(backend="ray", num_samplers=2,
                                                                               num_reward_workers=2)),
                            source(), progress=chaos.progress)
    return {"local": local, "ray": distributed, "local_metrics": metrics_of(base / "local"),
            "ray_metrics": metrics_of(base / "ray"), "killed": chaos.killed}


def test_a_seeded_ray_run_matches_the_in_process_run(runs):
    local, remote = runs["local_metrics"], runs["ray_metrics"]
    assert [m["step"] for m in remote] == [0, 1, 2]
    assert all(m["train/datums"] > 0 for m in local), "every step must train for the comparison to mean much"
    mismatches = []
    for a, b in zip(local, remote, strict=True):
        keys = {k for k in a if not k.startswith(NOT_COMPARED)}
        assert keys == {k for k in b if not k.startswith(NOT_COMPARED)}
        for key in sorted(keys):
            same = (math.isnan(b[key]) if isinstance(a[key], float) and math.isnan(a[key])
                    else b[key] == pytest.approx(a[key], rel=REL, abs=ABS))
            if not same:
                mismatches.append((a["step"], key, a[key], b[key]))
    assert not mismatches
    for when in ("before", "after"):
        assert runs["ray"][when] == pytest.approx(runs["local"][when], rel=REL, abs=ABS)
    wa, wb = runs["local"]["training_client"].parameters(), runs["ray"]["training_client"].parameters()
    assert wa.keys() == wb.keys()
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < WEIGHTS_ABS


def test_actors_killed_mid_step_are_restarted_retried_and_counted_in_the_metrics(runs):
    assert [(kind, step) for kind, _, step in runs["killed"]] == [("sampler", 1), ("reward", 2)]
    by_step = runs["ray_metrics"]
    assert by_step[0]["distributed/sampler_restarts"] == 0 and by_step[0]["distributed/reward_restarts"] == 0
    # Step 1 completed although the sampler its first rollout request was sent to had died.
    assert by_step[1]["distributed/sampler_restarts"] == 1
    assert by_step[1]["distributed/sampler_retries"] >= 1
    # Step 2 completed although a reward worker its rewards were sent to had died.
    assert by_step[2]["distributed/reward_restarts"] == 1
    assert by_step[2]["distributed/reward_retries"] >= 1
    assert by_step[2]["distributed/sampler_restarts"] == 1  # counters are cumulative


def request(tokenizer, i, max_tokens=8):
    """Prompt and seeded sampling parameters of request ``i``."""
    return (types.ModelInput.from_ints(tokenizer.encode(f"What is {i} + {i}?")),
            types.SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=100 + i))


def test_sampler_killed_mid_request_completes_the_requests(runs):
    training_client = runs["ray"]["training_client"]
    service = training_client.service
    tokenizer = training_client.get_tokenizer()
    sampler = training_client.save_weights_and_get_sampling_client()
    requests = [request(tokenizer, i, max_tokens=48) for i in range(8)]
    expected = [sampler.sample(prompt, 4, params).result() for prompt, params in requests]
    before = service.distributed_metrics()["distributed/sampler_restarts"]
    old_pid = service.samplers.incarnations[1].pid

    futures = [sampler.sample(prompt, 4, params) for prompt, params in requests]  # round-robin over 2 replicas
    ray.kill(service.samplers.handles[1], no_restart=False)  # its requests are queued there or running
    got = [f.result() for f in futures]

    assert [[s.tokens for s in r.sequences] for r in got] == [[s.tokens for s in r.sequences] for r in expected]
    assert service.distributed_metrics()["distributed/sampler_restarts"] == before + 1
    assert service.samplers.incarnations[1].pid != old_pid
    # The restarted replica reloaded the newest adapter before serving, verified by its hash.
    assert ray.get(service.samplers.handles[1].held.remote())[sampler.model_path] == sampler.digest


def test_a_sampler_behind_the_trainer_is_caught(runs):
    training_client = runs["ray"]["training_client"]
    tokenizer = training_client.get_tokenizer()
    old = training_client.save_weights_and_get_sampling_client()
    probe = tokenizer.encode("What is 1 + 2?")
    check_sampler_fresh(training_client, old, probe, 1e-3)  # fresh: passes

    tokens = tokenizer.encode("What is 1 + 2? 3")
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    training_client.forward_backward([datum], "cross_entropy").result()
    training_client.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    with pytest.raises(SamplingError, match="does not use the current weights"):
        check_sampler_fresh(training_client, old, probe, 1e-3)  # the loop's probe notices unpublished weights

    new = training_client.save_weights_and_get_sampling_client()
    assert new.digest != old.digest
    check_sampler_fresh(training_client, new, probe, 1e-3)
    service = training_client.service
    stale = old._publication
    # A replica given the old files but told the new hash refuses them, naming both hashes.
    with pytest.raises(SamplingError, match=f"trainer published {new.digest[:12]}"):
        service.publish(f"{stale.key}-again", new.digest, stale.files_ref)
    # A request expecting the new weights under a name a replica holds in the old version is refused too.
    mixed = RaySamplingClient(service, _Publication(stale.key, new.digest, stale.files_ref), "tiny")
    prompt, params = request(tokenizer, 1)
    with pytest.raises(SamplingError, match="stale weights"):
        mixed.sample(prompt, 1, params).result()


def test_a_dead_trainer_is_a_worker_lost_error_that_says_to_resume(runs):
    # Last in this module: it ends the shared run's trainer.
    training_client = runs["ray"]["training_client"]
    tokens = training_client.get_tokenizer().encode("What is 1 + 2? 3")
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    ray.kill(training_client.service.trainer)
    with pytest.raises(WorkerLostError, match=r"resume from the last checkpoint \(resume=True\)"):
        training_client.forward_backward([datum], "cross_entropy").result()


def test_an_env_dataset_trains_through_ray_without_reward_actors(ray_cluster, tmp_path, monkeypatch):
    # the loop's env path on Ray's trainer and sampler: the envs (here a problem source's one-turn envs) play and
    # score in this process, so no reward actor starts; the sampler replica samples the trainer's weights
    import rlvr.distributed.rewards
    from rlvr.engine.models.tiny import build_tiny_tokenizer
    from rlvr.rl.envs import ProblemDataset

    def no_runner(*args, **kwargs):
        raise AssertionError("reward actors started for envs that score themselves")

    monkeypatch.setattr(rlvr.distributed.rewards, "RayRewardRunner", no_runner)
    dataset = ProblemDataset(source(), build_tiny_tokenizer(), problems_per_batch=2, group_size=4)
    train(config(tmp_path / "run", steps=2, kl_penalty_coef=0.0,
                 distributed=DistributedConfig(backend="ray", num_samplers=1, num_reward_workers=2)), dataset)
    rows = metrics_of(tmp_path / "run")
    assert [row["step"] for row in rows] == [0, 1]
    assert all(row["env/all/reward/scored:sum"] == 8 for row in rows)
    trained = [row for row in rows if row["train/datums"] > 0]  # (a step whose groups all tie trains nothing)
    assert trained and all(abs(row["optim/kl_sample_train_v1"]) < 1e-3 for row in trained)  # fresh replica weights
