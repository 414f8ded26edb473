"""Training runs and their checkpoints as the SDK's ``RestClient`` sees them: listing, lookup, deletion, publishing,
time-to-live, and the files a download serves.

Runs are the live models of this server plus the run folders under ``$RLVR_HOME/checkpoints`` (earlier processes).
A run is named by rlvr's run id (``run-...``, the one in ``tinker://`` paths) or by the model id the SDK hands out
(``session-...:train:N``); both lead to the same folder. A run created through this server by one key is hidden from
other keys; runs found only on disk are visible to every key.

Checkpoint metadata the engine's format has no place for (published, expiry) lives beside the checkpoints in
``$RLVR_HOME/checkpoints/.server-meta.json``, keyed by ``<run>/<kind>/<name>``. Expiry is enforced on every catalog
access and before any load through the server (``sweep``): an expired checkpoint is deleted.

Not here: HTTP (``routes/rest.py``, ``routes/training.py``), the checkpoint format itself (``rlvr.engine.checkpoint``).
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tinker import types

from rlvr.fileio import atomic_folder, write_atomic
from rlvr.server.state import ServerState, UnknownId
from rlvr.server.wire import BadRequest

__all__ = ["KINDS", "Catalog"]

log = logging.getLogger("rlvr.server")

KINDS = {"weights": "training", "sampler_weights": "sampler", "external_weights": "external"}
"""Checkpoint folder kind -> the SDK's ``checkpoint_type``."""


