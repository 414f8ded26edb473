"""The official SDK's ``RestClient``, every public method, against ``rlvr serve``: runs by the model id the SDK hands
out, weights info, publish/unpublish, TTL (listed and enforced), sessions, checkpoint downloads that load back, and
clear, prompt refusals for what a single rlvr server has no meaning for."""

from __future__ import annotations

import inspect
import io
import tarfile
import time
from datetime import UTC, date, datetime

import httpx
import numpy as np
import pytest
import tinker
from safetensors.torch import load_file
from tinker import types

DATUM = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3, 4]),
                    loss_fn_inputs={"target_tokens": types.TensorData(data=[2, 3, 4, 5], dtype="int64"),
                                    "weights": types.TensorData(data=[1.0] * 4, dtype="float32")})
PROMPT_S = 5.0
"""Upper bound for a refused call plus one forward on ``tiny`` over HTTP on a busy 2-core machine; a stalled seq_id
would add the server's 10 s gap timeout, a retried refusal the SDK's backoff."""


@pytest.fixture(scope="module")
def rest(server):
    return tinker.RestClient(base_url=server.base_url, api_key=server.api_key)


@pytest.fixture(scope="module")
def trained(sdk):
    """A model with one optimizer step, saved as training state ``s1``."""
    tc = sdk.create_lora_training_client(base_model="tiny", rank=2, seed=5).result()
    tc.forward_backward([DATUM], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    path = tc.save_state("s1").result().path
    return tc, path


def _http(server, key: str | None = None) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, headers={"X-API-Key": key or server.api_key}, timeout=30)


def _checkpoint(rest, model_id: str, checkpoint_id: str):
    return next((c for c in rest.list_checkpoints(model_id).result().checkpoints
                 if c.checkpoint_id == checkpoint_id), None)


def test_rest_training_run_by_the_model_id_the_sdk_hands_out(rest, trained, server):
    tc, path = trained
    run = rest.get_training_run(tc.model_id).result()
    assert run.training_run_id == tc.model_id and run.base_model == "tiny" and run.lora_rank == 2 and run.is_lora
    assert run.last_checkpoint is not None and run.last_checkpoint.tinker_path == path
    by_path = rest.get_training_run_by_tinker_path(path).result()
    assert by_path.training_run_id == path.split("/")[2] and by_path.last_checkpoint.tinker_path == path
    assert {c.tinker_path for c in rest.list_checkpoints(tc.model_id).result().checkpoints} == {path}
    other = tinker.RestClient(base_url=server.base_url, api_key=server.other_key)
    with pytest.raises(tinker.NotFoundError):  # another key's model id is unknown to it
        other.get_training_run(tc.model_id).result()


def test_rest_weights_info(rest, trained):
    _, path = trained
    info = rest.get_weights_info_by_tinker_path(path).result()
    assert (info.base_model, info.is_lora, info.lora_rank) == ("tiny", True, 2)
    assert (info.train_mlp, info.train_attn, info.train_unembed) == (True, True, True)
    with pytest.raises(tinker.NotFoundError):
        rest.get_weights_info_by_tinker_path(path.replace("/s1", "/missing")).result()


def test_rest_publish_unpublish_and_ttl_are_stored_and_listed(rest, trained):
    tc, path = trained
    rest.publish_checkpoint_from_tinker_path(path).result()
    assert _checkpoint(rest, tc.model_id, "weights/s1").public
    rest.unpublish_checkpoint_from_tinker_path(path).result()  # a DELETE of the sub-resource: must not delete
    ckpt = _checkpoint(rest, tc.model_id, "weights/s1")
    assert ckpt is not None and not ckpt.public
    before = datetime.now(UTC).timestamp()
    rest.set_checkpoint_ttl_from_tinker_path(path, 3600).result()
    expires = _checkpoint(rest, tc.model_id, "weights/s1").expires_at
    assert expires is not None and before + 3599 <= expires.timestamp() <= time.time() + 3601
    rest.set_checkpoint_ttl_from_tinker_path(path, None).result()
    assert _checkpoint(rest, tc.model_id, "weights/s1").expires_at is None
    with pytest.raises(tinker.BadRequestError, match="ttl_seconds=0"):
        rest.set_checkpoint_ttl_from_tinker_path(path, 0).result()


