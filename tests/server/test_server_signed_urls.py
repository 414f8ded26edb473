"""Signed download URLs (``rlvr.server.signing``) through the official SDK against ``rlvr serve``: the URLs
``RestClient.get_external_weights_urls`` hands out download with a plain HTTP client and no key, byte for byte; an
expired, altered or another owner's URL is refused with 403 and a body that says what is wrong and to ask for a fresh
URL; the server keeps serving after a refusal; URLs survive a restart on the same home and die with its secret.

The SDK 0.38 installed has no ``get_checkpoint_archive_url``; ``get_external_weights_urls`` is its download call."""

from __future__ import annotations

import os
import re
import stat
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import httpx
import pytest
import tinker
from tinker import types

from rlvr.server.auth import principal_of
from rlvr.server.signing import DEFAULT_LIFETIME_S, SECRET_FILE, UrlSigner, load_secret

DATUM = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3, 4]),
                    loss_fn_inputs={"target_tokens": types.TensorData(data=[2, 3, 4, 5], dtype="int64"),
                                    "weights": types.TensorData(data=[1.0] * 4, dtype="float32")})
FRESH = "ask for a fresh URL"


@pytest.fixture(scope="module")
def exported(server):
    """A trained model's external weights, saved and signed through the SDK's own calls: (rest, path, response)."""
    sdk = tinker.ServiceClient(base_url=server.base_url, api_key=server.api_key)
    tc = sdk.create_lora_training_client(base_model="tiny", rank=2, seed=11).result()
    tc.forward_backward([DATUM], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    path = tc.save_weights_external("signed").result().path
    rest = sdk.create_rest_client()
    return rest, path, rest.get_external_weights_urls(path).result()


def _on_disk(tinker_path: str) -> Path:
    from rlvr.home import checkpoint_root

    return checkpoint_root() / tinker_path.removeprefix("tinker://")


def _plain_get(url: str) -> httpx.Response:
    """A GET with no key and no SDK: what curl does."""
    return httpx.get(url, timeout=30)


def _with_query(url: str, **changes: str) -> str:
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    query.update(changes)
    return urlunsplit(parts._replace(query=urlencode({k: v for k, v in query.items() if v is not None})))


def _refused(url: str, pattern: str) -> None:
    response = _plain_get(url)
    assert response.status_code == 403, (response.status_code, response.text)
    detail = response.json()["detail"]
    assert re.search(pattern, detail) and FRESH in detail and "get_external_weights_urls" in detail, detail


def test_sdk_urls_download_without_the_key_byte_for_byte(exported):
    _, path, response = exported
    folder = _on_disk(path)
    assert set(response.urls) == {str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file()}
    assert {"adapter_model.safetensors", "adapter_config.json", "rlvr.json"} <= set(response.urls)
    for name, url in response.urls.items():
        got = _plain_get(url)
        assert got.status_code == 200, (name, got.text)
        assert got.content == (folder / name).read_bytes(), name
    with urllib.request.urlopen(response.urls["rlvr.json"], timeout=30) as reply:  # tinker's own downloader's client
        assert reply.read() == (folder / "rlvr.json").read_bytes()
    left = response.expires.timestamp() - time.time()
    assert DEFAULT_LIFETIME_S - 60 < left <= DEFAULT_LIFETIME_S, left


def test_key_authenticated_download_still_works_and_an_unsigned_url_needs_the_key(server, exported):
    _, path, response = exported
    unsigned = response.urls["rlvr.json"].split("?")[0]
    assert _plain_get(unsigned).status_code == 401
    with_key = httpx.get(unsigned, headers={"X-API-Key": server.api_key}, timeout=30)
    assert with_key.status_code == 200 and with_key.content == (_on_disk(path) / "rlvr.json").read_bytes()


@pytest.mark.parametrize("tamper", ["path: another file", "path: another checkpoint", "path: another run", "expiry",
                                    "signature", "owner: another key's", "owner: missing"])
def test_altered_url_is_refused_and_the_next_request_is_served(server, exported, tamper):
    rest, path, response = exported
    url = response.urls["rlvr.json"]
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    if tamper == "path: another file":
        bad = url.replace("/files/rlvr.json?", "/files/adapter_config.json?")
    elif tamper == "path: another checkpoint":
        bad = url.replace("/external_weights/signed/", "/external_weights/other/")
    elif tamper == "path: another run":
        run = path.split("/")[2]
        bad = url.replace(f"/training_runs/{run}/", "/training_runs/run-someone-else/")
    elif tamper == "expiry":
        bad = _with_query(url, expires=str(int(query["expires"][0]) + 3600))
    elif tamper == "signature":
        sig = query["signature"][0]
        bad = _with_query(url, signature=("0" if sig[0] != "0" else "1") + sig[1:])
    elif tamper == "owner: another key's":
        bad = _with_query(url, owner=principal_of(server.other_key))
    else:
        bad = _with_query(url, owner=None)
    assert bad != url
    if tamper == "owner: missing":
        _refused(bad, r"no single owner parameter: it was cut short or altered")
    else:
        _refused(bad, r"does not match its signature: its path, owner, expiry or signature was changed")
    assert _plain_get(url).status_code == 200  # the next request is served
    assert rest.list_sessions(limit=1).result() is not None


def test_expired_url_is_refused(server, exported, rlvr_home):
    """An honestly signed URL (the server's own secret) whose time is up: refused as expired, not as altered."""
    _, _, response = exported
    url = response.urls["rlvr.json"]
    signer = UrlSigner(load_secret(rlvr_home / "server"), {principal_of(server.api_key)},
                       clock=lambda: time.time() - 2 * DEFAULT_LIFETIME_S)
    owner = parse_qs(urlsplit(url).query)["owner"][0]
    expires = signer.expiry()
    assert expires < time.time()
    expired = url.split("?")[0] + "?" + signer.sign(urlsplit(url).path, owner, expires)
    _refused(expired, r"signed URL expired at \d{4}-\d\d-\d\dT.* s ago\)")
    assert _plain_get(url).status_code == 200
    # the same secret's URL with an expiry still ahead is good: only the time was wrong
    ahead = signer.sign(urlsplit(url).path, owner, int(time.time()) + 60)
    assert _plain_get(url.split("?")[0] + "?" + ahead).status_code == 200


def test_urls_expire_with_the_checkpoints_ttl(exported):
    rest, path, _ = exported
    rest.set_checkpoint_ttl_from_tinker_path(path, 600).result()
    try:
        response = rest.get_external_weights_urls(path).result()
        assert 540 < response.expires.timestamp() - time.time() <= 600
        assert _plain_get(response.urls["rlvr.json"]).status_code == 200
    finally:
        rest.set_checkpoint_ttl_from_tinker_path(path, None).result()


def test_another_owners_url(server, exported, rlvr_home):
    """A URL is tied to the key it was issued to: the other key cannot have its checkpoint signed, cannot re-label a
    URL as its own, and a URL of a key the server no longer accepts is refused; the owner's URL works for anyone."""
    _, path, response = exported
    other = tinker.RestClient(base_url=server.base_url, api_key=server.other_key)
    with pytest.raises(tinker.NotFoundError):
        other.get_external_weights_urls(path).result()
    url = response.urls["rlvr.json"]
    with_other_key = httpx.get(url, headers={"X-API-Key": server.other_key}, timeout=30)
    assert with_other_key.status_code == 200  # the signature decides, whoever sends it
    retired = "tml-retired-key-0123456789"
    signer = UrlSigner(load_secret(rlvr_home / "server"), {principal_of(retired)})
    forged = url.split("?")[0] + "?" + signer.sign(urlsplit(url).path, principal_of(retired), signer.expiry())
    _refused(forged, r"issued to an API key this server no longer accepts")
    assert _plain_get(url).status_code == 200


def test_a_signature_opens_only_file_downloads(server, exported):
    """Signature parameters on any other route are ignored: it still needs the key."""
    _, path, response = exported
    query = urlsplit(response.urls["rlvr.json"]).query
    run = path.split("/")[2]
    for route in (f"/api/v1/training_runs/{run}/checkpoints/external_weights/signed/archive",
                  f"/api/v1/training_runs/{run}/checkpoints", "/api/v1/sessions"):
        assert httpx.get(f"{server.base_url}{route}?{query}", timeout=30).status_code == 401, route


def test_urls_survive_a_restart_on_the_same_home_and_die_with_its_secret(server, service, exported, rlvr_home,
                                                                          tmp_path, monkeypatch):
    from fastapi.testclient import TestClient

    from rlvr.server import create_app

    _, path, response = exported
    url = urlsplit(response.urls["rlvr.json"])
    secret_file = rlvr_home / "server" / SECRET_FILE
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    restarted = TestClient(create_app([server.api_key, server.other_key], service=service))
    got = restarted.get(f"{url.path}?{url.query}")
    assert got.status_code == 200 and got.content == (_on_disk(path) / "rlvr.json").read_bytes()
    # another home: another secret, so the URL is refused (and the folder it makes is 0600 too)
    monkeypatch.setenv("RLVR_HOME", str(tmp_path))
    elsewhere = TestClient(create_app([server.api_key, server.other_key], service=service))
    assert stat.S_IMODE((tmp_path / "server" / SECRET_FILE).stat().st_mode) == 0o600
    refused = elsewhere.get(f"{url.path}?{url.query}")
    assert refused.status_code == 403 and "does not match its signature" in refused.json()["detail"]


def test_secret_is_made_once_and_kept(tmp_path):
    first = load_secret(tmp_path / "server")
    assert load_secret(tmp_path / "server") == first and len(first) == 32
    assert [p.name for p in (tmp_path / "server").iterdir()] == [SECRET_FILE]  # no temporary file left behind
    (tmp_path / "server" / SECRET_FILE).write_text("not hex")
    with pytest.raises(ValueError, match="delete it and restart the server"):
        load_secret(tmp_path / "server")


def test_expires_in_the_response_is_a_utc_time(exported):
    _, _, response = exported
    assert response.expires.tzinfo is not None and response.expires > datetime.now(UTC)
    assert os.path.basename(urlsplit(response.urls["rlvr.json"]).path) == "rlvr.json"
