"""``rlvr.engine.engine``: one worker thread running every request in submission order; sampling requests gathered
into batches by weights and row budget; sampler snapshots that stay frozen and are freed when released; the
forward pass's logprobs against the model's own softmax; bad requests failing alone, leaving gradients as they were.

Driven on the Engine directly (the client layer is ``tests/test_client.py``), on the ``tiny`` model.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from datums import ce_datum, rl_datum
from rlvr import types
from rlvr.engine.cpu import packed
from rlvr.engine.engine import UNUSED_SNAPSHOTS, Engine
from rlvr.engine.models.lora import LoraSpec
from rlvr.engine.sample_queue import _chunks
from rlvr.engine.train.prefix import plan
from rlvr.errors import CheckpointError, ConfigurationError, InvalidDatumError, ModelLoadError, SamplingError

ADAM = types.AdamParams(learning_rate=5e-2)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine()


def new_trainer(engine: Engine, seed: int = 0, rank: int = 4):
    return engine.run(engine.create_trainer, "tiny", LoraSpec(rank=rank), seed)


@contextlib.contextmanager
def held(engine: Engine) -> Iterator[None]:
    """Occupy the engine thread for the duration, so that what is submitted meanwhile queues up behind it."""
    gate, started = threading.Event(), threading.Event()

    def wait() -> None:
        started.set()
        gate.wait(60)

    engine.submit(wait)
    assert started.wait(60)
    try:
        yield
    finally:
        gate.set()


def forward(engine: Engine, trainer, data, loss: str = "cross_entropy", backward: bool = False):
    return engine.run(engine.forward, trainer, data, loss, None, backward)


def train_step(engine: Engine, trainer, datum) -> None:
    forward(engine, trainer, [datum], backward=True)
    engine.run(engine.optim_step, trainer, ADAM)


def logprobs_of(out: types.ForwardBackwardOutput, i: int = 0) -> list[float]:
    return out.loss_fn_outputs[i]["logprobs"].tolist()


# -- one thread, submission order -------------------------------------------------------------------------------------


def test_jobs_run_one_at_a_time_in_submission_order_on_one_engine_thread(engine):
    seen: list[tuple[int, str]] = []
    running = [0, 0]  # now, most at once

    def job(i: int) -> int:
        running[0] += 1
        running[1] = max(running)
        seen.append((i, threading.current_thread().name))
        time.sleep(0.002 if i % 2 else 0)  # uneven work: were jobs run in parallel, they would finish out of order
        running[0] -= 1
        return i

    with held(engine):
        futures = [engine.submit(job, i) for i in range(12)]
    assert [f.result(timeout=30) for f in futures] == list(range(12))
    assert [i for i, _ in seen] == list(range(12))
    threads = {name for _, name in seen}
    assert len(threads) == 1 and threads.pop().startswith("rlvr-engine")
    assert running[1] == 1
    assert engine.run(threading.current_thread) is not threading.current_thread()


def test_a_step_submitted_before_its_gradient_is_awaited_applies_that_gradient(engine):
    trainer = new_trainer(engine, seed=1)
    datum = ce_datum([5, 6, 7, 8, 9, 10])
    with held(engine):  # all four are queued before any of them runs
        before = engine.submit(engine.forward, trainer, [datum], "cross_entropy", None, False)
        gradient = engine.submit(engine.forward, trainer, [datum], "cross_entropy", None, True)
        step = engine.submit(engine.optim_step, trainer, ADAM)
        after = engine.submit(engine.forward, trainer, [datum], "cross_entropy", None, False)
    loss_before = before.result().metrics["loss:sum"]
    assert gradient.result().metrics["loss:sum"] == loss_before  # same weights: ran before the step
    assert step.result().metrics["grad_norm:mean"] > 0  # the step saw the gradient (else: "no gradients")
    assert after.result().metrics["loss:sum"] < loss_before  # and the forward after it saw the step
    assert trainer.step == 1


def test_run_returns_the_result_and_raises_the_jobs_error(engine):
    assert engine.run(lambda a, b=0: a + b, 2, b=3) == 5
    with pytest.raises(ZeroDivisionError):
        engine.run(lambda: 1 / 0)
    assert engine.run(lambda: "still serving") == "still serving"


# -- forward / backward -----------------------------------------------------------------------------------------------


def test_forward_logprobs_are_the_models_log_softmax_at_each_target(engine):
    trainer = new_trainer(engine, seed=2)
    train_step(engine, trainer, ce_datum([3, 1, 4, 1, 5, 9, 2, 6]))  # a non-zero adapter
    tokens = [2, 7, 1, 8, 2, 8, 1, 8]
    weights = [1.0, 0.0, 2.0, 0.5, 1.0, 0.0, 3.0]
    out = forward(engine, trainer, [ce_datum(tokens, weights)])
    got = torch.tensor(logprobs_of(out))

    def by_hand():
        with trainer.host.active(trainer.adapter) as model, torch.no_grad():
            logits = model(input_ids=torch.tensor([tokens[:-1]])).logits[0].double()  # (T, V)
        return torch.log_softmax(logits, -1)[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])]

    want = engine.run(by_hand)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
    # cross_entropy's loss:sum is -sum_t w_t * logprob_t.
    assert out.metrics["loss:sum"] == pytest.approx(-(torch.tensor(weights).double() * want).sum().item(), rel=1e-5)


def test_forward_without_backward_accumulates_no_gradient(engine):
    trainer = new_trainer(engine, seed=3)
    forward(engine, trainer, [ce_datum([1, 2, 3, 4])])
    assert all(p.grad is None for p in trainer.host.parameters(trainer.adapter).values())
    with pytest.raises(ConfigurationError, match="no gradients accumulated"):
        engine.run(engine.optim_step, trainer, ADAM)


def test_a_call_failing_in_a_later_microbatch_leaves_the_gradients_as_they_were():
    # Budget 6 tokens: the short good datum is its own first microbatch (and is backpropagated) before the long
    # one, whose sampling logprob of -1000 makes exp(logprob - sampling_logprob) overflow to inf.
    engine = Engine(max_tokens_per_microbatch=6)
    trainer = new_trainer(engine, seed=4)
    forward(engine, trainer, [ce_datum([7, 8, 9])], backward=True)  # a gradient already pending
    params = trainer.host.parameters(trainer.adapter)
    pending = {k: p.grad.clone() for k, p in params.items()}
    good = rl_datum([1, 2], [3], [-1.0], 1.0)
    bad = rl_datum([1, 2, 3, 4, 5, 6], [7, 8], [-1000.0, -1000.0], 1.0)
    batches = plan([d.model_input.to_ints() for d in (good, bad)], 6)
    assert [[tuple(c.rows) for c in b] for b in batches] == [[(0,)], [(1,)]]  # good first, alone; then bad
    with pytest.raises(InvalidDatumError, match="loss_fn='importance_sampling' gave a non-finite loss"):
        forward(engine, trainer, [good, bad], "importance_sampling", backward=True)
    assert all(torch.equal(params[k].grad, pending[k]) for k in params)


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (lambda lps: lps[0].sum(), "must return \\(loss: torch.Tensor scalar, metrics: dict\\)"),
        (lambda lps: (lps[0], {}), "must return a finite scalar, got shape \\(3,\\)"),
        (lambda lps: (lps[0].sum() * float("inf"), {}), "must return a finite scalar"),
    ],
    ids=["not_a_tuple", "not_a_scalar", "not_finite"],
)
def test_a_bad_custom_loss_is_refused_before_any_gradient(engine, result, message):
    trainer = new_trainer(engine, seed=5)
    with pytest.raises(InvalidDatumError, match=message):
        engine.run(engine.forward_backward_custom, trainer, [ce_datum([1, 2, 3, 4])], lambda data, lps: result(lps))
    assert all(p.grad is None for p in trainer.host.parameters(trainer.adapter).values())


def test_state_loaded_onto_a_trainer_of_another_lora_shape_is_refused(engine):
    saved = new_trainer(engine, seed=6, rank=4)
    train_step(engine, saved, ce_datum([1, 2, 3]))
    path = engine.run(engine.save_state, saved, "rank4").path
    other = new_trainer(engine, seed=6, rank=8)
    with pytest.raises(CheckpointError, match="has LoRA .*'rank': 4.* this client .*'rank': 8.*"
                                              "create_training_client_from_state"):
        engine.run(engine.load_state, other, path, True)


def test_step_count_resumes_with_the_optimizer_and_restarts_without(engine):
    trainer = new_trainer(engine, seed=7)
    for _ in range(3):
        train_step(engine, trainer, ce_datum([4, 5, 6]))
    path = engine.run(engine.save_state, trainer, "three").path
    assert engine.run(engine.trainer_from_state, path, True).step == 3
    fresh = engine.run(engine.trainer_from_state, path, False)
    assert fresh.step == 0 and fresh.seed == trainer.seed and fresh.spec == trainer.spec
    for key, value in trainer.host.parameters(trainer.adapter).items():
        assert torch.equal(fresh.host.parameters(fresh.adapter)[key.replace(trainer.adapter, fresh.adapter)], value)


# -- sampling: batches ------------------------------------------------------------------------------------------------


def pending(*sizes: int) -> list:
    return [SimpleNamespace(job=SimpleNamespace(num_samples=n)) for n in sizes]


@pytest.mark.parametrize(
    ("sizes", "max_rows", "expected"),
    [
        ((1, 2, 1, 5, 1), 4, [[1, 2, 1], [5], [1]]),  # 5 > 4 runs alone; the runs around it keep their order
        ((2, 2, 2), 4, [[2, 2], [2]]),
        ((4, 4), 4, [[4], [4]]),
        ((5, 1), 4, [[5], [1]]),
        ((1, 1, 1, 1, 1), 2, [[1, 1], [1, 1], [1]]),
        ((3,), 128, [[3]]),
    ],
)
def test_chunks_are_consecutive_runs_of_at_most_max_rows_and_a_bigger_request_alone(sizes, max_rows, expected):
    requests = pending(*sizes)
    chunks = _chunks(requests, max_rows)
    assert [[r.job.num_samples for r in chunk] for chunk in chunks] == expected
    assert [r for chunk in chunks for r in chunk] == requests  # the same objects, in submission order


def test_waiting_requests_decode_in_batches_by_weights_and_row_budget(monkeypatch):
    engine = Engine(max_sample_rows=4)
    trainer = new_trainer(engine, seed=8)
    base = engine.run(engine.sampler, None, "tiny")
    snapshot = engine.run(engine.sampler, engine.run(engine.save_for_sampler, trainer, None), None)
    batches: list[list[tuple[str | None, int]]] = []
    run_chunk = engine._samples._run_chunk

    def spy(requests):
        batches.append([(r.handle.adapter, r.job.num_samples) for r in requests])
        assert threading.current_thread().name.startswith("rlvr-engine")
        return run_chunk(requests)

    monkeypatch.setattr(engine._samples, "_run_chunk", spy)
    params = types.SamplingParams(max_tokens=2, seed=0)
    prompt = types.ModelInput.from_ints([1, 2, 3])
    asked = [(base, 1), (snapshot, 2), (base, 2), (base, 1), (base, 5), (snapshot, 1), (base, 1)]
    with held(engine):
        futures = [engine.submit_sample(h, prompt, n, params) for h, n in asked]
        bad = engine.submit_sample(base, prompt, 0, params)  # fails on its own, joins no batch
    for (_, n), future in zip(asked, futures, strict=True):
        assert len(future.result(timeout=60).sequences) == n
    with pytest.raises(SamplingError, match="num_samples must be a positive integer, got 0"):
        bad.result()
    s = snapshot.adapter
    assert batches == [[(None, 1), (None, 2), (None, 1)], [(None, 5)], [(None, 1)], [(s, 2), (s, 1)]]


@pytest.mark.parametrize(
    ("prompt", "num_samples", "params", "error", "message"),
    [
        ([1, 2], 1.5, types.SamplingParams(max_tokens=2), SamplingError, "num_samples must be a positive integer"),
        ([1, 2], -1, types.SamplingParams(max_tokens=2), SamplingError, "num_samples must be a positive integer"),
        ([1, 2], 1, {"max_tokens": 2}, SamplingError, "sampling_params must be a tinker SamplingParams, got dict"),
        ([], 1, types.SamplingParams(max_tokens=2), SamplingError, "prompt is empty"),
        ([1, 10**6], 1, types.SamplingParams(max_tokens=2), InvalidDatumError, "token id 1000000 outside"),
    ],
    ids=["fractional_count", "negative_count", "params_dict", "empty_prompt", "token_outside_vocab"],
)
def test_a_bad_sampling_request_fails_on_its_future_with_a_named_error(engine, prompt, num_samples, params, error,
                                                                      message):
    handle = engine.run(engine.sampler, None, "tiny")
    future = engine.submit_sample(handle, types.ModelInput.from_ints(prompt), num_samples, params)
    with pytest.raises(error, match=message):
        future.result(timeout=30)


@pytest.mark.parametrize("base_model", ["", None])
def test_a_base_model_that_is_not_a_name_is_refused_as_such(engine, base_model):
    with pytest.raises(ModelLoadError, match="base_model must be a non-empty string"):
        engine.host(base_model)


def test_a_sampler_needs_saved_weights_or_a_base_model(engine):
    with pytest.raises(SamplingError, match="needs model_path .* or base_model"):
        engine.run(engine.sampler, None, None)


# -- sampling: snapshots ----------------------------------------------------------------------------------------------


def test_a_snapshot_has_the_trainers_logprobs_and_keeps_them_while_training_goes_on(engine):
    trainer = new_trainer(engine, seed=9)
    datum = ce_datum([11, 12, 13, 14, 15, 16])
    train_step(engine, trainer, datum)
    handle = engine.run(engine.sampler, engine.run(engine.save_for_sampler, trainer, None), None)
    prompt = types.ModelInput.from_ints([11, 12, 13, 14, 15, 16])
    frozen = engine.run(engine.compute_logprobs, handle, prompt)
    assert frozen[0] is None and frozen[1:] == logprobs_of(forward(engine, trainer, [datum]))  # to the bit
    params = types.SamplingParams(max_tokens=6, seed=3, stop=[])
    drawn = engine.submit_sample(handle, prompt, 2, params).result(timeout=30)

    for _ in range(2):
        train_step(engine, trainer, datum)
    assert logprobs_of(forward(engine, trainer, [datum])) != frozen[1:]  # the trainer moved on...
    assert engine.run(engine.compute_logprobs, handle, prompt) == frozen  # ...its snapshot did not
    again = engine.submit_sample(handle, prompt, 2, params).result(timeout=30)
    assert [s.tokens for s in again.sequences] == [s.tokens for s in drawn.sequences]


def test_a_released_snapshot_is_dropped_only_when_its_last_user_lets_go(engine):
    trainer = new_trainer(engine, seed=10)
    train_step(engine, trainer, ce_datum([1, 2, 3, 4]))
    path = engine.run(engine.save_for_sampler, trainer, None)
    first, second = engine.run(engine.sampler, path, None), engine.run(engine.sampler, path, None)
    prompt = types.ModelInput.from_ints([5, 6, 7])
    want = engine.run(engine.compute_logprobs, first, prompt)
    engine.run(engine.release_sampler, path)
    assert path in engine._snapshots  # still held by the second user...
    train_step(engine, trainer, ce_datum([1, 2, 3, 4]))
    engine.run(engine.save_for_sampler, trainer, None)  # ...so a new snapshot may not reuse its adapter
    assert engine.run(engine.compute_logprobs, second, prompt) == want
    engine.run(engine.release_sampler, path)
    host = trainer.host
    assert path not in engine._snapshots
    assert second.adapter in host._retired or second.adapter not in host.specs
    engine.run(engine.release_sampler, path)  # releasing again, or an unknown path, does nothing
    engine.run(engine.release_sampler, "rlvr://nobody/sampler_weights/nothing")
    with pytest.raises(CheckpointError, match="no checkpoint at"):  # in memory only: gone for good
        engine.run(engine.sampler, path, None)


def test_unused_snapshots_saved_to_disk_stay_in_memory_only_as_many_as_kept_and_reload_to_the_same_logprobs(engine):
    """A trainer saved for sampling again and again (a server's save_weights_for_sampler, with no client made from
    most) keeps only the ``UNUSED_SNAPSHOTS`` newest unused ones in memory; a client made later from an older path
    reads it from disk and gets the logprobs that path was saved with."""
    trainer = new_trainer(engine, seed=11)
    datum, prompt = ce_datum([3, 4, 5, 6]), types.ModelInput.from_ints([3, 4, 5, 6])
    paths, want = [], []
    for i in range(UNUSED_SNAPSHOTS + 2):
        train_step(engine, trainer, datum)
        paths.append(engine.run(engine.save_for_sampler, trainer, f"unused-{i}"))
        want.append(logprobs_of(forward(engine, trainer, [datum])))
    in_memory = [p for p in paths if p in engine._snapshots]
    assert in_memory == paths[-UNUSED_SNAPSHOTS:]
    for path, logprobs in zip(paths, want, strict=True):
        handle = engine.run(engine.sampler, path, None)
        assert engine.run(engine.compute_logprobs, handle, prompt)[1:] == logprobs  # to the bit, from disk too
        engine.run(engine.release_sampler, path)


def test_a_garbage_collected_clients_release_takes_no_lock_and_runs_before_the_next_job(engine):
    """A SamplingClient's finalizer may run inside any ``ThreadPoolExecutor.submit`` on its thread (a garbage
    collection there; transformers loads weights through one), which holds ``concurrent.futures``' module-wide lock:
    a release that submitted to the engine's executor waited on that lock forever (the suite hung that way)."""
    import concurrent.futures.thread as pool

    trainer = new_trainer(engine, seed=14)
    path = engine.run(engine.save_for_sampler, trainer, None)
    engine.run(engine.sampler, path, None)
    released = threading.Thread(target=engine.release_sampler_later, args=(path,), daemon=True)
    with pool._global_shutdown_lock:  # what a submit in progress on this thread holds
        released.start()
        released.join(timeout=10)
        assert not released.is_alive(), "release_sampler_later waited on concurrent.futures' lock"
    assert path in engine._snapshots  # queued, not run on the caller's thread...
    engine.run(lambda: None)
    assert path not in engine._snapshots  # ...and run before the next job


