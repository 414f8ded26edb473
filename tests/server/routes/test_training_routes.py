"""``rlvr.server.routes.training`` (and the ``RouteContext`` steps it shares): models created and loaded, ``seq_id``
ordering and the refusals that free a ``seq_id`` at once, ``get_info``'s tokenizer folder, checkpoint TTLs, and the
messages of each refusal."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from rlvr.server.routes import training
from rlvr.server.state import done

ADAM = {"learning_rate": 1e-3}
PROMPT_S = 5.0
"""Well under the app's gap timeout (30 s): a request after a refused seq_id that took longer waited for the gap."""


def test_get_info_names_a_local_tokenizer_folder(api):
    model_id = api.model()
    body = json.dumps({"model_id": model_id}).encode()
    info = asyncio.run(training.get_info(body, api.ctx, api.owner))
    assert info["model_id"] == model_id and info["model_data"]["model_name"] == "tiny"
    assert (Path(info["model_data"]["tokenizer_id"]) / "tokenizer_config.json").is_file()
    assert api.post("/get_info", api.other, json={"model_id": model_id}).status_code == 404


def test_seq_ids_start_at_one(api):
    model_id = api.model()
    r = api.post("/optim_step", json={"model_id": model_id, "seq_id": 0, "optim_params": ADAM})
    assert r.status_code == 400
    assert r.json()["detail"] == "seq_id=0 must be an integer >= 1 (the SDK numbers each model's requests from 1)"


def test_a_refused_request_frees_its_seq_id_and_a_save_gets_its_ttl(api):
    model_id = api.model()
    r = api.post("/optim_step", json={"model_id": model_id, "seq_id": 1, "optim_params": {"learning_rate": "fast"}})
    assert r.status_code == 400
    started = time.monotonic()
    saved = api.result(api.post("/save_weights", json={"model_id": model_id, "seq_id": 2, "path": "kept",
                                                       "ttl_seconds": 3600}))
    assert time.monotonic() - started < PROMPT_S  # seq_id 1 was freed: 2 did not wait out the gap timeout
    path = saved.json()["path"]
    assert path.startswith("tinker://") and path.endswith("/weights/kept")
    run = path.split("/")[2]
    (checkpoint,) = api.ctx.catalog.checkpoints(run, api.owner)
    assert checkpoint.checkpoint_id == "weights/kept" and checkpoint.expires_at is not None


def test_a_refusal_with_no_model_of_the_caller_frees_nothing(api):
    model_id = api.model()
    r = api.post("/optim_step", api.other, json={"model_id": model_id, "seq_id": 1, "optim_params": ADAM})
    assert r.status_code == 404
    _, future = api.ctx.state.models[model_id].sequencer.submit(1, "r-1", lambda: done("ran"))  # 1 is still open
    assert future.result(timeout=5) == "ran"


def test_forward_backward_reads_the_content_encoding_header(api):
    r = api.post("/forward_backward", content=b"\x00", headers={"Content-Encoding": "br"})
    assert r.status_code == 415
    assert r.json()["detail"] == "Content-Encoding 'br' is not supported; send identity or zstd"


@pytest.mark.parametrize(("route", "body", "says"), [
    ("/save_weights_for_sampler", {"kind": "inflight", "path": "w"},
     "kind='inflight': rlvr serves snapshot sampling clients only; use kind='snapshot'"),
    ("/save_weights_for_sampler", {},
     "save_weights_for_sampler needs path (a checkpoint name) or sampling_session_seq_id"),
    ("/save_weights_external", {"path": "a/b"},
     "TrainingClient.save_weights_external: name='a/b' must be non-empty, without '/', and not start with '.'"),
    ("/load_weights", {"path": "tinker://r/weights/s", "optimizer": False, "optimizer_config": {"type": "adam"}},
     "load_weights: optimizer_config chooses the optimizer of a new model loaded without optimizer state; a load "
     "with optimizer state keeps the checkpoint's, and an existing model keeps its own, so leave optimizer_config "
     "unset"),
])
def test_refusals_name_the_field_and_the_fix(api, route, body, says):
    model_id = api.model()
    r = api.post(route, json={"model_id": model_id, "seq_id": 1, **body})
    assert r.status_code == 400 and r.json()["detail"] == says


def test_load_weights_needs_a_model_or_a_session_and_model_seq_id(api):
    r = api.post("/load_weights", json={"path": "tinker://r/weights/s", "optimizer": False})
    assert r.json()["detail"] == "load_weights needs model_id (and seq_id), or session_id and model_seq_id"
    r = api.post("/load_weights", json={"path": "tinker://r/weights/s", "optimizer": False,
                                        "session_id": api.session()})
    assert r.json()["detail"] == "load_weights with session_id needs model_seq_id"


def test_load_weights_with_a_session_creates_a_model_from_the_checkpoint(api):
    model_id = api.model(seed=5)
    saved = api.result(api.post("/save_weights", json={"model_id": model_id, "seq_id": 1, "path": "to-load"}))
    path = saved.json()["path"]
    r = api.post("/load_weights", json={"path": path, "optimizer": True, "session_id": api.session(),
                                        "model_seq_id": 0, "base_model": "tiny"})
    loaded = api.result(r)
    assert loaded.json()["path"] == path and loaded.json()["model_id"] == r.json()["model_id"] != model_id
    info = api.post("/get_info", json={"model_id": loaded.json()["model_id"]}).json()
    assert info["model_data"]["model_name"] == "tiny"


def test_a_queued_request_answers_a_future_id_for_its_model(api):
    model_id = api.model()
    r = api.post("/save_weights_for_sampler", json={"model_id": model_id, "seq_id": 1, "path": "for-sampling"})
    assert r.json()["model_id"] == model_id
    assert api.result(r).json()["path"].endswith("/sampler_weights/for-sampling")
