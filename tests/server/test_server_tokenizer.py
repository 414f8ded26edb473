"""``SamplingClient.get_tokenizer`` through the official SDK against ``rlvr serve`` (``rlvr.server.hub``).

The SDK (0.38) asks the server nothing here: it calls ``AutoTokenizer.from_pretrained(<base model name>)``, a Hugging
Face hub lookup, and ``tiny`` is no hub repository. So the server cannot hand it a folder, as it does to
``TrainingClient.get_tokenizer`` through ``get_info``'s ``tokenizer_id``; instead it answers the hub's own protocol at
``/hf``, and the SDK's process points the hub client there with ``HF_ENDPOINT=<server>/hf`` and ``HF_TOKEN=<the API
key>``. These tests run the SDK in a process of its own with that environment, as a user would (``HF_ENDPOINT`` is read
once, when ``huggingface_hub`` is imported), and check the tokenizer it returns encodes as the engine's does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import httpx
import pytest

TEXT = "Hello world <|im_end|> ünïcode 123"
SDK_GET_TOKENIZER = textwrap.dedent("""
    import json, sys
    import tinker
    sampler = tinker.ServiceClient().create_sampling_client(base_model="tiny").result()
    tokenizer = sampler.get_tokenizer()
    print(json.dumps({"ids": tokenizer.encode(sys.argv[1]), "template": tokenizer.chat_template}))
""")


def _run_sdk(server, tmp_path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TINKER_"))}
    environ.update(TINKER_BASE_URL=server.base_url, TINKER_API_KEY=server.api_key, HF_HOME=str(tmp_path / "hf"),
                   HF_HUB_DISABLE_TELEMETRY="1", **env)
    return subprocess.run([sys.executable, "-c", SDK_GET_TOKENIZER, TEXT], env=environ, capture_output=True,
                          text=True, timeout=300)


def test_sdk_sampling_client_get_tokenizer_encodes_like_the_engine(server, service, tmp_path):
    done = _run_sdk(server, tmp_path, HF_ENDPOINT=f"{server.base_url}/hf", HF_TOKEN=server.api_key)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    engine = service.create_sampling_client(base_model="tiny").get_tokenizer()
    assert got["ids"] == engine.encode(TEXT)
    assert got["template"] == engine.chat_template


@pytest.fixture
def hub(server, sdk):
    """An httpx client on ``/hf`` with the key, after the key has a sampler on tiny."""
    sdk.create_sampling_client(base_model="tiny").result()
    with httpx.Client(base_url=f"{server.base_url}/hf", headers={"Authorization": f"Bearer {server.api_key}"},
                      timeout=60) as client:
        yield client


def test_hub_view_answers_as_the_hub_client_expects(hub, service):
    info = hub.get("/api/models/tiny")
    assert info.status_code == 200 and len(info.json()["sha"]) == 40
    files = {s["rfilename"] for s in info.json()["siblings"]}
    assert {"tokenizer.json", "tokenizer_config.json"} <= files
    assert not any(f.endswith((".safetensors", ".bin", ".gguf")) for f in files)  # tokenizer files only
    head = hub.head("/tiny/resolve/main/tokenizer.json")
    assert head.status_code == 200 and head.headers["x-repo-commit"] == info.json()["sha"] and head.headers["etag"]
    body = hub.get("/tiny/resolve/main/tokenizer.json")
    assert int(head.headers["content-length"]) == len(body.content) and json.loads(body.content)["model"]
    tree = hub.get("/api/models/tiny/tree/main", params={"recursive": "true"})
    assert {e["path"] for e in tree.json()} == files
    missing = hub.head("/tiny/resolve/main/tokenizer.model")
    assert missing.status_code == 404 and missing.headers["x-error-code"] == "EntryNotFound"
    assert hub.get("/api/models/tiny/tree/main/additional_chat_templates").headers["x-error-code"] == "EntryNotFound"
    weights = hub.get("/tiny/resolve/main/model.safetensors")
    assert weights.status_code == 404 and "tokenizer files only" in weights.json()["error"]


def test_hub_view_is_per_key_and_needs_the_key(server, service):
    """A fresh server (no other test's samplers): a key sees the models of its own samplers, not another key's."""
    from fastapi.testclient import TestClient

    from rlvr.server import create_app

    app = TestClient(create_app([server.api_key, server.other_key], service=service))
    mine, theirs = {"X-API-Key": server.api_key}, {"X-API-Key": server.other_key}
    session = app.post("/api/v1/create_session", headers=mine,
                       json={"tags": [], "user_metadata": None, "sdk_version": "0.38.0"}).json()["session_id"]
    assert app.get("/hf/api/models/tiny", headers=mine).headers["x-error-code"] == "RepoNotFound"  # no sampler yet
    created = app.post("/api/v1/create_sampling_session", headers=mine,
                       json={"session_id": session, "sampling_session_seq_id": 0, "base_model": "tiny"})
    assert created.status_code == 200, created.text
    assert app.get("/hf/api/models/tiny", headers=mine).status_code == 200
    other = app.get("/hf/api/models/tiny", headers=theirs)
    assert other.status_code == 404 and other.headers["x-error-code"] == "RepoNotFound"
    assert "create a sampling client on the model first" in other.json()["error"]
    odd = app.get("/hf/api/models/caf\u00e9", headers=mine)  # a name no header may hold as it is
    assert odd.status_code == 404 and odd.headers["x-error-code"] == "RepoNotFound"
    unknown = app.get("/hf/api/models/Qwen/Qwen3-8B", headers=mine)
    assert unknown.status_code == 404 and unknown.headers["x-error-code"] == "RepoNotFound"
    assert "'Qwen/Qwen3-8B'" in unknown.json()["error"] and "(tiny)" in unknown.json()["error"]
    keyless = app.get("/hf/tiny/resolve/main/tokenizer.json")
    assert keyless.status_code == 401 and "set HF_TOKEN to the rlvr API key" in keyless.json()["detail"]
