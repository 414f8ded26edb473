"""Protocol details: seq_id ordering (refused requests included), training-run and checkpoint listing through the
SDK's RestClient, sessions."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import pytest
import tinker
from tinker import types
from tinker.proto import tinker_public_pb2 as pb
from tinker.proto.request_conv import forward_backward_request_to_proto

from rlvr.server.state import SeqIdRefused, Sequencer, done


def test_server_sequencer_runs_jobs_in_seq_id_order():
    pool = ThreadPoolExecutor(4)
    ran: list[int] = []
    seq = Sequencer(pool, first_seq=1, gap_timeout_s=0.3)

    def job(n: int):
        return lambda: (ran.append(n), done(n))[1]

    futures = {}
    for n in (3, 1, 2):  # arrive out of order
        _, futures[n] = seq.submit(n, f"r{n}", job(n))
    assert [futures[n].result(timeout=5) for n in (1, 2, 3)] == [1, 2, 3]
    assert ran == [1, 2, 3]
    assert seq.submit(2, "again", job(2)) == ("r2", None)  # a retried request gets its first future's id

    # A failing job fails alone; a seq_id that never arrives is skipped after the gap timeout.
    _, bad = seq.submit(4, "r4", lambda: (_ for _ in ()).throw(ValueError("boom")))
    with pytest.raises(ValueError, match="boom"):
        bad.result(timeout=5)
    started = time.monotonic()
    _, late = seq.submit(6, "r6", job(6))
    assert late.result(timeout=5) == 6 and time.monotonic() - started >= 0.25
    pool.shutdown()


def test_server_sequencer_gives_each_gap_its_full_timeout():
    """A gap that closes in time must not leave its timer to cut a later gap short (seq_ids run out of order)."""
    pool = ThreadPoolExecutor(4)
    seq = Sequencer(pool, first_seq=1, gap_timeout_s=0.6)

    def job(n: int):
        return lambda: done(n)

    _, second = seq.submit(2, "r2", job(2))  # waits for 1: a timer starts
    time.sleep(0.3)
    _, first = seq.submit(1, "r1", job(1))  # the gap closes in time
    assert first.result(timeout=5) == 1 and second.result(timeout=5) == 2
    started = time.monotonic()
    _, fourth = seq.submit(4, "r4", job(4))  # a new gap, at 3
    assert fourth.result(timeout=5) == 4
    assert time.monotonic() - started >= 0.55  # the first gap's timer would have fired ~0.3 s in
    pool.shutdown()


def test_server_sequencer_waits_for_slow_jobs():
    pool = ThreadPoolExecutor(4)
    seq = Sequencer(pool, first_seq=1)
    gate: Future = Future()
    order: list[str] = []
    _, first = seq.submit(1, "a", lambda: (order.append("a"), gate)[1])
    _, second = seq.submit(2, "b", lambda: (order.append("b"), done("b"))[1])
    time.sleep(0.1)
    assert order == ["a"] and not second.done()
    threading.Timer(0.05, gate.set_result, ["a"]).start()
    assert second.result(timeout=5) == "b" and first.result() == "a" and order == ["a", "b"]
    time.sleep(0.1)  # let the sequencer release its turn before the pool goes away
    pool.shutdown()


def test_server_lists_and_deletes_checkpoints(sdk, server):
    tc = sdk.create_lora_training_client(base_model="tiny", rank=2, seed=3).result()
    state_path = tc.save_state("s1").result().path
    sampler_path = tc.save_weights_for_sampler("w1").result().path
    run_id = state_path.split("/")[2]
    rest = tinker.RestClient(base_url=server.base_url, api_key=server.api_key)
    run = rest.get_training_run(run_id).result()
    assert run.training_run_id == run_id and run.base_model == "tiny" and run.lora_rank == 2
    ids = {c.checkpoint_id for c in rest.list_checkpoints(run_id).result().checkpoints}
    assert ids == {"weights/s1", "sampler_weights/w1"}
    assert run_id in {r.training_run_id for r in rest.list_training_runs(limit=1000).result().training_runs}
    assert sampler_path in {c.tinker_path for c in rest.list_user_checkpoints(limit=1000).result().checkpoints}
    rest.delete_checkpoint(run_id, "sampler_weights/w1").result()
    ids = {c.checkpoint_id for c in rest.list_checkpoints(run_id).result().checkpoints}
    assert ids == {"weights/s1"}
    with pytest.raises(Exception):  # noqa: B017 - the SDK raises its NotFoundError wrapped by its future
        rest.delete_checkpoint(run_id, "sampler_weights/w1").result()


def test_server_finished_session_is_gone(server):
    client = tinker.ServiceClient(base_url=server.base_url, api_key=server.api_key)
    tc = client.create_lora_training_client(base_model="tiny", rank=2, seed=9).result()
    model_id = tc.model_id
    session_id = model_id.split(":")[0]
    client.close("success").result()
    with httpx.Client(base_url=server.base_url + "/api/v1", headers={"X-API-Key": server.api_key}) as http:
        assert http.post("/session_heartbeat", json={"session_id": session_id}).status_code == 410
        assert http.post("/get_info", json={"model_id": model_id}).status_code == 404
        sample = {"sampling_session_id": f"{session_id}:sample:0", "seq_id": 0, "num_samples": 1,
                  "prompt": types.ModelInput.from_ints([1, 2]).model_dump(mode="json"),
                  "sampling_params": {"max_tokens": 2}}
        assert http.post("/asample", json=sample).status_code == 404


def test_a_silent_session_expires_and_frees_its_models_adapter(service):
    """A session with no heartbeat and no request for ``session_timeout_s`` (its client went away unclosed) is
    finished as expired at the next heartbeat or new session of anyone: its models and samplers are gone (410 for the
    session, unknown ids for the rest) and the training adapter behind its model leaves the engine. A request counts
    as a sign of life, as a heartbeat does; a live session is left alone, and None never expires anything."""
    import gc

    from rlvr.server.state import Gone, ServerState, UnknownId

    state = ServerState(service, session_timeout_s=60)
    silent, alive, busy = (state.create_session("alice", None) for _ in range(3))
    model = state.add_model(silent, 0, "tiny", None)
    state.bind(model, service.create_lora_training_client("tiny", rank=2, seed=1))
    host, adapter = model.client._trainer.host, model.client._trainer.adapter
    state.add_sampler(silent, 0, object(), "tiny", None)
    busy_model = state.add_model(busy, 0, "tiny", None)
    for session in (silent, busy):
        session.last_heartbeat -= 61
    state.model(busy_model.model_id, "alice")  # a request in the busy session: it lives on
    state.heartbeat(alive.session_id, "alice")
    assert silent.finished == "expired" and "60 s" in silent.finished_detail
    assert busy.finished is None and alive.finished is None
    with pytest.raises(Gone):
        state.heartbeat(silent.session_id, "alice")
    with pytest.raises(UnknownId):
        state.model(model.model_id, "alice")
    with pytest.raises(UnknownId):
        state.sampler(f"{silent.session_id}:sample:0", "alice")
    del model
    gc.collect()
    service.engine.run(lambda: None)  # the release is queued on the engine thread; let it run
    assert adapter not in host.specs
    never = ServerState(service, session_timeout_s=None)
    old = never.create_session("bob", None)
    old.last_heartbeat -= 10**6
    assert never.expire_silent_sessions() == [] and old.finished is None
    state.close()
    never.close()


# -- refused requests free their seq_id -----------------------------------------------------------------------------

DATUM = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3, 4]),
                    loss_fn_inputs={"target_tokens": types.TensorData(data=[2, 3, 4, 5], dtype="int64"),
                                    "weights": types.TensorData(data=[1.0] * 4, dtype="float32")})
PROMPT_S = 3.0
"""Upper bound for a forward on ``tiny`` right after a refused request, sent and fetched over HTTP. It takes ~0.1 s
alone and up to ~1.3 s on a busy 2-core machine; waiting for the refused seq_id would add the server's 10 s gap
timeout."""


def test_server_sequencer_refused_seq_id_counts_as_done():
    """A seq_id whose request was refused before it was queued frees its turn at once, whether the requests behind it
    arrived before the refusal or after; a retry of it is told it was refused; an accepted seq_id stays accepted."""
    pool = ThreadPoolExecutor(4)
    seq = Sequencer(pool, first_seq=1, gap_timeout_s=60.0)  # waiting for the gap timer would time the test out
    ran: list[int] = []

    def job(n: int):
        return lambda: (ran.append(n), done(n))[1]

    _, second = seq.submit(2, "r2", job(2))
    time.sleep(0.1)
    assert not second.done()  # still waiting for 1
    seq.refuse(1, "optim_params type 'dimuon': rlvr takes AdamParams only")
    assert second.result(timeout=2) == 2

    seq.refuse(4, "kind='inflight': rlvr serves snapshot sampling clients only")  # refused before 3 arrives
    _, third = seq.submit(3, "r3", job(3))
    _, fifth = seq.submit(5, "r5", job(5))
    assert third.result(timeout=2) == 3 and fifth.result(timeout=2) == 5
    assert ran == [2, 3, 5]

    with pytest.raises(SeqIdRefused, match=r"seq_id 1 .*AdamParams only"):
        seq.submit(1, "retry", job(1))
    seq.refuse(5, "a second answer for an accepted request")
    assert seq.submit(5, "retry", job(5)) == ("r5", None)

    seq.refuse(9, "refused far ahead")  # a refusal alone waits for nothing and skips nothing
    _, sixth = seq.submit(6, "r6", job(6))
    assert sixth.result(timeout=2) == 6 and ran == [2, 3, 5, 6]
    pool.shutdown()


def test_server_sequencer_late_request_does_not_reopen_its_gap():
    """A request that arrives after its gap was skipped runs at once, and the requests after it do not wait again."""
    pool = ThreadPoolExecutor(4)
    seq = Sequencer(pool, first_seq=1, gap_timeout_s=0.5)

    def job(n: int):
        return lambda: done(n)

    _, second = seq.submit(2, "r2", job(2))  # 1 is late: 2 runs once the gap times out
    assert second.result(timeout=5) == 2
    _, first = seq.submit(1, "r1", job(1))
    assert first.result(timeout=2) == 1
    started = time.monotonic()
    _, third = seq.submit(3, "r3", job(3))
    assert third.result(timeout=5) == 3 and time.monotonic() - started < 0.3
    pool.shutdown()


REFUSED_CALLS = {  # name: (SDK call the server refuses, what its 4xx says)
    "optim_step with Dimuon params on an AdamW model": (
        lambda tc: tc.optim_step(types.DimuonParams(learning_rate=1e-3)),
        r"got types\.DimuonParams, but this training client was created with optimizer=types\.AdamOptimizerConfig"),
    "forward_backward with a text loss_fn_config": (
        lambda tc: tc.forward_backward([DATUM], "ppo", {"mode": "wide"}), "rlvr losses take numbers"),
    "an inflight sampling client": (
        lambda tc: tc.save_weights_and_get_sampling_client(kind="inflight"), "snapshot sampling clients only"),
    "save_weights_external, encrypted": (
        lambda tc: tc.save_weights_external("hf-export", age_encryption_recipients=["age1example"]),
        "save_weights_external: age_encryption_recipients is not supported"),
}


@pytest.mark.parametrize(("refused", "reason"), REFUSED_CALLS.values(), ids=list(REFUSED_CALLS))
def test_server_refused_sdk_call_does_not_stall_the_next(sdk, refused, reason):
    tc = sdk.create_lora_training_client(base_model="tiny", rank=2, seed=11).result()
    before = tc.forward([DATUM], "cross_entropy").result().metrics["loss:sum"]
    with pytest.raises(tinker.APIStatusError, match=reason):
        refused(tc).result()
    started = time.monotonic()
    after = tc.forward([DATUM], "cross_entropy").result().metrics["loss:sum"]
    assert time.monotonic() - started < PROMPT_S
    assert after == pytest.approx(before, rel=1e-6)  # the refused call changed nothing


def test_server_refused_body_on_each_route_frees_its_seq_id(sdk, server):
    """Bodies that fail validation (the seq_id still readable) on every route that takes a seq_id: each frees its
    seq_id at once, and a request that reuses a refused seq_id is told so."""
    model_id = sdk.create_lora_training_client(base_model="tiny", rank=2, seed=12).result().model_id
    headers = {"X-API-Key": server.api_key}

    def forward(seq_id: int) -> bytes:
        request = types.ForwardBackwardRequest(model_id=model_id, seq_id=seq_id, forward_backward_input=(
            types.ForwardBackwardInput(data=[DATUM], loss_fn="cross_entropy")))
        msg = forward_backward_request_to_proto(request)
        msg.forward_only = True
        return msg.SerializeToString()

    empty_forward = pb.ForwardBackwardRequest(model_id=model_id, loss_fn="cross_entropy")  # no datums
    refusals = [
        ("/optim_step", {"optim_params": {"learning_rate": "fast"}}, 400),
        ("/save_weights", {"ttl_seconds": "never"}, 400),
        ("/save_weights_for_sampler", {"kind": "bogus"}, 400),
        ("/load_weights", {"optimizer": True}, 400),  # no path
        ("/save_weights_external", {"path": "hf-export", "ttl_seconds": 0}, 400),
        ("/a_call_from_a_newer_sdk", {"path": "x"}, 404),  # the catch-all frees the seq_id too
        ("/forward_backward", empty_forward, 400),
    ]
    with httpx.Client(base_url=server.base_url + "/api/v1", headers=headers, timeout=30) as http:
        for n, (route, extra, status) in enumerate(refusals):
            seq_id = 2 * n + 1
            if isinstance(extra, dict):
                r = http.post(route, json={"model_id": model_id, "seq_id": seq_id, **extra})
            else:
                extra.seq_id = seq_id
                r = http.post(route, content=extra.SerializeToString())
            assert r.status_code == status, (route, r.text)
            started = time.monotonic()
            r = http.post("/forward_backward", content=forward(seq_id + 1))
            assert r.status_code == 200, r.text
            r = http.post("/retrieve_future", json={"request_id": r.json()["request_id"]})
            assert r.headers["content-type"].startswith("application/x-protobuf"), (route, r.text)
            assert time.monotonic() - started < PROMPT_S, route
        r = http.post("/forward_backward", content=forward(1))
        assert r.status_code == 400, r.text
        assert "seq_id 1" in r.json()["detail"] and "learning_rate" in r.json()["detail"]
