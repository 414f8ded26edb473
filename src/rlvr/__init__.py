"""rlvr: reinforcement learning with verifiable rewards, speaking the Tinker training API, on your own machine.

    import rlvr
    from rlvr import types

    service_client = rlvr.ServiceClient()
    training_client = service_client.create_lora_training_client(base_model="smollm2-135m", rank=32)
"""

from typing import TYPE_CHECKING

from rlvr import startup
from rlvr.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ConfigurationError,
    InvalidDatumError,
    ModelLoadError,
    RlvrError,
    RunFileError,
    SamplingError,
    SandboxError,
    UnknownLossError,
)

if TYPE_CHECKING:
    from rlvr import types
    from rlvr.app.evaluation import evaluate
    from rlvr.app.run import resume, train
    from rlvr.app.sft import sft
    from rlvr.client import SamplingClient, ServiceClient, TrainingClient
    from rlvr.weights import export

startup.skip_the_last_collection()  # a process that loaded torch exits about a second sooner

# Imported on first use, so `import rlvr` (and the CLI's config checks) stay fast: torch loads with the clients.
_LAZY = {"types": "rlvr.types", "SamplingClient": "rlvr.client", "ServiceClient": "rlvr.client",
         "TrainingClient": "rlvr.client", "train": "rlvr.app.run", "evaluate": "rlvr.app.evaluation",
         "resume": "rlvr.app.run", "sft": "rlvr.app.sft", "export": "rlvr.weights"}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'rlvr' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(_LAZY[name])
    value = module if name == "types" else getattr(module, name)
    globals()[name] = value
    return value


__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "CheckpointNotFoundError",
    "ConfigurationError",
    "InvalidDatumError",
    "ModelLoadError",
    "RlvrError",
    "RunFileError",
    "SamplingClient",
    "SamplingError",
    "SandboxError",
    "ServiceClient",
    "TrainingClient",
    "UnknownLossError",
    "__version__",
    "evaluate",
    "export",
    "resume",
    "sft",
    "train",
    "types",
]