def test_a_client_dropped_after_submitting_releases_its_snapshot_only_after_that_job(engine, monkeypatch):
    """``create_sampling_client(...).compute_logprobs(...)``: the client is collected while its job waits in the
    queue; its release must wait for that job, which samples the snapshot (here deleted once released, as when the
    host keeps enough retired adapters already)."""
    import gc

    from rlvr.client import SamplingClient
    from rlvr.engine.models import lora

    monkeypatch.setattr(lora, "MAX_RETIRED", 0)  # a released snapshot's adapter is deleted at once
    trainer = new_trainer(engine, seed=15)
    train_step(engine, trainer, ce_datum([4, 5, 6, 7]))
    path = engine.run(engine.save_for_sampler, trainer, None)
    prompt = types.ModelInput.from_ints([4, 5, 6, 7, 8])
    client = SamplingClient(engine, engine.run(engine.sampler, path, None))
    want = engine.run(engine.compute_logprobs, client._handle, prompt)
    gate = threading.Event()
    engine.submit(gate.wait, 30)  # the engine busy: the next job waits in the queue
    got = client.compute_logprobs(prompt)
    del client
    gc.collect()  # the client's finalizer queues its release behind the waiting job
    gate.set()
    assert got.result(timeout=30) == want
    engine.run(lambda: None)
    assert path not in engine._snapshots