def test_rest_delete_of_a_sub_resource_never_deletes_the_checkpoint(server, trained, rest):
    tc, path = trained
    run = path.split("/")[2]
    with _http(server) as http:
        assert http.delete(f"/api/v1/training_runs/{run}/checkpoints/weights/s1/publish").status_code == 200
        for sub in ("ttl", "archive", "files/rlvr.json", "nothing/deeper"):
            assert http.delete(f"/api/v1/training_runs/{run}/checkpoints/weights/s1/{sub}").status_code in (404, 405)
    assert _checkpoint(rest, tc.model_id, "weights/s1") is not None


def test_rest_expired_ttl_deletes_the_checkpoint(sdk, rest, trained, rlvr_home):
    tc, _ = trained
    path = tc.save_state("short-lived", ttl_seconds=1).result().path  # the save request's TTL is honoured too
    folder = rlvr_home / "checkpoints" / path.split("/")[2] / "weights" / "short-lived"
    assert folder.is_dir() and _checkpoint(rest, tc.model_id, "weights/short-lived").expires_at is not None
    time.sleep(1.2)
    assert _checkpoint(rest, tc.model_id, "weights/short-lived") is None
    assert not folder.exists()
    with pytest.raises(Exception, match="short-lived"):
        sdk.create_training_client_from_state(path).result()
    # set_checkpoint_ttl on an existing checkpoint: the same
    path = tc.save_state("short-lived-2").result().path
    rest.set_checkpoint_ttl_from_tinker_path(path, 1).result()
    time.sleep(1.2)
    assert _checkpoint(rest, tc.model_id, "weights/short-lived-2") is None


def test_rest_external_weights_download_and_load_back(server, service, rest, trained, tmp_path):
    tc, _ = trained
    saved = tc.save_weights_external("export").result()
    assert saved.path.startswith("tinker://") and saved.path.endswith("/external_weights/export")
    listed = _checkpoint(rest, tc.model_id, "external_weights/export")
    assert listed is not None and listed.checkpoint_type == "external" and listed.size_bytes > 0
    urls = rest.get_external_weights_urls(saved.path).result().urls
    assert {"adapter_model.safetensors", "adapter_config.json", "rlvr.json"} <= set(urls)
    folder = tmp_path / "export"
    folder.mkdir()
    for name, url in urls.items():  # signed: a plain client without the key downloads them
        response = httpx.get(url, timeout=30)
        assert response.status_code == 200, (name, response.text)
        (folder / name).write_bytes(response.content)
    with _http(server, "tml-wrong-key-0123456789") as http:
        assert http.get(urls["rlvr.json"].split("?")[0]).status_code == 401  # unsigned: behind the API key
    with _http(server) as http:
        assert http.get(urls["rlvr.json"].split("?")[0]).status_code == 200  # ... and open to it

    # the download holds the trained weights: the same adapter as a sampler checkpoint of the same weights
    reference = tc.save_weights_for_sampler("reference").result().path
    ref_folder = server_folder(reference)
    got, want = load_file(str(folder / "adapter_model.safetensors")), load_file(
        str(ref_folder / "adapter_model.safetensors"))
    assert set(got) == set(want) and all(np.array_equal(got[k].numpy(), want[k].numpy()) for k in want)
    sampler = service.create_sampling_client(model_path=str(folder))
    tokens = types.ModelInput.from_ints([1, 2, 3, 4, 5])
    ref_sampler = service.create_sampling_client(model_path=reference.replace("tinker://", "rlvr://"))
    np.testing.assert_allclose(sampler.compute_logprobs(tokens).result()[1:],
                               ref_sampler.compute_logprobs(tokens).result()[1:], rtol=1e-6)


def server_folder(tinker_path: str):
    from rlvr.engine.checkpoint import resolve

    return resolve(tinker_path)


