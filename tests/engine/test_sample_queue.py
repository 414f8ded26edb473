"""SampleQueue: requests grouped by the weights they sample from, chunked by rows, futures settled one by one.

Runs on fake weights and a fake decode (``sample_batch`` replaced), so each test sees exactly which requests were
decoded together; the real decode behind the queue is tested in ``test_sampler.py``.
"""

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest

from rlvr.engine.sample.sampler import SampleJob, Sequence_
from rlvr.engine.sample.scores import ScoreRequest
from rlvr.engine.sample_queue import SampleQueue, _chunks


class _Recorder:
    """An executor that only records what was submitted; the test runs ``drain`` itself."""

    def __init__(self):
        self.submitted = []

    def submit(self, fn, *args):
        self.submitted.append(fn)


def _host(name):
    tokenizer = SimpleNamespace(pad_token_id=0, decode=lambda ids, **_: "")
    host = SimpleNamespace(name=name, base=SimpleNamespace(tokenizer=tokenizer))
    host.active = lambda adapter: contextlib.nullcontext((name, adapter))  # the "model": which weights are active
    return host


def _job(first_token, num_samples):
    return SampleJob([first_token, 7], num_samples, None, None)


class _Decoded(list):
    """Each fake decode's (weights, [(first prompt token, samples) ...]); ``decode``: the fake decode itself."""


@pytest.fixture
def decoded():
    """Each fake decode's (weights, [(first prompt token, samples) ...]); a sample's tokens are [prompt[0], i]."""
    batches = _Decoded()

    def fake_sample_batch(model, jobs, decode, pad_id):
        if model == ("boom", None):
            raise RuntimeError("decode failed")
        batches.append((model, [(job.prompt[0], job.num_samples) for job in jobs]))
        return [[Sequence_([job.prompt[0], i], [-0.5, -0.25], "length") for i in range(job.num_samples)]
                for job in jobs]

    batches.decode = fake_sample_batch
    return batches


def test_chunks_hold_at_most_max_rows_and_keep_order():
    requests = [SimpleNamespace(job=SimpleNamespace(num_samples=n)) for n in (3, 2, 4, 10, 1, 1)]
    # 3 + 2 = 5 fits; 4 alone (5 + 4 > 5); 10 is bigger than 5 and runs alone; 1 + 1 fit together.
    assert [[r.job.num_samples for r in chunk] for chunk in _chunks(requests, 5)] == [[3, 2], [4], [10], [1, 1]]


def test_requests_decode_together_by_weights_in_bounded_chunks(decoded):
    executor = _Recorder()
    queue = SampleQueue(executor, lambda model, tokens, pad_id: np.array([np.nan, -1.0]), max_rows=4,
                        sample_batch=decoded.decode)
    a, b = _host("a"), _host("b")
    on = {"a0": SimpleNamespace(host=a, adapter=None), "a1": SimpleNamespace(host=a, adapter="sampler_1"),
          "b0": SimpleNamespace(host=b, adapter=None)}
    order = [("a0", 1, 2), ("b0", 2, 1), ("a0", 3, 2), ("a1", 4, 3), ("a0", 5, 1), ("a0", 6, 3)]
    futures = [queue.submit(on[weights], _job(token, n), ScoreRequest(prompt_logprobs=token == 3))
               for weights, token, n in order]
    assert executor.submitted == [queue.drain] * len(order)  # each request wakes the engine thread
    queue.drain()
    # Grouped by (host, adapter) in order of first arrival, each group cut into runs of at most 4 samples.
    assert decoded == [(("a", None), [(1, 2), (3, 2)]), (("a", None), [(5, 1), (6, 3)]),
                       (("b", None), [(2, 1)]), (("a", "sampler_1"), [(4, 3)])]
    for (_, token, n), future in zip(order, futures, strict=True):
        response = future.result(timeout=0)
        assert [list(s.tokens) for s in response.sequences] == [[token, i] for i in range(n)]
        assert all(list(s.logprobs) == [-0.5, -0.25] and s.stop_reason == "length" for s in response.sequences)
        assert len({s.sequence_id for s in response.sequences}) == n
        assert (response.prompt_logprobs is None) == (token != 3)  # only the request that asked gets them
    queue.drain()  # nothing left: a later wake-up decodes nothing
    assert len(decoded) == 4