def test_a_released_named_snapshot_reloads_from_disk_with_the_same_logprobs(engine):
    trainer = new_trainer(engine, seed=11)
    train_step(engine, trainer, ce_datum([9, 8, 7, 6]))
    path = engine.run(engine.save_for_sampler, trainer, "named")
    prompt = types.ModelInput.from_ints([9, 8, 7, 6, 5])
    want = engine.run(engine.compute_logprobs, engine.run(engine.sampler, path, None), prompt)
    engine.run(engine.release_sampler, path)
    train_step(engine, trainer, ce_datum([9, 8, 7, 6]))  # the trainer moves on; the checkpoint does not
    assert engine.run(engine.compute_logprobs, engine.run(engine.sampler, path, None), prompt) == want


def test_saving_sampler_weights_under_one_name_again_and_again_keeps_adapters_bounded(engine):
    trainer = new_trainer(engine, seed=12)
    datum = ce_datum([2, 4, 6, 8])
    counts, previous = [], None
    for _ in range(4):
        train_step(engine, trainer, datum)
        path = engine.run(engine.save_for_sampler, trainer, "latest")
        handle = engine.run(engine.sampler, path, None)  # the new SamplingClient
        if previous is not None:  # the old one is garbage-collected, releasing the snapshot it held
            engine.run(engine.release_sampler, previous.model_path, previous.adapter)
        previous = handle
        counts.append(len(trainer.host.specs))
    assert counts[-1] == counts[1], counts
    assert previous.adapter in trainer.host.specs  # the snapshot still in use stays


