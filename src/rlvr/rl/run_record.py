"""The run record: one object per run folder that owns its lifecycle files, for the RL loop, the warm-up before RL
and ``rlvr sft`` alike.

    record = RunRecord(run_dir)
    record.write_config(config, "rl", numerics={"precision": "float32"})   # config.yaml, atomically
    resumed = record.resume_point("rl", config.steps)                     # None: a fresh run
    client = record.open_client(service, resumed, base_model=..., rank=..., seed=...)
    record.save(client, "rl", step=3, final=False, keep=2, rng=rng)       # state, entry, pruning in one call

What a run folder holds:
- ``config.yaml``: the resolved settings, plus ``kind`` (``rl`` or ``sft``: what ``rlvr resume`` continues) and
  ``numerics`` (what the run computes in; recorded in every checkpoint entry too). Folders written before these keys
  existed still read: the kind is guessed as it was (a config without ``recipe`` is an sft run), the numerics taken
  from the recorded ``precision``.
- ``checkpoints.jsonl`` (the loop's or sft's states) and ``warmup_checkpoints.jsonl`` (the warm-up's): one
  :class:`Checkpoint` per line, written by ``rl/checkpoints.py`` (atomic state, then a durable line; a torn last
  line is skipped). Entries written before ``kind`` was recorded read as the kind of their file (``rl``,
  ``warmup``); keys are only ever added, so older readers keep reading newer files.
- the states themselves, in ``checkpoints/`` (:meth:`RunRecord.open_client` makes the folder own them), pruned to
  ``keep`` after each save (the newest and the final ones always stay).
- ``summary.json``: the held-out evaluations of the run's stages (``baseline``, ``after_warmup``, ``after``).

Invariants: an entry is recorded only after its state is complete; a resume starts from the newest entry of its
kind, with the state, the optimizer and (for the loop) the RNG it had; every entry goes through :meth:`RunRecord.save`,
which prunes that kind's states. Not here: ``status.json`` and the clean stop (``rlvr.app.status``), the loop's rows
and rollout pages (``tracking.py``, ``rollout_log.py``), what a state holds (``rlvr.engine.checkpoint``).
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from rlvr.errors import ConfigurationError, RunFileError
from rlvr.fileio import write_atomic
from rlvr.rl import checkpoints
from rlvr.rl.auxiliary import AuxiliaryOutputs

__all__ = ["CONFIG", "ENTRY_KINDS", "RECORD_KEYS", "RUN_KINDS", "SUMMARY", "Checkpoint", "RunRecord",
           "settings_only", "state_name"]

RunKind = Literal["rl", "sft"]
EntryKind = Literal["rl", "warmup", "sft"]
RUN_KINDS: tuple[RunKind, ...] = ("rl", "sft")
ENTRY_KINDS: tuple[EntryKind, ...] = ("rl", "warmup", "sft")
CONFIG = "config.yaml"
SUMMARY = "summary.json"
RECORD_KEYS = ("kind", "numerics")
"""The keys the run record adds to ``config.yaml`` beside the settings."""
_FILES: dict[str, str] = {"rl": checkpoints.FILENAME, "sft": checkpoints.FILENAME, "warmup": checkpoints.WARMUP}
"""Which checkpoint list each kind of entry goes to."""
_UNTYPED: dict[str, EntryKind] = {checkpoints.FILENAME: "rl", checkpoints.WARMUP: "warmup"}
"""The kind of a list's entries that do not name one (written before kinds were; sft's always named theirs)."""
_STATE_PREFIXES = {"rl": "step", "warmup": "warmup", "sft": "sft"}


@dataclass(frozen=True)
class Checkpoint:
    """One recorded checkpoint: a line of ``checkpoints.jsonl`` or ``warmup_checkpoints.jsonl``."""

    kind: EntryKind
    """``rl`` (the loop), ``warmup`` (the supervised warm-up before RL) or ``sft`` (``rlvr sft``)."""
    step: int
    """Steps done when it was saved: the step a resume continues from."""
    state_path: str
    """The state (weights, AdamW, engine RNG) as ``save_state`` named it, or the run folder's own copy of it when
    the folder moved since (what loads)."""
    final: bool = False
    """Saved at the end of its phase: never pruned."""
    rng: list | None = None
    """The loop's ``random.Random`` state in its JSON form (``rl`` entries; None for the others)."""
    numerics: dict[str, Any] | None = None
    """What the run computed in when it was saved (``{"precision": ...}``); None in entries from before."""

    def to_json(self) -> dict[str, Any]:
        """The entry as its JSONL line holds it (``final`` only when true, optional fields only when set, as before
        these entries were typed)."""
        entry: dict[str, Any] = {"step": self.step, "state_path": self.state_path}
        if self.rng is not None:
            entry["rng"] = self.rng
        if self.final:
            entry["final"] = True
        entry["kind"] = self.kind
        if self.numerics is not None:
            entry["numerics"] = self.numerics
        return entry

    @classmethod
    def from_json(cls, entry: dict[str, Any], kind: EntryKind) -> Checkpoint:
        """An entry read from a checkpoint list whose entries are ``kind`` when they do not say (older files)."""
        try:
            return cls(kind=entry.get("kind", kind), step=int(entry["step"]), state_path=str(entry["state_path"]),
                       final=bool(entry.get("final", False)), rng=entry.get("rng"), numerics=entry.get("numerics"))
        except (KeyError, TypeError, ValueError) as exc:
            raise RunFileError(f"checkpoint entry {entry!r:.200} lacks a valid {exc}; it was not written by rlvr, "
                               "or was edited: remove the line to resume from the entry before it") from None

    def random_state(self) -> tuple:
        """The loop's RNG state, for ``random.Random.setstate`` (its JSON form's lists back to tuples)."""
        if self.rng is None:
            raise RunFileError(f"checkpoint {self.state_path} (kind {self.kind}, step {self.step}) records no loop "
                               "RNG; only the RL loop's entries have one")
        version, internal, gauss = self.rng
        return version, tuple(internal), gauss


