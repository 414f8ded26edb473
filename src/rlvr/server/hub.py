"""The tokenizers of the models ``rlvr serve`` serves, as folders on disk and as a read-only view shaped like the
Hugging Face hub at ``/hf``.

The tinker SDK's ``TrainingClient.get_tokenizer`` loads the ``tokenizer_id`` that ``get_info`` names: the server
gives it ``TokenizerFolders.folder``, a local folder (``$RLVR_HOME/server/tokenizers/<name>``). The SDK's
``SamplingClient.get_tokenizer`` asks the server nothing: it calls ``AutoTokenizer.from_pretrained(<base model
name>)``, which looks the name up on the hub, where rlvr's names (``tiny``, ``smollm2-135m``) are not repositories.
With ``HF_ENDPOINT=http://HOST:PORT/hf`` and ``HF_TOKEN=<the API key>`` in the SDK's environment, that lookup comes
here instead and finds the same folder's files.

Served, for the base models of the caller's own samplers and training clients only (nothing is loaded on request):
``GET /hf/api/models/<repo>[/revision/<rev>]`` (model info), ``GET /hf/api/models/<repo>/tree/<rev>[/<path>]``
(file listing), ``GET|HEAD /hf/<repo>/resolve/<rev>/<file>`` (one file, with the ``X-Repo-Commit`` and ``ETag``
headers the hub client checks). Every revision names the current files; the commit id is a digest of them. A missing
file is 404 with ``X-Error-Code: EntryNotFound`` (the hub client then tries its next candidate file), an unknown
repository 404 with ``RepoNotFound`` and a message naming the models served to this key.

Not here: model weights or configs (only tokenizer files are served), uploads, the rest of the hub's API.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from rlvr.fileio import atomic_folder
from rlvr.model_names import unaliased
from rlvr.server.auth import HUB_PREFIX
from rlvr.server.state import ServerState

__all__ = ["TokenizerFolders", "add_hub_routes"]



class TokenizerFolders:
    """Each model's tokenizer, saved once per server in ``$RLVR_HOME/server/tokenizers/<name>``."""

    def __init__(self) -> None:
        self._folders: dict[str, Path] = {}
        self._listings: dict[str, tuple[dict[str, Path], str]] = {}
        self._lock = threading.Lock()

    def folder(self, name: str, tokenizer: Callable[[], Any]) -> Path:
        """The folder holding ``name``'s tokenizer, written from ``tokenizer()`` the first time it is asked for."""
        from rlvr.home import rlvr_home

        with self._lock:
            if name not in self._folders:
                folder = rlvr_home() / "server" / "tokenizers" / re.sub(r"[^A-Za-z0-9._-]+", "_", name)
                with atomic_folder(folder) as temp:  # a reader sees the old folder or the new one, never half
                    tokenizer().save_pretrained(str(temp))
                self._folders[name] = folder
            return self._folders[name]

    def listing(self, name: str, tokenizer: Callable[[], Any]) -> tuple[dict[str, Path], str]:
        """The files of ``name``'s tokenizer folder (relative name -> path) and their commit id, computed once: this
        server writes the folder once."""
        folder = self.folder(name, tokenizer)
        with self._lock:
            if name not in self._listings:
                files = {str(f.relative_to(folder)): f for f in sorted(folder.rglob("*")) if f.is_file()}
                self._listings[name] = files, _commit(files)
            return self._listings[name]


def _commit(files: dict[str, Path]) -> str:
    """A 40-hex commit id that changes when any file does (the hub client caches by it)."""
    digest = hashlib.sha1(usedforsecurity=False)
    for name, path in files.items():
        digest.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _not_found(code: str, message: str) -> Response:
    """A 404 as the hub answers it: the hub client reads ``X-Error-Code`` (and shows ``X-Error-Message``)."""
    header = re.sub(r"[^\x20-\x7e]", "?", message)  # a header holds printable ASCII only, whatever the path held
    return JSONResponse({"error": message}, status_code=404, headers={"X-Error-Code": code, "X-Error-Message": header})


def add_hub_routes(app: FastAPI, state: ServerState, folders: TokenizerFolders,
                   owner: Callable[[Request], str]) -> None:
    """Register the ``/hf`` routes on ``app``."""

    def served(request: Request) -> dict[str, Callable[[], Any]]:
        """The caller's base model names (as the SDK may spell them) -> how to get each one's tokenizer."""
        who = owner(request)
        found: dict[str, Callable[[], Any]] = {}
        for sampler in list(state.samplers.values()):  # a copy: other threads add samplers
            if sampler.owner == who:
                found.setdefault(sampler.base_model, sampler.client.get_tokenizer)
        for model in list(state.models.values()):
            if model.owner == who and model.client is not None and model.base_model:
                found.setdefault(model.base_model, model.client.get_tokenizer)
        return found

    def repository(request: Request, repo: str) -> tuple[dict[str, Path], str] | Response:
        models = served(request)
        name = next((m for m in models if unaliased(m) == unaliased(repo)), None)
        if name is None:
            return _not_found("RepoNotFound", f"rlvr serve has no model {repo!r} for this API key; it serves the "
                                              f"tokenizers of the base models of your samplers and training clients "
                                              f"({', '.join(sorted(models)) or 'none yet'}): create a sampling client "
                                              "on the model first")
        return folders.listing(unaliased(name), models[name])

    @app.api_route(HUB_PREFIX + "/{rest:path}", methods=["GET", "HEAD"])
    def hub(rest: str, request: Request) -> Response:  # a plain function: FastAPI runs it off the event loop
        if rest.startswith("api/models/"):
            match = re.fullmatch(r"api/models/(.+?)(?:/(tree|revision)/([^/]+)(?:/(.*))?)?", rest, re.DOTALL)
            repo, kind, _, sub = match.groups() if match else (rest, None, None, None)
            found = repository(request, repo)
            if isinstance(found, Response):
                return found
            files, commit = found
            if kind == "tree":  # list_repo_tree: the files (and folders) under sub
                prefix = f"{sub.strip('/')}/" if sub and sub.strip("/") else ""
                inside = {n: f for n, f in files.items() if n.startswith(prefix)}
                if prefix and not inside:
                    return _not_found("EntryNotFound", f"{repo} has no folder {sub!r}")
                return JSONResponse([{"type": "file", "path": n, "size": f.stat().st_size, "oid": commit}
                                     for n, f in inside.items()])
            return JSONResponse({"id": repo, "modelId": repo, "sha": commit, "private": False, "tags": [],
                                 "siblings": [{"rfilename": n} for n in files]})
        match = re.fullmatch(r"(.+?)/resolve/([^/]+)/(.+)", rest, re.DOTALL)
        if match is None:
            return _not_found("EntryNotFound", f"rlvr serve's hub view serves model info, file listings and "
                                               f"tokenizer files only, not /hf/{rest}")
        repo, _, file = match.groups()
        found = repository(request, repo)
        if isinstance(found, Response):
            return found
        files, commit = found
        if file not in files:
            return _not_found("EntryNotFound", f"{repo} has no file {file!r} (rlvr serves tokenizer files only)")
        data = files[file].read_bytes()
        headers = {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                   "Content-Length": str(len(data))}
        return Response(b"" if request.method == "HEAD" else data, headers=headers,
                        media_type="application/octet-stream")
