"""Keys, malformed and oversized bodies are refused with 401 / 4xx, and none of it disturbs another session."""

from __future__ import annotations

import httpx
import pytest
import zstandard
from tinker import types
from tinker.proto import tinker_public_pb2 as pb

DATUM = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3, 4]),
                    loss_fn_inputs={"target_tokens": types.TensorData(data=[2, 3, 4, 5], dtype="int64"),
                                    "weights": types.TensorData(data=[1.0] * 4, dtype="float32")})


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url + "/api/v1", timeout=30) as client:
        yield client


def _headers(key: str, **extra: str) -> dict[str, str]:
    return {"X-API-Key": key, **extra}


def test_server_rejects_bad_requests_while_another_session_trains(server, sdk, http):
    victim = sdk.create_lora_training_client(base_model="tiny", rank=2, seed=5).result()
    before = victim.forward([DATUM], "cross_entropy").result().metrics["loss:sum"]
    pending = victim.forward_backward([DATUM], "cross_entropy")  # in flight while the attacks arrive
    model_id = victim.model_id
    proto = pb.ForwardBackwardRequest(model_id=model_id, seq_id=99, loss_fn="cross_entropy").SerializeToString()

    # No key, a wrong key, a key without the tml- prefix: 401, nothing touched.
    for headers in ({}, _headers("tml-wrong-key-000000000"), _headers("sk-not-a-tinker-key"),
                    {"Authorization": "Bearer tml-wrong-key-000000000"}):
        for path, body in (("/create_session", b'{"tags": [], "user_metadata": {}, "sdk_version": "0"}'),
                           ("/forward_backward", proto)):
            r = http.post(path, content=body, headers=headers)
            assert r.status_code == 401, (path, headers, r.text)
            assert "API key" in r.json()["detail"]

    key = server.api_key
    # Garbage protobuf, an empty one, unknown model, garbage zstd, unknown encoding: 4xx with a message.
    r = http.post("/forward_backward", content=b"\x0a\xff\xff\xff\xff\x0f garbage",
                  headers=_headers(key, **{"Content-Type": "application/x-protobuf"}))
    assert r.status_code == 400 and "ForwardBackwardRequest protobuf" in r.json()["detail"]
    r = http.post("/forward_backward", content=b"", headers=_headers(key))
    assert r.status_code == 400 and "model_id" in r.json()["detail"]
    unknown = pb.ForwardBackwardRequest(model_id="nope:train:0", seq_id=1, loss_fn="cross_entropy")
    unknown.data.add().model_input.add().encoded_text.tokens = b"\x01\x00\x00\x00"
    r = http.post("/forward_backward", content=unknown.SerializeToString(), headers=_headers(key))
    assert r.status_code == 404 and "nope:train:0" in r.json()["detail"]
    r = http.post("/forward_backward", content=b"not zstd", headers=_headers(key, **{"Content-Encoding": "zstd"}))
    assert r.status_code == 400 and "zstd" in r.json()["detail"]
    r = http.post("/forward_backward", content=proto, headers=_headers(key, **{"Content-Encoding": "br"}))
    assert r.status_code == 415

    # Malformed JSON bodies.
    r = http.post("/create_session", content=b"{not json", headers=_headers(key))
    assert r.status_code == 400 and "not valid JSON" in r.json()["detail"]
    r = http.post("/optim_step", json={"model_id": model_id, "seq_id": 5, "adam_params": {"learning_rate": "fast"}},
                  headers=_headers(key))
    assert r.status_code == 400 and "learning_rate" in r.json()["detail"]
    r = http.post("/retrieve_future", json={"request_id": "does-not-exist"}, headers=_headers(key))
    assert r.status_code == 404

    # Oversized bodies: declared, and a small zstd body that inflates past the limit.
    big = b"\0" * (server.max_body_bytes + 1)
    r = http.post("/forward_backward", content=big, headers=_headers(key))
    assert r.status_code == 413
    bomb = zstandard.ZstdCompressor().compress(big)
    r = http.post("/forward_backward", content=bomb, headers=_headers(key, **{"Content-Encoding": "zstd"}))
    assert r.status_code == 413 and "decompressed" in r.json()["detail"]

    # Another key cannot see or drive this session's model.
    r = http.post("/get_info", json={"model_id": model_id}, headers=_headers(server.other_key))
    assert r.status_code == 404

    # The victim never noticed.
    assert pending.result().metrics["loss:sum"] == pytest.approx(before, rel=1e-5)
    victim.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    after = victim.forward([DATUM], "cross_entropy").result().metrics["loss:sum"]
    assert after < before
    assert http.get("/healthz").json() == {"status": "ok"}


def test_server_refuses_to_start_without_valid_keys(monkeypatch):
    from rlvr.errors import ConfigurationError
    from rlvr.server import create_app, load_api_keys

    monkeypatch.delenv("RLVR_API_KEY", raising=False)
    monkeypatch.delenv("RLVR_API_KEYS_FILE", raising=False)
    with pytest.raises(ConfigurationError, match="no API key"):
        create_app()
    with pytest.raises(ConfigurationError, match="tml-"):
        load_api_keys("sk-123456789012345678")
    monkeypatch.setenv("RLVR_API_KEY", "tml-from-env-0123456789,tml-second-0123456789")
    assert load_api_keys() == ["tml-from-env-0123456789", "tml-second-0123456789"]
