"""rlvr: reinforcement learning with verifiable rewards, speaking the Tinker training API, on your own machine.

    import rlvr
    from rlvr import types

    service_client = rlvr.ServiceClient()
    training_client = service_client.create_lora_training_client(base_model="smollm2-135m", rank=32)
"""

from rlvr import types
from rlvr.client import SamplingClient, ServiceClient, TrainingClient
from rlvr.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ConfigurationError,
    InvalidDatumError,
    ModelLoadError,
    RlvrError,
    SamplingError,
    SandboxError,
    UnknownLossError,
)

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "CheckpointNotFoundError",
    "ConfigurationError",
    "InvalidDatumError",
    "ModelLoadError",
    "RlvrError",
    "SamplingClient",
    "SamplingError",
    "SandboxError",
    "ServiceClient",
    "TrainingClient",
    "UnknownLossError",
    "__version__",
    "types",
]