def test_a_failed_decode_fails_its_own_chunk_only(decoded):
    queue = SampleQueue(_Recorder(), lambda *args: None, max_rows=8, sample_batch=decoded.decode)
    bad = queue.submit(SimpleNamespace(host=_host("boom"), adapter=None), _job(1, 2), ScoreRequest())
    good = queue.submit(SimpleNamespace(host=_host("fine"), adapter=None), _job(2, 2), ScoreRequest())
    queue.drain()
    with pytest.raises(RuntimeError, match="decode failed"):
        bad.result(timeout=0)
    assert len(good.result(timeout=0).sequences) == 2


def test_a_unit_decodes_apart_from_requests_that_arrive_with_it(decoded):
    # Same weights throughout: single requests gather as before, but a unit's requests decode as batches of their
    # own (cut by max_rows like any group), so what shares a decode with them never depends on arrival time.
    executor = _Recorder()
    queue = SampleQueue(executor, lambda *args: None, max_rows=4,
                        sample_batch=decoded.decode)
    on = SimpleNamespace(host=_host("a"), adapter=None)
    single = queue.submit(on, _job(1, 1), ScoreRequest())
    unit = queue.submit_unit([(on, _job(t, 2), ScoreRequest()) for t in (2, 3, 4)])
    other = queue.submit_unit([(on, _job(5, 1), ScoreRequest())])
    late = queue.submit(on, _job(6, 1), ScoreRequest())
    assert executor.submitted == [queue.drain] * 4
    queue.drain()
    assert decoded == [(("a", None), [(1, 1), (6, 1)]), (("a", None), [(2, 2), (3, 2)]), (("a", None), [(4, 2)]),
                       (("a", None), [(5, 1)])]
    assert [len(f.result(timeout=0).sequences) for f in (single, *unit, *other, late)] == [1, 2, 2, 2, 1, 1]


def _settled(future):
    try:
        future.result(timeout=0)
    except TimeoutError:
        return False
    return True


class _Clock:
    """Stands in for the queue's ``time``: a sleep moves the clock on and calls ``on_sleep`` (new arrivals)."""

    def __init__(self, on_sleep):
        self.now = 0.0
        self.sleeps = 0
        self.on_sleep = on_sleep

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds
        self.sleeps += 1
        assert self.sleeps < 100, "drain never stopped gathering"
        self.on_sleep(self.sleeps)


@pytest.mark.parametrize(("arrivals", "sleeps", "first_batch"), [
    (0, 1, 1),  # nothing else comes: one quiet window, then the decode
    (5, 6, 6),  # one arrives in each of five windows: all six decode together after the first quiet window
    (50, 11, 12),  # they never stop: gathering ends at the deadline, ten windows on; the rest make the next batch
])
def test_drain_waits_until_a_window_passes_with_no_new_request_or_ten_windows(decoded, monkeypatch, arrivals,
                                                                             sleeps, first_batch):
    from rlvr.engine import sample_queue

    queue = SampleQueue(_Recorder(), lambda *args: None, max_rows=1000, sample_batch=decoded.decode)
    on = SimpleNamespace(host=_host("a"), adapter=None)
    futures = [queue.submit(on, _job(0, 1), ScoreRequest())]

    def arrive(sleep):
        if sleep <= arrivals:
            futures.append(queue.submit(on, _job(sleep, 1), ScoreRequest()))

    clock = _Clock(arrive)
    monkeypatch.setattr(sample_queue, "time", clock)
    monkeypatch.setattr(sample_queue, "SAMPLE_GATHER_S", 1.0)  # whole seconds: the deadline's sum is exact
    queue.drain()
    assert clock.sleeps == sleeps
    assert decoded[0] == (("a", None), [(t, 1) for t in range(first_batch)])
    assert all(map(_settled, futures[:first_batch])) and not any(map(_settled, futures[first_batch:]))
    clock.on_sleep = lambda sleep: None
    queue.drain()
    assert all(map(_settled, futures))


def test_drain_does_not_wait_when_only_units_are_queued(decoded, monkeypatch):
    from rlvr.engine import sample_queue

    queue = SampleQueue(_Recorder(), lambda *args: None, max_rows=8, sample_batch=decoded.decode)
    on = SimpleNamespace(host=_host("a"), adapter=None)
    unit = queue.submit_unit([(on, _job(t, 2), ScoreRequest()) for t in (1, 2)])
    clock = _Clock(lambda sleep: None)
    monkeypatch.setattr(sample_queue, "time", clock)
    queue.drain()
    assert clock.sleeps == 0 and all(map(_settled, unit))
