"""The exceptions rlvr raises, one small hierarchy.

Every error names the field or input at fault, the value it got, and what to do instead. Each class also
subclasses the standard-library error it stands for, so ``except ValueError`` keeps working.

    RlvrError
    ├── ConfigurationError (ValueError)     a setting or argument that cannot work
    │   └── UnknownLossError (KeyError)     a loss name not in the loss table
    ├── InvalidDatumError (ValueError)      a Datum, ModelInput or tensor that does not fit the model or the loss
    ├── ModelLoadError (RuntimeError)       a base model that cannot be found, fetched or converted
    ├── CheckpointError (RuntimeError)      a checkpoint that cannot be written or read
    │   └── CheckpointNotFoundError (FileNotFoundError)
    ├── RunFileError (ValueError)           a run file rlvr wrote (metrics, rollouts, checkpoints.jsonl) that no
    │                                       longer parses
    ├── StorageError (OSError)              a file or folder that could not be written or read: disk full,
    │                                       permission denied, read-only filesystem (``errno`` kept)
    ├── SamplingError (RuntimeError)        a sampler that cannot serve a request (stale weights, bad prompt)
    ├── RewardError (RuntimeError)          a reward could not score a response (raised, non-finite, no sandbox)
    │   └── RewardTimeoutError (TimeoutError)
    ├── UnknownRewardError (ConfigurationError, KeyError)   a reward name that is not registered
    ├── SandboxError (RuntimeError)         the code sandbox could not run a job (not: the job failed its tests)
    └── WorkerLostError (RuntimeError)      a Ray actor died and its work could not be completed

    KeyboardInterrupt
    └── RunInterrupted                      a run stopped by SIGTERM or Ctrl-C (a BaseException, as Ctrl-C is, so
                                            no ``except Exception`` swallows it)
"""

from __future__ import annotations

import errno
import signal
from pathlib import Path


class RlvrError(Exception):
    """Base class of every error rlvr raises on purpose."""


class ConfigurationError(RlvrError, ValueError):
    """A setting or argument that cannot work; the message names the field, the value and the fix."""


class ContextFullError(ConfigurationError):
    """A prompt fills the model's whole context: no token is left to sample."""


class UnknownLossError(ConfigurationError, KeyError):
    """A ``loss_fn`` name that is not in ``rlvr.engine.train.losses.LOSSES``."""

    def __str__(self) -> str:  # KeyError would wrap the message in quotes
        return str(self.args[0]) if self.args else ""


class InvalidDatumError(RlvrError, ValueError):
    """A training datum or prompt that does not fit the model or the loss."""


class ModelLoadError(RlvrError, RuntimeError):
    """A base model that cannot be found, fetched or converted."""


class CheckpointError(RlvrError, RuntimeError):
    """A checkpoint that cannot be written or read."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint path that does not exist."""


class RunFileError(RlvrError, ValueError):
    """A run file rlvr wrote (JSON Lines of metrics, rollouts or checkpoints) that no longer parses."""


class SamplingError(RlvrError, RuntimeError):
    """A sampler that cannot serve a request."""


class SandboxError(RlvrError, RuntimeError):
    """The code sandbox could not run a job at all (distinct from a job that failed or timed out)."""


class RewardError(RlvrError, RuntimeError):
    """A reward could not score a response: it raised, returned something that is not a finite number, or the
    machinery behind it (the code sandbox) could not run. The batch scorer counts these; it never scores them 0."""


class RewardTimeoutError(RewardError, TimeoutError):
    """A reward ran out of time on one response."""


class UnknownRewardError(ConfigurationError, KeyError):
    """A reward name that is not registered; the message lists the registered names and the nearest match."""

    def __str__(self) -> str:  # KeyError would wrap the message in quotes
        return str(self.args[0]) if self.args else ""


class WorkerLostError(RlvrError, RuntimeError):
    """A distributed worker (a Ray actor) died and its work could not be completed: its restarts were used up, or
    it was the trainer, whose unsaved state no restart brings back (resume from the last checkpoint)."""


_STORAGE_FIXES = {
    errno.ENOSPC: "the disk is full: free space on it, or give the run a folder on another disk (out=...; "
                  "RLVR_HOME=... for models and checkpoints saved outside runs)",
    errno.EDQUOT: "the disk quota is used up: free space in it, or give the run a folder elsewhere (out=...)",
    errno.EACCES: "permission denied: make the folder writable by this user, or choose another one (out=...)",
    errno.EPERM: "permission denied: make the folder writable by this user, or choose another one (out=...)",
    errno.EROFS: "the filesystem is read-only: choose a writable folder (out=...; RLVR_HOME=... for models and "
                 "checkpoints saved outside runs)",
    errno.EIO: "the disk reported an I/O error: check it (dmesg), or write to another one (out=...)",
    errno.EFBIG: "the file is larger than this filesystem allows: write to another one (out=...)",
}
STORAGE_ERRNOS = frozenset(_STORAGE_FIXES)
"""The errors of the disk rather than of the program: what :class:`StorageError` stands for."""


class StorageError(RlvrError, OSError):
    """A file or folder rlvr writes or reads could not be: the disk is full, permission is denied, the filesystem is
    read-only. One line names the path, what failed and the fix; ``errno`` and ``filename`` are the original's.

        raise StorageError.of(exc, "write checkpoint", folder) from exc
    """

    def __init__(self, code: int | None, message: str, filename: str | None = None) -> None:
        super().__init__(code, message, filename)
        self.message = message

    def __str__(self) -> str:
        return self.message

    @classmethod
    def of(cls, exc: OSError, action: str, path: str | Path | None = None) -> StorageError:
        """The StorageError for ``exc`` raised while doing ``action`` (e.g. ``"write checkpoint"``) on ``path``."""
        where = path if path is not None else exc.filename
        reason = exc.strerror or str(exc)
        code = errno.errorcode.get(exc.errno, "") if exc.errno else ""
        fix = _STORAGE_FIXES.get(exc.errno, "see the message above")
        return cls(exc.errno, f"could not {action} {where}: {reason}{f' ({code})' if code else ''}; {fix}",
                   str(where) if where is not None else None)

    @staticmethod
    def stands_for(exc: BaseException) -> bool:
        """Whether ``exc`` is an OSError of the disk (full, read-only, permission) that a StorageError describes."""
        return isinstance(exc, OSError) and not isinstance(exc, StorageError) and exc.errno in STORAGE_ERRNOS


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by a signal (SIGTERM, Ctrl-C): ``signum`` the signal, ``step`` the step its last checkpoint
    reached (None: not known here), ``exit_code`` 128 + the signal, as shells report a process a signal ended."""

    def __init__(self, signum: int, step: int | None = None, message: str = "") -> None:
        super().__init__(message or f"stopped by {signal.Signals(signum).name}")
        self.signum, self.step = signum, step

    @property
    def exit_code(self) -> int:
        return 128 + self.signum