def test_rest_checkpoint_archive_loads_back_as_training_state(server, service, trained, tmp_path):
    tc, path = trained
    run = path.split("/")[2]
    with _http(server) as http:
        response = http.get(f"/api/v1/training_runs/{tc.model_id}/checkpoints/weights/s1/archive")
        assert response.status_code == 200 and response.headers["content-type"] == "application/x-tar"
        assert http.get(f"/api/v1/training_runs/{run}/checkpoints/weights/../../x/archive").status_code == 404
    with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
        tar.extractall(tmp_path, filter="data")
    on_server = server_folder(path)
    want_files = {str(f.relative_to(on_server)): f.read_bytes() for f in on_server.rglob("*") if f.is_file()}
    got_files = {str(f.relative_to(tmp_path / "s1")): f.read_bytes() for f in (tmp_path / "s1").rglob("*")
                 if f.is_file()}
    assert got_files == want_files  # every file, byte for byte
    loaded = service.create_training_client_from_state(str(tmp_path / "s1"))
    want = tc.forward([DATUM], "cross_entropy").result().metrics["loss:sum"]
    got = loaded.forward([DATUM], "cross_entropy").result().metrics["loss:sum"]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    fresh = service.create_lora_training_client("tiny", rank=2, seed=5)
    assert abs(fresh.forward([DATUM], "cross_entropy").result().metrics["loss:sum"] - want) > 1e-4  # it trained


def test_rest_sessions_list_get_and_search(server, sdk, rest, trained):
    tc, _ = trained
    session_id = tc.model_id.split(":")[0]
    assert session_id in rest.list_sessions(limit=1000).result().sessions
    got = rest.get_session(session_id).result()
    assert tc.model_id in got.training_run_ids
    found = rest.search_sessions(types.SessionSearchRequest(session_id=session_id)).result()
    assert [s.session_id for s in found.sessions] == [session_id] and found.sessions[0].status.type == "active"
    assert found.sessions[0].checkpoints_count >= 1
    other = tinker.RestClient(base_url=server.base_url, api_key=server.other_key)
    assert session_id not in other.list_sessions(limit=1000).result().sessions
    with pytest.raises(tinker.NotFoundError):
        other.get_session(session_id).result()


def test_rest_storage_usage_and_sampler(rest, sdk, trained):
    tc, _ = trained
    usage = rest.get_current_checkpoint_storage_usage().result()
    assert usage.data[0].checkpoint_count >= 1 and usage.data[0].size_bytes > 0
    tc.save_weights_and_get_sampling_client().result()
    sampler_id = rest.get_session(tc.model_id.split(":")[0]).result().sampler_ids[-1]
    assert rest.get_sampler(sampler_id).result().base_model == "tiny"
    assert rest.get_server_capabilities().result().supported_models


REFUSED = {
    "copy_weights": (lambda r, p: r.copy_weights(p, "project"), "copy_weights"),
    "assign_session_project": (lambda r, p: r.assign_session_project("session-x", "project"),
                               "assign_session_project"),
    "export_session_trace": (lambda r, p: r.export_session_trace("session-x"), "export_session_trace"),
    "get_audit_log": (lambda r, p: r.get_audit_log(day=date.today()), "get_audit_log"),
    "get_billing_usage": (lambda r, p: r.get_billing_usage("2026-01-01", "2026-02-01"), "get_billing_usage"),
    "whoami": (lambda r, p: r.whoami(), "whoami requires JWT"),  # answered by the SDK itself, no request
}


@pytest.mark.parametrize("method", sorted(REFUSED))
def test_rest_refusals_name_the_method_and_the_next_call_is_prompt(rest, trained, method):
    tc, path = trained
    call, expected = REFUSED[method]
    started = time.monotonic()
    with pytest.raises(Exception, match=expected):
        call(rest, path).result()
    tc.forward([DATUM], "cross_entropy").result()
    assert time.monotonic() - started < PROMPT_S


def test_rest_refused_save_weights_external_frees_its_seq_id(trained):
    tc, _ = trained
    started = time.monotonic()
    with pytest.raises(tinker.BadRequestError, match="save_weights_external: age_encryption_recipients"):
        tc.save_weights_external("secret", age_encryption_recipients=["age1xyz"]).result()
    tc.forward([DATUM], "cross_entropy").result()
    assert time.monotonic() - started < PROMPT_S


