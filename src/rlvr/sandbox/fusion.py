"""SandboxFusion's ``/run_code`` over rlvr's sandbox, for tools that grade code through it (``rlvr sandbox serve``).

tinker-cookbook's ``code_rl`` recipe (``SandboxFusionClient``, ``SANDBOX_URL``) and verl's SandboxFusion reward
(``reward.sandbox_fusion.url``) post programs to a SandboxFusion service, a Docker image. This module answers the same
requests from rlvr's fork-server pool, with no Docker::

    from rlvr.sandbox.fusion import serve
    serve(port=8080)                      # rlvr sandbox serve; then SANDBOX_URL=http://localhost:8080/run_code

What it is: the request and response models with SandboxFusion's field names (``RunCodeRequest``: code, language,
run_timeout, compile_timeout, memory_limit_MB, stdin, files as base64, fetch_files; ``RunCodeResponse``: status
``Success`` / ``Failed`` / ``SandboxError``, message, ``run_result`` with status ``Finished`` / ``TimeLimitExceeded``
/ ``Error``, execution_time, return_code, stdout, stderr; files), the translation to and from
:class:`~rlvr.sandbox.ScriptJob`, the app (``POST /run_code``, ``GET /v1/ping``) and its admission check (an
optional API key, a body limit). Each request is submitted to the pool on arrival (``Sandbox.submit``): requests
beyond the pool's servers wait in its queue, none is dropped, and a slow program holds up only its own server.

What it is not: the rest of SandboxFusion (other languages, Jupyter, its datasets and online-judge routes). A request
for another language is answered ``SandboxError`` with a message naming it, which both clients treat as a failed run.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs

from pydantic import BaseModel, Field

from rlvr.errors import ConfigurationError, SandboxError
from rlvr.sandbox.result import SCRIPT_OUTPUT_BYTES, ScriptJob, ScriptResult, job_relative_path

log = logging.getLogger("rlvr.sandbox")

ENV_KEY = "RLVR_SANDBOX_API_KEY"
LANGUAGES = ("python",)
"""What ``rlvr sandbox serve`` runs; SandboxFusion's other languages are refused by name."""
MAX_BODY_BYTES = 64 << 20


class RunCodeRequest(BaseModel):
    """SandboxFusion's ``/run_code`` request (its ``RunCodeRequest``; unknown fields are ignored, as there)."""

    code: str = Field(description="the program to run")
    language: str = Field(description="'python' (other SandboxFusion languages are refused by name)")
    compile_timeout: float = Field(10, description="for compiled languages; Python has no compile step")
    run_timeout: float = Field(10, description="wall-clock seconds for the run")
    memory_limit_MB: int = Field(-1, description="address-space limit in MiB; -1: the server's")
    stdin: str | None = Field(None, description="what the program reads on stdin")
    files: dict[str, str | None] = Field({}, description="path -> base64 content, created beside the program")
    fetch_files: list[str] = Field([], description="paths to return (base64) after the run")
    args: list[str] = Field([], description="pytest's arguments in SandboxFusion; unused for python")


class CommandRunResult(BaseModel):
    """One command's outcome, as SandboxFusion reports it."""

    status: Literal["Finished", "Error", "TimeLimitExceeded"]
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    """SandboxFusion's ``/run_code`` response. ``Success``: the program exited 0; ``Failed``: it exited otherwise or
    ran out of time; ``SandboxError``: it could not run (``message`` says why)."""

    status: Literal["Success", "Failed", "SandboxError"]
    message: str
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = {}


@dataclass(frozen=True)
class Limits:
    """What one request may ask for."""

    max_run_timeout: float = 3600.0
    """Largest ``run_timeout`` accepted, in seconds (tinker-cookbook asks (6 + 1) s per test + 5 s for a problem)."""
    memory_mb: int = 1024
    """The address-space limit of every program (the pool's), and the largest ``memory_limit_MB`` accepted."""
    output_bytes: int = SCRIPT_OUTPUT_BYTES
    """How much of stdout, and of stderr, comes back (SandboxFusion keeps 1 MiB of each)."""


class Refusal(ValueError):
    """A request that cannot run as asked; the message names the field and the fix."""