class Catalog:
    """The RestClient's view of runs and checkpoints, over one ``ServerState``."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self._lock = threading.Lock()

    # -- ids --------------------------------------------------------------------------------------------------------

    @staticmethod
    def root() -> Path:
        from rlvr.home import checkpoint_root

        return checkpoint_root()

    def run_id(self, run_or_model_id: str, owner: str) -> str:
        """rlvr's run id for ``run_or_model_id`` (a run id, or a model id this server handed out to ``owner``)."""
        run = self.state.run_of_model.get(run_or_model_id, run_or_model_id)
        live = run in self.state.run_owners
        if ("/" in run or run.startswith(".") or not run or self.state.run_owners.get(run, owner) != owner
                or not (live or (self.root() / run).is_dir())):
            raise UnknownId(f"training_run_id {run_or_model_id!r} is unknown; use a model_id from create_model or a "
                            "run id from /api/v1/training_runs")
        return run

    def folder(self, run_or_model_id: str, kind: str, name: str, owner: str) -> Path:
        """The folder of an existing checkpoint, or UnknownId naming it."""
        self.sweep()
        run = self.run_id(run_or_model_id, owner)
        target = self.root() / run / kind / name
        if kind not in KINDS or not name or "/" in name or name.startswith(".") or not (
                target / "rlvr.json").exists():
            raise UnknownId(f"checkpoint {kind}/{name} of run {run_or_model_id!r} does not exist; checkpoint ids "
                            "look like weights/<name>, sampler_weights/<name> or external_weights/<name>")
        return target

    def folder_of_path(self, tinker_path: str, owner: str) -> Path:
        """The folder of the checkpoint a ``tinker://`` (or ``rlvr://``) path names."""
        for scheme in ("tinker://", "rlvr://"):
            if tinker_path.startswith(scheme):
                parts = tinker_path[len(scheme):].split("/")
                if len(parts) == 3:
                    return self.folder(parts[0], parts[1], parts[2], owner)
        raise UnknownId(f"tinker_path {tinker_path!r} must look like tinker://<run>/<kind>/<name>, kind one of "
                        f"{', '.join(KINDS)}")

    # -- metadata (published, expiry) -------------------------------------------------------------------------------

    def _meta_file(self) -> Path:
        return self.root() / ".server-meta.json"

    def _read_meta(self) -> dict[str, dict[str, Any]]:
        try:
            return json.loads(self._meta_file().read_text())
        except FileNotFoundError:
            return {}

    def _update_meta(self, key: str, **changes: Any) -> None:
        with self._lock:
            meta = self._read_meta()
            entry = {**meta.get(key, {}), **changes}
            meta[key] = {k: v for k, v in entry.items() if v is not None and v is not False}
            if not meta[key]:
                del meta[key]
            self._meta_file().parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self._meta_file(), json.dumps(meta, indent=1, sort_keys=True))

    @staticmethod
    def _key(folder: Path) -> str:
        return "/".join(folder.parts[-3:])

    def set_public(self, folder: Path, public: bool) -> None:
        self._update_meta(self._key(folder), public=public)

    @staticmethod
    def check_ttl(ttl_seconds: int | None) -> None:
        """Refuse a TTL that is not a positive whole number of seconds (None, no expiry, is fine)."""
        if ttl_seconds is not None and (not isinstance(ttl_seconds, int) or ttl_seconds < 1):
            raise BadRequest(f"ttl_seconds={ttl_seconds!r} must be a positive integer, or null for no expiry")

    def set_ttl(self, folder: Path, ttl_seconds: int | None) -> None:
        """Expire the checkpoint ``ttl_seconds`` from now (None: never)."""
        self.check_ttl(ttl_seconds)
        self._update_meta(self._key(folder), expires_at=None if ttl_seconds is None else time.time() + ttl_seconds)

    def sweep(self) -> list[str]:
        """Delete every checkpoint whose TTL has run out; returns their ``<run>/<kind>/<name>`` keys."""
        now = time.time()
        with self._lock:
            meta = self._read_meta()
            expired = [k for k, v in meta.items() if v.get("expires_at") is not None and v["expires_at"] <= now]
            if not expired:
                return []
            for key in expired:
                shutil.rmtree(self.root() / key, ignore_errors=True)
                del meta[key]
                log.info("checkpoint %s expired (its TTL ran out) and was deleted", key)
            write_atomic(self._meta_file(), json.dumps(meta, indent=1, sort_keys=True))
        return expired

    # -- listing ----------------------------------------------------------------------------------------------------

    def checkpoints(self, run_or_model_id: str, owner: str) -> list[types.Checkpoint]:
        self.sweep()
        run = self.run_id(run_or_model_id, owner)
        meta = self._read_meta()
        out = []
        for kind, label in KINDS.items():
            folder = self.root() / run / kind
            for ckpt in sorted(folder.glob("[!.]*")) if folder.is_dir() else []:
                if not (ckpt / "rlvr.json").exists():
                    continue
                extra = meta.get(self._key(ckpt), {})
                expires = extra.get("expires_at")
                out.append(types.Checkpoint(
                    checkpoint_id=f"{kind}/{ckpt.name}", checkpoint_type=label,  # type: ignore[arg-type]
                    time=datetime.fromtimestamp(ckpt.stat().st_mtime, UTC),
                    tinker_path=f"tinker://{run}/{kind}/{ckpt.name}",
                    size_bytes=sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file()),
                    public=bool(extra.get("public")),
                    expires_at=None if expires is None else datetime.fromtimestamp(expires, UTC)))
        return sorted(out, key=lambda c: c.time)

    def run(self, run_or_model_id: str, owner: str) -> types.TrainingRun:
        run = self.run_id(run_or_model_id, owner)
        live = next((m for m in self.state.models.values() if m.client is not None and m.client.model_id == run),
                    None)
        ckpts = self.checkpoints(run, owner)
        if live is not None:
            info = live.client.get_info()  # type: ignore[union-attr]
            base, rank, when = info.model_name or "", info.lora_rank, live.last_request_time
            metadata = {str(k): str(v) for k, v in (live.user_metadata or {}).items()} or None
        else:
            metas = [json.loads(p.read_text()) for p in (self.root() / run).glob("*/*/rlvr.json")]
            base = metas[0]["base_model"] if metas else ""
            rank = metas[0]["lora"].get("rank") if metas else None
            when = (self.root() / run).stat().st_mtime if (self.root() / run).is_dir() else time.time()
            metadata = None
        last = {t: next((c for c in reversed(ckpts) if c.checkpoint_type == t), None) for t in ("training", "sampler")}
        return types.TrainingRun(training_run_id=run_or_model_id, base_model=base, model_owner=owner, is_lora=True,
                                 lora_rank=rank, last_request_time=datetime.fromtimestamp(when, UTC),
                                 last_checkpoint=last["training"], last_sampler_checkpoint=last["sampler"],
                                 user_metadata=metadata)

    def runs(self, owner: str) -> list[str]:
        self.sweep()
        root = self.root()
        ids = {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")} if root.is_dir() else set()
        ids |= set(self.state.run_owners)
        return sorted(r for r in ids if self.state.run_owners.get(r, owner) == owner)

    def weights_info(self, tinker_path: str, owner: str) -> types.WeightsInfoResponse:
        folder = self.folder_of_path(tinker_path, owner)
        meta = json.loads((folder / "rlvr.json").read_text())
        lora = meta.get("lora", {})
        return types.WeightsInfoResponse(base_model=meta["base_model"], is_lora=True, lora_rank=lora.get("rank"),
                                         train_mlp=lora.get("train_mlp"), train_attn=lora.get("train_attn"),
                                         train_unembed=lora.get("train_unembed"))

    def delete(self, run_or_model_id: str, kind: str, name: str, owner: str) -> None:
        folder = self.folder(run_or_model_id, kind, name, owner)
        shutil.rmtree(folder)
        self._update_meta(self._key(folder), public=None, expires_at=None)

    def export(self, sampler_path: str, name: str, ttl_seconds: int | None) -> Path:
        """Move the sampler checkpoint just saved at ``sampler_path`` to ``<run>/external_weights/<name>`` (an
        existing export of that name is replaced whole), its adapter_config.json as a PEFT adapter folder's
        (``engine.export.write_adapter_config``), and give it ``ttl_seconds``; returns its folder."""
        from rlvr.engine.checkpoint import read_meta
        from rlvr.engine.export import write_adapter_config
        from rlvr.home import resolve

        source = resolve(sampler_path)
        target = source.parent.parent / "external_weights" / name
        try:
            with atomic_folder(target) as tmp:
                shutil.copytree(source, tmp, dirs_exist_ok=True)
                # a PEFT adapter folder other tools load (tinker-cookbook's weights.build_*, vLLM): the base named
                # where they find it; rlvr reads its own rlvr.json
                write_adapter_config(source / "adapter_config.json", tmp / "adapter_config.json",
                                     read_meta(sampler_path)[1]["base_model"])
        finally:
            shutil.rmtree(source, ignore_errors=True)
        self._update_meta(self._key(target), public=None, expires_at=None)
        if ttl_seconds is not None:
            self.set_ttl(target, ttl_seconds)
        return target

    @staticmethod
    def files(folder: Path) -> list[str]:
        """The checkpoint's files, relative to its folder, in a stable order."""
        return sorted(str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file())
