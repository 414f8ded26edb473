"""Admission control for ``rlvr serve``: which API keys are accepted, and how large a request body may be.

``load_api_keys`` gathers the accepted keys (arguments, ``RLVR_API_KEY``, a keys file); ``AdmissionMiddleware`` is
an ASGI middleware that, before any route runs or any body byte is read, answers 401 to a request without a valid
``X-API-Key`` (or ``Authorization: Bearer``) and 413 to a body over the limit (under ``/v1/``, in OpenAI's error
shape). A rejected request touches no state.
Each accepted request carries a principal (a digest of its key) in ``scope["state"]["principal"]``, so sessions,
models and futures stay private to the key that made them, and a ``scope["state"]["sign"]`` that signs a download
URL with that key (:func:`sign`). A GET of a checkpoint's file (``/api/v1/training_runs/.../files/...``) is also
admitted without a key when its query carries ``expires`` and a ``signature`` one of the keys made for that path and
time: the download URLs ``get_external_weights_urls`` hands out, which tools such as tinker-cookbook's
``weights.download`` fetch with a plain HTTP GET, as they fetch Tinker's signed URLs. A key's URLs stop working when
the server stops accepting the key.

Not here: routes (``app.py``), session state (``state.py``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from rlvr.errors import ConfigurationError

__all__ = ["AdmissionMiddleware", "load_api_keys", "principal_of", "sign", "signed_query"]

KEY_PREFIX = "tml-"
ENV_KEY = "RLVR_API_KEY"
ENV_KEYS_FILE = "RLVR_API_KEYS_FILE"
OPEN_PATHS = frozenset({"/api/v1/healthz"})
SIGNED_PREFIX = "/api/v1/training_runs/"
"""Where a signed URL admits a GET without a key: a checkpoint's files (``.../files/<file>``), nothing else."""
OPENAI_PREFIX = "/v1/"
"""Where the OpenAI-compatible routes live (``openai.py``): refusals there use OpenAI's error shape."""


def load_api_keys(api_keys: str | Iterable[str] | None = None, keys_file: str | Path | None = None) -> list[str]:
    """The API keys the server accepts: ``api_keys`` (a key, or several), the lines of ``keys_file``, and when both
    are None, ``$RLVR_API_KEY`` (comma-separated) and ``$RLVR_API_KEYS_FILE``.

    Every key must start with ``tml-`` (the tinker SDK refuses other keys) and be at least 16 characters long.
    """
    keys: list[str] = []
    if isinstance(api_keys, str):
        keys.append(api_keys)
    elif api_keys is not None:
        keys.extend(api_keys)
    if keys_file is None and api_keys is None:
        keys.extend(k for k in os.environ.get(ENV_KEY, "").split(",") if k.strip())
        keys_file = os.environ.get(ENV_KEYS_FILE) or None
    if keys_file is not None:
        path = Path(keys_file).expanduser()
        if not path.is_file():
            raise ConfigurationError(f"API keys file {str(path)!r} does not exist; write one key per line there or "
                                     f"pass api_keys=")
        keys.extend(line.split("#", 1)[0] for line in path.read_text().splitlines())
    keys = [k.strip() for k in keys if k.strip()]
    if not keys:
        raise ConfigurationError(f"no API key configured: set {ENV_KEY}=tml-<secret> (or {ENV_KEYS_FILE} to a file "
                                 "with one key per line), or pass api_keys=; the server refuses to run open")
    for key in keys:
        if not key.startswith(KEY_PREFIX) or len(key) < 16:
            raise ConfigurationError(f"API key {key[:6]!r}... must start with {KEY_PREFIX!r} and be at least 16 "
                                     "characters (the tinker SDK only sends tml- keys); generate one with "
                                     "`python -c \"import secrets; print('tml-' + secrets.token_urlsafe(24))\"`")
    return list(dict.fromkeys(keys))


