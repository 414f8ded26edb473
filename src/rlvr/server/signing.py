"""Signed download URLs for checkpoint files: what ``RestClient.get_external_weights_urls`` hands out, so that a plain
HTTP client (curl, urllib, httpx) downloads a file without the API key, as it does from hosted Tinker.

A signed URL is the file's route plus three query parameters: ``expires`` (Unix seconds), ``owner`` (the principal
of the key it was issued to, ``auth.principal_of``: a digest, not the key) and ``signature``, the HMAC-SHA256 of the
file's path, the owner and the expiry under a per-server secret. The secret lives in
``$RLVR_HOME/server/url-signing.key``, created once, atomically, readable by its owner only (0600), so URLs outlive a
restart of a server on the same home; deleting the file revokes every URL handed out. ``UrlSigner.verify`` refuses a
URL (``SignatureRefused``, HTTP 403, the message saying which check failed and to ask for a fresh URL) that has
expired, whose path, owner, expiry or signature was changed, or whose owner's key the server no longer accepts.

Only GETs of a checkpoint's files (``DOWNLOAD_PATH``) are ever accepted on a signature; every other route needs the
API key. Not here: the API key check and where it calls ``verify`` (``auth.py``), the routes that sign
(``routes/rest.py``), which files a checkpoint has (``catalog.py``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import os
import re
import secrets
import tempfile
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import parse_qs, urlencode

from rlvr.errors import ConfigurationError
from rlvr.fileio import storage_errors

__all__ = ["DEFAULT_LIFETIME_S", "DOWNLOAD_PATH", "SECRET_FILE", "SignatureRefused", "UrlSigner", "load_secret"]

log = logging.getLogger("rlvr.server")

DEFAULT_LIFETIME_S = 3600
"""How long a signed URL holds (1 hour), unless its checkpoint's TTL ends sooner. tinker's own ``checkpoint download``
asks for fresh URLs when fewer than 5 minutes remain, so a lifetime under 5 minutes makes it ask before every file."""

SECRET_FILE = "url-signing.key"
"""The secret's file name in the server's state folder (``$RLVR_HOME/server``)."""

DOWNLOAD_PATH = re.compile(r"^/api/v1/training_runs/[^/]+/checkpoints/[^/]+/[^/]+/files/.+$")
"""The only routes a signature opens: one file of one checkpoint."""

_SECRET_BYTES = 32
_FRESH = "ask for a fresh URL (RestClient.get_external_weights_urls)"


class SignatureRefused(PermissionError):
    """A signed URL that is expired, altered, or no longer backed by an accepted key (HTTP 403)."""


def load_secret(folder: Path) -> bytes:
    """The server's URL-signing secret, read from ``folder/url-signing.key``, which is created (0600) if missing.

    The file appears atomically (a complete temporary file hard-linked into place), and a server that finds one
    written meanwhile by another on the same home uses that one, so both sign alike."""
    path = folder / SECRET_FILE
    with storage_errors("write", path):  # a full or read-only disk: a StorageError naming the file and the fix
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{SECRET_FILE}.", suffix=".tmp")  # made 0600
            try:
                os.write(fd, secrets.token_hex(_SECRET_BYTES).encode() + b"\n")
                os.fsync(fd)
                os.close(fd)
                try:
                    os.link(temp, path)  # fails if the file exists: never replaces a secret already in use
                except FileExistsError:
                    pass
            finally:
                os.unlink(temp)
        text = path.read_text().strip()
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        secret = b""
    if len(secret) != _SECRET_BYTES:
        raise ConfigurationError(f"{str(path)!r} does not hold a URL-signing secret ({2 * _SECRET_BYTES} hex "
                                 "characters); delete it and restart the server to make a new one (download URLs "
                                 "handed out before stop working)")
    if path.stat().st_mode & 0o077:
        log.warning("%s is readable by other users: anyone who reads it can sign download URLs; chmod 600 it", path)
    return secret


class UrlSigner:
    """Signs and checks download URLs for the owners in ``owners`` (the principals of the server's keys)."""

    def __init__(self, secret: bytes, owners: Iterable[str], lifetime_s: float = DEFAULT_LIFETIME_S,
                 clock: Callable[[], float] = time.time) -> None:
        if not lifetime_s > 0:
            raise ConfigurationError(f"url_lifetime_s={lifetime_s!r} must be a positive number of seconds")
        self._secret = secret
        self.owners = frozenset(owners)
        self.lifetime_s = lifetime_s
        self.clock = clock

    def _mac(self, path: str, owner: str, expires: int) -> str:
        message = json.dumps(["rlvr-download-v1", path, owner, expires]).encode()  # unambiguous, whatever path holds
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def expiry(self, not_after: float | None = None) -> int:
        """When a URL signed now expires (Unix seconds): ``lifetime_s`` from now, or ``not_after`` (the checkpoint's
        own expiry) if that is sooner."""
        expires = math.floor(self.clock() + self.lifetime_s)
        return expires if not_after is None else min(expires, math.floor(not_after))

    def sign(self, path: str, owner: str, expires: int) -> str:
        """The query string that opens ``path`` (the decoded URL path) to anyone until ``expires``, issued to
        ``owner``."""
        return urlencode({"expires": expires, "owner": owner, "signature": self._mac(path, owner, expires)})

    @staticmethod
    def is_signed(query_string: bytes | str) -> bool:
        """Whether a request's query string carries a signature (then the signature, not a key, decides)."""
        raw = query_string.decode("latin-1") if isinstance(query_string, bytes) else query_string
        return "signature" in parse_qs(raw, keep_blank_values=True)

    def verify(self, path: str, query_string: bytes | str) -> str:
        """The owner a signed URL was issued to, or ``SignatureRefused`` saying what is wrong with it."""
        raw = query_string.decode("latin-1") if isinstance(query_string, bytes) else query_string
        if not DOWNLOAD_PATH.match(path):
            raise SignatureRefused(f"a signed URL opens only a checkpoint file download, not {path}; send the API "
                                   "key in X-API-Key for this route")
        params = parse_qs(raw, keep_blank_values=True)
        missing = [p for p in ("expires", "owner", "signature") if len(params.get(p, [])) != 1]
        if missing:
            raise SignatureRefused(f"signed URL has no single {', '.join(missing)} parameter: it was cut short or "
                                   f"altered; {_FRESH}")
        (expires_text,), (owner,), (signature,) = params["expires"], params["owner"], params["signature"]
        expires = int(expires_text) if re.fullmatch(r"\d{1,12}", expires_text) else -1
        if expires < 0 or not hmac.compare_digest(signature.encode(), self._mac(path, owner, expires).encode()):
            raise SignatureRefused("signed URL does not match its signature: its path, owner, expiry or signature "
                                   f"was changed, or it was signed by another server or an earlier secret; {_FRESH}")
        now = self.clock()
        if now >= expires:
            when = datetime.fromtimestamp(expires, UTC).isoformat(timespec="seconds")
            raise SignatureRefused(f"signed URL expired at {when} ({now - expires:.0f} s ago); {_FRESH}")
        if owner not in self.owners:
            raise SignatureRefused("signed URL was issued to an API key this server no longer accepts; ask for a "
                                   "fresh URL with a current key (RestClient.get_external_weights_urls)")
        return owner