def test_a_snapshot_replaced_under_its_name_stays_while_a_client_samples_it(engine):
    trainer = new_trainer(engine, seed=13)
    prompt = types.ModelInput.from_ints([3, 5, 7, 9])
    old = engine.run(engine.sampler, engine.run(engine.save_for_sampler, trainer, "latest"), None)
    before = engine.run(engine.compute_logprobs, old, prompt)
    train_step(engine, trainer, ce_datum([3, 5, 7, 9]))
    new = engine.run(engine.sampler, engine.run(engine.save_for_sampler, trainer, "latest"), None)
    assert engine.run(engine.compute_logprobs, old, prompt) == before  # the old client still samples old weights
    assert engine.run(engine.compute_logprobs, new, prompt) != before
    adapters = len(trainer.host.specs)
    engine.run(engine.release_sampler, old.model_path, old.adapter)  # retired: the next snapshot reuses it
    engine.run(engine.save_for_sampler, trainer, "other")
    assert len(trainer.host.specs) == adapters
    assert engine.run(engine.compute_logprobs, new, prompt) != before


# -- precision --------------------------------------------------------------------------------------------------------


def test_an_unknown_precision_is_refused():
    with pytest.raises(ConfigurationError, match="precision='float16'"):
        Engine(precision="float16")


def test_a_bfloat16_engine_multiplies_its_base_in_bfloat16(bfloat16_kind):
    engines = {p: Engine(precision=p) for p in ("float32", "bfloat16")}
    assert engines["bfloat16"].precision == "bfloat16"
    assert packed.model_kind(engines["bfloat16"].host("tiny").base.model) == bfloat16_kind
    assert packed.model_kind(engines["float32"].host("tiny").base.model) not in packed.BFLOAT16_KINDS
    datum = ce_datum([1, 2, 3, 4, 5, 6, 7, 8])
    lps = {p: torch.tensor(logprobs_of(forward(e, new_trainer(e, seed=13), [datum]))) for p, e in engines.items()}
    # bfloat16 keeps 8 bits of mantissa: close to float32, but not equal to it.
    assert 0 < (lps["bfloat16"] - lps["float32"]).abs().max() < 0.1