def to_job(request: RunCodeRequest, limits: Limits) -> ScriptJob:
    """The :class:`ScriptJob` a request asks for, or :class:`Refusal` naming the field at fault."""
    if request.language not in LANGUAGES:
        raise Refusal(f"language={request.language!r}: rlvr sandbox serve runs Python only; send language='python', "
                      "or grade other languages with SandboxFusion itself")
    if not 0 < request.run_timeout <= limits.max_run_timeout:
        raise Refusal(f"run_timeout={request.run_timeout:g}: must be more than 0 and at most this server's "
                      f"{limits.max_run_timeout:g} s (rlvr sandbox serve --max-run-timeout)")
    memory = None if request.memory_limit_MB <= 0 else request.memory_limit_MB
    if memory is not None and not 16 <= memory <= limits.memory_mb:
        raise Refusal(f"memory_limit_MB={memory}: this server runs programs in at most {limits.memory_mb} MiB; ask for "
                      f"16 to {limits.memory_mb} (or -1), or restart it with rlvr sandbox serve --memory-mb {memory}")
    files = {}
    for path, encoded in request.files.items():
        if encoded is None:  # SandboxFusion skips these too
            continue
        try:
            files[path] = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise Refusal(f"files[{path!r}]: not base64; send base64.b64encode(content).decode()") from None
    try:
        for path in request.fetch_files:
            job_relative_path(path, f"fetch_files[{path!r}]")
        return ScriptJob(code=request.code, files=files, stdin=request.stdin, timeout=request.run_timeout,
                         fetch_files=request.fetch_files, memory_mb=memory, output_bytes=limits.output_bytes)
    except ConfigurationError as exc:
        raise Refusal(str(exc).replace("ScriptJob.", "")) from None


def to_response(result: ScriptResult) -> RunCodeResponse:
    """SandboxFusion's answer for a finished :class:`ScriptResult`."""
    files = {name: base64.b64encode(data).decode("ascii") for name, data in result.files.items()}
    if result.status == "error":
        message = result.stderr.replace("[sandbox] ", "").strip()
        return RunCodeResponse(status="SandboxError", message=message, run_result=CommandRunResult(
            status="Error", execution_time=result.duration_s, stderr=result.stderr))
    timed_out = result.status == "timeout"
    run = CommandRunResult(status="TimeLimitExceeded" if timed_out else "Finished",
                           execution_time=result.duration_s, return_code=result.return_code,
                           stdout=result.stdout, stderr=result.stderr)
    status = "Success" if result.return_code == 0 and not timed_out else "Failed"
    return RunCodeResponse(status=status, message="", run_result=run, files=files)


def refused(message: str) -> RunCodeResponse:
    """The answer to a request that cannot run: ``SandboxError`` with the reason, as SandboxFusion answers its own."""
    return RunCodeResponse(status="SandboxError", message=message)


async def run_code(request: RunCodeRequest, sandbox: Any, limits: Limits) -> RunCodeResponse:
    """Answer one ``/run_code`` request: check it, queue its program on the pool, and wait for its result there."""
    try:
        job = to_job(request, limits)
        future = sandbox.submit(job)
    except (Refusal, SandboxError) as exc:
        return refused(str(exc))
    try:
        result = await asyncio.wrap_future(future)
    except SandboxError as exc:
        return refused(str(exc))
    return to_response(result)