def principal_of(key: str) -> str:
    """A stable, non-secret name for the holder of ``key``."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def sign(key: str, path: str, expires: int) -> str:
    """The signature that admits a GET of ``path`` until ``expires`` (Unix seconds) on behalf of ``key``."""
    return hmac.new(key.encode(), f"GET {path} {expires}".encode(), hashlib.sha256).hexdigest()


def signed_query(key: str, path: str, expires: int) -> str:
    """The query string of a signed URL of ``path``: ``expires=...&signature=...``."""
    return f"expires={expires}&signature={sign(key, path, expires)}"


class AdmissionMiddleware:
    """ASGI middleware: 401 without a valid key, 413 for a body over ``max_body_bytes``, else pass through."""

    def __init__(self, app: Any, api_keys: Iterable[str], max_body_bytes: int) -> None:
        self.app = app
        api_keys = list(api_keys)
        self._keys = [k.encode() for k in api_keys]
        self._by_principal = {principal_of(k): k for k in api_keys}
        self.max_body_bytes = max_body_bytes

    def _check_key(self, headers: dict[bytes, bytes]) -> str | None:
        presented = headers.get(b"x-api-key")
        if presented is None:
            auth = headers.get(b"authorization", b"")
            if auth[:7].lower() == b"bearer ":
                presented = auth[7:].strip()
        if not presented:
            return None
        ok = False
        for key in self._keys:  # Compare against every key, so timing does not reveal which prefix matched.
            ok |= hmac.compare_digest(presented, key)
        return principal_of(presented.decode("latin-1")) if ok else None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        principal = self._check_key(headers)
        if principal is None and b"x-api-key" not in headers and b"authorization" not in headers:
            principal = self._check_signature(scope)
        if principal is None:
            missing = b"x-api-key" not in headers and b"authorization" not in headers
            reason = ("missing API key: send it in the X-API-Key header or as Authorization: Bearer <key> (the tinker "
                      "SDK sends it from api_key= or $TINKER_API_KEY, the openai client from api_key=)" if missing
                      else "invalid API key: it is not one of the server's keys")
            await _reply(send, scope["path"], 401, reason)
            return
        length = headers.get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await _reply(send, scope["path"], 400, f"Content-Length {length[:20]!r} is not a number")
                return
            if declared > self.max_body_bytes:
                await _reply(send, scope["path"], 413, f"request body of {declared} bytes exceeds the server limit of "
                                        f"{self.max_body_bytes} bytes; send fewer datums per request")
                return
        state = scope.setdefault("state", {})
        state["principal"] = principal
        key = self._by_principal[principal]
        state["sign"] = lambda path, expires: signed_query(key, path, expires)
        await self.app(scope, _limited(receive, self.max_body_bytes), send)

    def _check_signature(self, scope: dict) -> str | None:
        """The principal whose key signed this GET of a checkpoint file's URL, if one did and it has not expired."""
        path = scope["path"]
        if scope.get("method") != "GET" or not path.startswith(SIGNED_PREFIX) or "/files/" not in path:
            return None
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        try:
            expires = int(query["expires"][0])
            presented = query["signature"][0].encode()
        except (KeyError, IndexError, ValueError):
            return None
        if expires < time.time():
            return None
        found = None
        for key in self._keys:  # every key is tried, so timing does not reveal which one signed
            if hmac.compare_digest(presented, sign(key.decode("latin-1"), path, expires).encode()):
                found = principal_of(key.decode("latin-1"))
        return found


class BodyTooLarge(Exception):
    """A streamed (chunked) body that grew past the limit."""


def _limited(receive: Any, limit: int) -> Any:
    seen = 0

    async def wrapped() -> dict:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(f"request body exceeds the server limit of {limit} bytes")
        return message

    return wrapped


async def _reply(send: Any, path: str, status: int, detail: str) -> None:
    """A refusal in the shape its client reads: the tinker SDK's ``detail``, or OpenAI's ``error`` under ``/v1/``."""
    if path.startswith(OPENAI_PREFIX):
        code = "invalid_api_key" if status == 401 else None
        reply: dict[str, Any] = {"error": {"message": detail, "type": "invalid_request_error", "param": None,
                                           "code": code}}
    else:
        reply = {"detail": detail}
    body = json.dumps(reply).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
