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
    ├── SamplingError (RuntimeError)        a sampler that cannot serve a request (stale weights, bad prompt)
    ├── RewardError (RuntimeError)          a reward could not score a response (raised, non-finite, no sandbox)
    │   └── RewardTimeoutError (TimeoutError)
    ├── UnknownRewardError (ConfigurationError, KeyError)   a reward name that is not registered
    ├── SandboxError (RuntimeError)         the code sandbox could not run a job (not: the job failed its tests)
    └── WorkerLostError (RuntimeError)      a Ray actor died and its work could not be completed
"""

from __future__ import annotations


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