COVERED = {"get_training_run", "get_training_run_by_tinker_path", "list_checkpoints", "list_training_runs",
           "list_user_checkpoints", "delete_checkpoint", "delete_checkpoint_from_tinker_path",
           "get_weights_info_by_tinker_path", "publish_checkpoint_from_tinker_path",
           "unpublish_checkpoint_from_tinker_path", "set_checkpoint_ttl_from_tinker_path",
           "get_external_weights_urls", "list_sessions", "get_session", "search_sessions",
           "get_current_checkpoint_storage_usage", "get_sampler", "get_server_capabilities", "get_telemetry",
           *REFUSED}


def test_rest_every_sdk_method_is_covered():
    """The installed SDK's RestClient methods, read with inspect: a method added by a newer SDK fails here until a
    test calls it."""
    public = {name for name, _ in inspect.getmembers(tinker.RestClient, inspect.isfunction)
              if not name.startswith("_") and not name.endswith("_async")}
    assert public == COVERED


def test_rest_list_and_delete(rest, trained):
    tc, _ = trained
    path = tc.save_weights_for_sampler("to-delete").result().path
    run = path.split("/")[2]
    assert run in {r.training_run_id for r in rest.list_training_runs(limit=1000).result().training_runs}
    assert path in {c.tinker_path for c in rest.list_user_checkpoints(limit=1000).result().checkpoints}
    rest.delete_checkpoint_from_tinker_path(path).result()
    assert _checkpoint(rest, tc.model_id, "sampler_weights/to-delete") is None
    path = tc.save_weights_for_sampler("to-delete-2").result().path
    rest.delete_checkpoint(tc.model_id, "sampler_weights/to-delete-2").result()  # by the model id too
    assert _checkpoint(rest, tc.model_id, "sampler_weights/to-delete-2") is None


# -- item 3: features client/config switches off --------------------------------------------------------------------


def test_custom_loss_runs_client_side_with_the_cross_entropy_numbers(sdk, trained, service):
    """client/config says custom_loss_server_side=false, so create_custom_loss returns a handle without a loss_id
    and forward_backward_custom runs it in the SDK: the loss is the hand-written negative log-likelihood, which
    equals the built-in cross_entropy's loss:sum on the same weights."""
    tc, _ = trained

    def neg_ll(logprobs, weights):
        loss = -(logprobs * weights).sum()
        return loss, {"custom/neg_ll:sum": loss}

    handle = sdk.create_custom_loss(neg_ll, input_ranks={"logprobs": 1, "weights": 1}).result()
    assert handle.loss_id is None  # not uploaded: the server advertised it does not run loss graphs
    want = tc.forward([DATUM], "cross_entropy").result().metrics["loss:sum"]
    got = tc.forward_backward_custom([DATUM], handle).result().metrics["custom/neg_ll:sum"]
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize(("route", "method"), [
    ("/api/v1/create_custom_loss", "ServiceClient.create_custom_loss"),
    ("/api/v1/join_sampling_session", "join_sampling_session"),
    ("/api/v1/retrieve_futures", "retrieve_futures"),
])
def test_switched_off_features_are_refused_by_name_and_promptly(server, trained, route, method):
    tc, _ = trained
    started = time.monotonic()
    with _http(server) as http:
        config = http.post("/api/v1/client/config", json={}).json()
        assert not (config["custom_loss_server_side"] or config["sample_join_sampling_session"]
                    or config["sample_use_retrieve_futures"])
        response = http.post(route, json={"session_id": "x"})
    assert response.status_code == 400 and method in response.json()["detail"], response.text
    tc.forward([DATUM], "cross_entropy").result()
    assert time.monotonic() - started < PROMPT_S


def test_inflight_sampling_client_is_refused_by_name_and_promptly(trained):
    tc, _ = trained
    started = time.monotonic()
    with pytest.raises(tinker.BadRequestError, match="kind='inflight'"):
        tc.save_weights_and_get_sampling_client(kind="inflight").result()
    tc.forward([DATUM], "cross_entropy").result()
    assert time.monotonic() - started < PROMPT_S