def state_name(kind: EntryKind, step: int, final: bool = False) -> str:
    """The name a state is saved as: ``step-000012`` (the loop), ``warmup-000012``, ``sft-000012`` (``sft-final``
    at the end of an sft run)."""
    if kind == "sft" and final:
        return "sft-final"
    return f"{_STATE_PREFIXES[kind]}-{step:06d}"


def settings_only(values: dict[str, Any]) -> dict[str, Any]:
    """A ``config.yaml``'s values without the keys the run record adds (``RECORD_KEYS``): the settings alone."""
    return {key: value for key, value in values.items() if key not in RECORD_KEYS}


class RunRecord:
    """A run folder's config, checkpoint lists and summary (see the module docstring). It keeps nothing the files
    do not: two records of one folder (the run application's and the loop's) agree.

    ``auxiliary``: where a failure to prune is counted (and logged) instead of raised; pruning frees disk, so a run
    goes on without it. The loop passes its own, so the failures show in ``aux/failures``."""

    def __init__(self, run_dir: str | Path, auxiliary: AuxiliaryOutputs | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.auxiliary = auxiliary if auxiliary is not None else AuxiliaryOutputs()
        self._numerics: dict[str, Any] | None = None

    # -- config.yaml -------------------------------------------------------------------------------------------------

    def write_config(self, config: Any, kind: RunKind, numerics: dict[str, Any] | None = None) -> None:
        """Write ``config`` (a dataclass) as ``config.yaml``, atomically, with the run's ``kind`` and ``numerics``
        (recorded in every checkpoint saved from now on)."""
        if kind not in RUN_KINDS:
            raise ValueError(f"kind={kind!r}: a run is one of {RUN_KINDS}")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        values = {"kind": kind, **dataclasses.asdict(config)}
        if numerics is not None:
            values["numerics"] = numerics
        write_atomic(self.run_dir / CONFIG, yaml.safe_dump(values, sort_keys=False))
        self._numerics = numerics

    def config_values(self) -> dict[str, Any]:
        """``config.yaml`` as written, record keys included (empty when the folder has none yet)."""
        path = self.run_dir / CONFIG
        if not path.is_file():
            return {}
        try:
            values = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise RunFileError(f"{path} is not valid YAML ({exc}); it was edited by hand: fix it, or start a new "
                               "run") from None
        if not isinstance(values, dict):
            raise RunFileError(f"{path}: expected a mapping of settings at the top level; fix it, or start a new run")
        return values

    def settings(self) -> dict[str, Any]:
        """The run's settings from ``config.yaml`` (without the record's own keys); an error when it has none."""
        if not (self.run_dir / CONFIG).is_file():
            raise ConfigurationError(f"{self.run_dir} is not a run folder (no config.yaml); `rlvr runs` lists the "
                                     "runs")
        return settings_only(self.config_values())

    @property
    def kind(self) -> RunKind:
        """``rl`` or ``sft``, as ``config.yaml`` records it; for a folder from before it was recorded, ``rl`` when
        its config has RL settings (``recipe``, ``group_size``) and ``sft`` otherwise."""
        values = self.config_values()
        kind = values.get("kind")
        if kind is None:  # an RL run's config has a recipe (rlvr train) or a group size (the loop alone)
            return "rl" if "recipe" in values or "group_size" in values else "sft"
        if kind not in RUN_KINDS:
            raise RunFileError(f"{self.run_dir / CONFIG}: kind={kind!r} is not one of {RUN_KINDS}; it was edited by "
                               "hand: set it back")
        return kind

    @property
    def numerics(self) -> dict[str, Any] | None:
        """What the run computes in: as last written by :meth:`write_config`, else as ``config.yaml`` records it
        (``{"precision": ...}`` for a folder from before ``numerics`` was recorded), else None."""
        if self._numerics is not None:
            return self._numerics
        values = self.config_values()
        if values.get("numerics") is not None:
            return values["numerics"]
        return {"precision": values["precision"]} if values.get("precision") else None

    # -- checkpoints -------------------------------------------------------------------------------------------------

    def checkpoints(self, kind: EntryKind) -> list[Checkpoint]:
        """Every complete entry of ``kind``, oldest first (their paths as recorded)."""
        entries = checkpoints.read_checkpoints(self.run_dir, _FILES[kind])
        typed = [Checkpoint.from_json(entry, _UNTYPED[_FILES[kind]]) for entry in entries]
        return [entry for entry in typed if entry.kind == kind]

    def last(self, kind: EntryKind) -> Checkpoint | None:
        """The newest complete entry of ``kind`` (None: none yet), its ``state_path`` one that loads (the run
        folder's own copy when the folder moved or ``$RLVR_HOME`` changed since)."""
        entries = self.checkpoints(kind)
        if not entries:
            return None
        entry = entries[-1]
        return dataclasses.replace(entry, state_path=checkpoints.loadable_path(self.run_dir, entry.state_path))

    def reached(self) -> Checkpoint | None:
        """What a stopped run reached: its newest loop or sft checkpoint, else its newest warm-up checkpoint, else
        None."""
        return self.last(self.kind) or self.last("warmup")

    def resume_point(self, kind: EntryKind, steps: int) -> Checkpoint | None:
        """The checkpoint a resume of ``kind`` continues from (None: none yet); an error when it is at ``steps``
        already, as nothing would remain to train."""
        last = self.last(kind)
        if last is not None and last.step >= steps:
            raise ConfigurationError(f"the last checkpoint in {self.run_dir} is at step {last.step} and steps="
                                     f"{steps}: nothing remains to train; raise steps to continue")
        return last

    def open_client(self, service: Any, resumed: Checkpoint | None, *, base_model: str, rank: int, seed: int,
                    start_from: str | None = None) -> Any:
        """The run's training client: ``resumed``'s state with its optimizer, else ``start_from``'s weights with a
        fresh optimizer, else a fresh LoRA; the run folder holds what it saves from now on."""
        if resumed is not None:
            client = service.create_training_client_from_state_with_optimizer(resumed.state_path)
        elif start_from:
            client = service.create_training_client_from_state(start_from)
        else:
            client = service.create_lora_training_client(base_model=base_model, rank=rank, seed=seed)
        checkpoints.own_checkpoints(self.run_dir, client)
        return client

    def save(self, training_client: Any, kind: EntryKind, step: int, *, final: bool = False, keep: int = 0,
             rng: random.Random | None = None) -> Checkpoint:
        """Save ``training_client``'s state after ``step`` steps of ``kind``, record it (with ``rng``'s state and
        the run's numerics), then delete the states of that kind ``keep`` no longer keeps (0: keep all; a failure
        to delete is counted in ``auxiliary`` and logged, and the run goes on). Returns the entry."""
        path = training_client.save_state(state_name(kind, step, final)).result().path
        entry = Checkpoint(kind=kind, step=step, state_path=path, final=final,
                           rng=None if rng is None else json.loads(json.dumps(rng.getstate())),
                           numerics=self.numerics)
        # Through the module's attribute, one call shape per list: the determinism tests wrap it to kill a run there.
        if _FILES[kind] == checkpoints.FILENAME:
            checkpoints.record_checkpoint(self.run_dir, entry.to_json())
        else:
            checkpoints.record_checkpoint(self.run_dir, entry.to_json(), _FILES[kind])
        self.auxiliary.run("checkpoint pruning", checkpoints.prune_checkpoints, self.run_dir, keep, _FILES[kind])
        return entry

    # -- summary.json ------------------------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """``summary.json`` (empty when the run has none yet)."""
        path = self.run_dir / SUMMARY
        if not path.is_file():
            return {}
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise RunFileError(f"{path} is not valid JSON ({exc}); delete it to have the run write it again") from None

    def write_summary(self, summary: dict[str, Any]) -> None:
        """Write ``summary.json`` atomically."""
        write_atomic(self.run_dir / SUMMARY, json.dumps(summary, indent=2))


def recorded_precision(run_dir: str | Path) -> str | None:
    """The precision a run folder records (None: no config yet, or one from before it was)."""
    return (RunRecord(run_dir).numerics or {}).get("precision")
