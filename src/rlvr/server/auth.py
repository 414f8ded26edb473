"""Admission control for ``rlvr serve``: which API keys are accepted, and how large a request body may be.

``load_api_keys`` gathers the accepted keys (arguments, ``RLVR_API_KEY``, a keys file); ``AdmissionMiddleware`` is
an ASGI middleware that, before any route runs or any body byte is read, answers 401 to a request without a valid
``X-API-Key`` (or ``Authorization: Bearer``) and 413 to a body over the limit (under ``/v1/`` and ``/inference/``,
in OpenAI's error shape). A rejected request touches no state.
Each accepted request carries a principal (a digest of its key) in ``scope["state"]["principal"]``, so sessions,
models and futures stay private to the key that made them.

A GET of a checkpoint file whose query string carries a signature is decided by the signature instead of a key
(``signing.py``): a valid one admits it as the principal the URL was issued to, any other is refused with 403 and the
reason.

Not here: routes (``routes/``, ``hub.py``, ``openai.py``), session state (``state.py``), what a signed URL holds
(``signing.py``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlvr.errors import ConfigurationError
from rlvr.server.signing import DOWNLOAD_PATH, SignatureRefused, UrlSigner

__all__ = ["AdmissionMiddleware", "load_api_keys", "principal_of"]

KEY_PREFIX = "tml-"
ENV_KEY = "RLVR_API_KEY"
ENV_KEYS_FILE = "RLVR_API_KEYS_FILE"
OPEN_PATHS = frozenset({"/api/v1/healthz"})
HUB_PREFIX = "/hf"
"""Where the hub-shaped tokenizer routes live (``hub.py``): a refusal there names ``HF_TOKEN``."""
OPENAI_PREFIXES = ("/v1/", "/inference/")
"""Where the OpenAI-compatible routes (``openai.py``) and vLLM's generate route (``generate.py``) live: refusals there
use OpenAI's error shape."""


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


class AdmissionMiddleware:
    """ASGI middleware: 401 without a valid key, 413 for a body over ``max_body_bytes``, else pass through. With a
    ``signer``, a signed file download is admitted on its signature (403 when the signature does not hold)."""

    def __init__(self, app: Any, api_keys: Iterable[str], max_body_bytes: int, signer: UrlSigner | None = None) -> None:
        self.app = app
        self._keys = [k.encode() for k in api_keys]
        self.max_body_bytes = max_body_bytes
        self.signer = signer

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
        query = scope.get("query_string", b"")
        if (self.signer is not None and scope["method"] in ("GET", "HEAD") and DOWNLOAD_PATH.match(scope["path"])
                and self.signer.is_signed(query)):
            try:  # the signature decides, whatever key is sent along: a signed URL works alike for everyone
                owner = self.signer.verify(scope["path"], query)
            except SignatureRefused as exc:
                await _reply(send, scope["path"], 403, str(exc))
                return
            scope.setdefault("state", {})["principal"] = owner
            await self.app(scope, _limited(receive, self.max_body_bytes), send)
            return
        principal = self._check_key(headers)
        if principal is None:
            missing = b"x-api-key" not in headers and b"authorization" not in headers
            reason = ("missing API key: send it in the X-API-Key header or as Authorization: Bearer <key> (the tinker "
                      "SDK sends it from api_key= or $TINKER_API_KEY, the openai client from api_key=)" if missing
                      else "invalid API key: it is not one of the server's keys")
            if scope["path"].startswith(HUB_PREFIX + "/"):
                reason += "; the Hugging Face hub client sends $HF_TOKEN, so set HF_TOKEN to the rlvr API key"
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
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, _limited(receive, self.max_body_bytes), send)


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
    """A refusal in the shape its client reads: the tinker SDK's ``detail``, or OpenAI's ``error`` under ``/v1/`` and
    ``/inference/``."""
    if path.startswith(OPENAI_PREFIXES):
        code = "invalid_api_key" if status == 401 else None
        reply: dict[str, Any] = {"error": {"message": detail, "type": "invalid_request_error", "param": None,
                                           "code": code}}
    else:
        reply = {"detail": detail}
    body = json.dumps(reply).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