class Admission:
    """ASGI middleware: 401 without a valid key (when keys are set), 413 for a body over ``max_body_bytes``.

    A key is read from ``X-API-Key``, ``Authorization: Bearer``, or the query parameter ``api_key``: the last is what
    clients that send no headers of their own use (``SANDBOX_URL=http://HOST:8080/run_code?api_key=KEY``).
    ``GET /v1/ping`` is open, as a health check.
    """

    def __init__(self, app: Any, api_keys: Iterable[str], max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.app, self.max_body_bytes = app, max_body_bytes
        self._keys = [key.encode() for key in api_keys]

    def _key_ok(self, scope: dict[str, Any]) -> bool:
        if not self._keys or scope["path"] == "/v1/ping":
            return True
        headers = dict(scope.get("headers") or [])
        candidates = [headers.get(b"x-api-key", b"")]
        bearer = headers.get(b"authorization", b"")
        if bearer.lower().startswith(b"bearer "):
            candidates.append(bearer[7:].strip())
        candidates += [v.encode() for v in parse_qs(scope.get("query_string", b"").decode()).get("api_key", [])]
        return any(hmac.compare_digest(c, key) for c in candidates if c for key in self._keys)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self._key_ok(scope):
            await _reply(send, 401, {"detail": "missing or wrong API key: send it as X-API-Key, Authorization: "
                                               "Bearer, or ?api_key= in the URL"})
            return
        length = dict(scope.get("headers") or []).get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.max_body_bytes:
            await _reply(send, 413, {"detail": f"request body of {int(length)} bytes is over this server's "
                                               f"{self.max_body_bytes} bytes; send smaller files"})
            return
        await self.app(scope, receive, send)


async def _reply(send: Any, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def create_app(sandbox: Any, api_keys: Iterable[str] = (), limits: Limits | None = None) -> Any:
    """The ASGI app answering ``POST /run_code`` from ``sandbox`` (anything with ``submit(ScriptJob) -> Future``)."""
    from fastapi import FastAPI

    limits = limits or Limits()
    app = FastAPI(title="rlvr sandbox: SandboxFusion's /run_code", docs_url=None, redoc_url=None)

    @app.post("/run_code", response_model=RunCodeResponse)
    async def run_code_route(request: RunCodeRequest) -> RunCodeResponse:
        return await run_code(request, sandbox, limits)

    @app.get("/v1/ping")
    async def ping() -> str:
        return "pong"

    return Admission(app, api_keys)


def load_keys(keys_file: str | Path | None = None) -> list[str]:
    """The accepted keys: the lines of ``keys_file`` (``#`` starts a comment), else ``$RLVR_SANDBOX_API_KEY``
    (comma-separated); empty: the server is open (loopback only)."""
    if keys_file is not None:
        path = Path(keys_file).expanduser()
        if not path.is_file():
            raise ConfigurationError(f"--keys-file {str(path)!r} does not exist; write one key per line there")
        keys = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    else:
        keys = [k.strip() for k in os.environ.get(ENV_KEY, "").split(",")]
    keys = [k for k in keys if k]
    for key in keys:
        if len(key) < 16:
            raise ConfigurationError(f"API key {key[:4]!r}... is shorter than 16 characters; generate one with "
                                     "`python -c \"import secrets; print(secrets.token_urlsafe(24))\"`")
    return keys


def default_import_paths() -> list[str]:
    """Folders programs may import from beyond the standard library: numpy's site-packages, when numpy is installed
    (tinker-cookbook's test harness imports it), else none."""
    try:
        import numpy
    except ImportError:
        return []
    return [str(Path(numpy.__file__).resolve().parent.parent)]


def serve(host: str = "127.0.0.1", port: int = 8080, *, workers: int | None = None, memory_mb: int = 1024,
          max_run_timeout: float = 3600.0, import_paths: list[str] | None = None, keys_file: str | None = None,
          log_level: str = "info") -> None:
    """Run ``rlvr sandbox serve`` until interrupted: a pool of ``workers`` fork servers (default: the usable CPUs)
    behind SandboxFusion's ``/run_code``, on loopback unless ``host`` says otherwise (then a key is required)."""
    import uvicorn

    from rlvr.sandbox.executor import DEFAULT_PRELOAD, Sandbox

    keys = load_keys(keys_file)
    if not keys and host not in ("127.0.0.1", "localhost", "::1"):
        raise ConfigurationError(f"--host {host} without an API key would run anyone's code; set {ENV_KEY} (or "
                                 "--keys-file), or bind 127.0.0.1")
    paths = default_import_paths() if import_paths is None else import_paths
    preload = DEFAULT_PRELOAD + (("numpy",) if any((Path(p) / "numpy").is_dir() for p in paths) else ())
    limits = Limits(max_run_timeout=max_run_timeout, memory_mb=memory_mb)
    with Sandbox(num_workers=workers, timeout=10.0, memory_mb=memory_mb, extra_paths=paths, preload=preload) as pool:
        log.info("rlvr sandbox serve: %d fork servers, layers %s", pool.num_workers,
                 ", ".join(name for name, layer in pool.layers.items() if layer.get("active")))
        uvicorn.run(create_app(pool, keys, limits), host=host, port=port, log_level=log_level)
