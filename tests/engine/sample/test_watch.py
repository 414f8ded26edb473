"""A watched sampling request (``rlvr.engine.sample.watch``) on the CPU sampler: its tokens are handed out step by
step and are exactly the response's, watching changes nothing sampled, and cancelling ends its rows at once without
touching the requests batched beside it."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError

import pytest

from rlvr import types
from rlvr.engine.sample.watch import Watch

PROMPT = types.ModelInput.from_ints([10, 11, 12, 13])
LONG = types.SamplingParams(max_tokens=40, stop=[], seed=5)  # no stop at all: only max_tokens or a cancel ends it


@pytest.fixture(scope="module")
def sampler(service):
    return service.create_sampling_client(base_model="tiny")


def _collect() -> tuple[Watch, list[list[tuple[int, int, float]]]]:
    steps: list[list[tuple[int, int, float]]] = []
    return Watch(steps.append), steps


def test_tokens_are_handed_out_one_step_at_a_time_and_are_the_responses(sampler, monkeypatch):
    from rlvr.engine.sample import sampler as cpu_sampler

    draws, drawn_at = [], []  # the sampler's draws so far, and how many there had been at each hand-out
    real_choose = cpu_sampler._choose
    monkeypatch.setattr(cpu_sampler, "_choose", lambda *args: draws.append(1) or real_choose(*args))
    steps: list = []
    watch = Watch(lambda drawn: (steps.append(drawn), drawn_at.append(len(draws))))
    params = types.SamplingParams(max_tokens=12, seed=3, temperature=0.8)
    response = sampler.sample_watched(watch, PROMPT, 3, params).result()
    assert drawn_at == list(range(1, len(steps) + 1))  # each step handed out before the next is drawn
    plain = sampler.sample(PROMPT, 3, params).result()
    assert [s.tokens for s in response.sequences] == [s.tokens for s in plain.sequences]  # watching changes nothing
    assert [s.logprobs for s in response.sequences] == [s.logprobs for s in plain.sequences]
    for step in steps:  # one token per live sample per step, samples in order
        assert [j for j, _, _ in step] == sorted({j for j, _, _ in step})
    for j, seq in enumerate(response.sequences):
        handed = [(t, lp) for step in steps for k, t, lp in step if k == j]
        assert handed == list(zip(seq.tokens, seq.logprobs, strict=True))
    assert len(steps) == max(len(s.tokens) for s in response.sequences)


def test_cancelling_ends_the_rows_at_the_next_step_and_spares_the_neighbours(sampler):
    def cancel_after_two(drawn):
        steps.append(drawn)
        if len(steps) == 2:
            watch.cancel()

    steps: list = []
    watch = Watch(cancel_after_two)
    alone = sampler.sample(PROMPT, 2, LONG.model_copy(update={"seed": 6})).result()
    futures = [sampler.sample_watched(watch, PROMPT, 2, LONG), sampler.sample(PROMPT, 2, LONG.model_copy(
        update={"seed": 6}))]  # back to back: one batch
    cut, neighbour = (f.result() for f in futures)
    assert [len(s.tokens) for s in cut.sequences] == [2, 2] and len(steps) == 2
    assert {s.stop_reason for s in cut.sequences} == {"length"}
    assert [s.tokens for s in neighbour.sequences] == [s.tokens for s in alone.sequences]
    assert [len(s.tokens) for s in neighbour.sequences] == [40, 40]


def test_a_request_cancelled_while_it_waits_is_not_decoded(sampler, monkeypatch):
    from rlvr.engine.sample import sampler as cpu_sampler

    running, release, draws = threading.Event(), threading.Event(), []
    real_choose = cpu_sampler._choose
    monkeypatch.setattr(cpu_sampler, "_choose", lambda *args: draws.append(1) or real_choose(*args))

    def busy() -> None:
        running.set()
        release.wait(30)

    blocker = sampler.engine.submit(busy)  # the engine thread is held: the request waits in the queue
    assert running.wait(30)
    watch, steps = _collect()
    future = sampler.sample_watched(watch, PROMPT, 2, LONG)
    watch.cancel()
    release.set()
    blocker.result()
    after = sampler.sample(PROMPT, 1, types.SamplingParams(max_tokens=3, stop=[], seed=1)).result()  # it moves on
    with pytest.raises(CancelledError):
        future.result()
    assert not steps and len(after.sequences[0].tokens) == 3 and len(draws) == 3  # the next request's draws only


def test_a_callback_that_raises_cancels_its_own_request_only(sampler):
    def broken(drawn):
        raise RuntimeError("the watcher's own bug")

    watch = Watch(broken)
    futures = [sampler.sample_watched(watch, PROMPT, 1, LONG), sampler.sample(PROMPT, 1, LONG)]
    cut, neighbour = (f.result() for f in futures)
    assert watch.cancelled and len(cut.sequences[0].tokens) == 1
    assert len(neighbour.sequences[0].tokens) == 40
