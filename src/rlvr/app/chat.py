"""Trying a run: ``rlvr sample`` (a prompt's answers from a run's checkpoint) and ``rlvr chat`` (a conversation with
it), on the engine, with no export.

    model = open_run_model("runs/gsm8k-20260101-120000")          # its last checkpoint; checkpoint="step-000010"
    print(sample(model, "What is 2 + 3?", n=4, temperature=0.7, max_tokens=64, seed=0))
    chat(model, sys.stdin, print)                                   # lines in, replies out; /exit or EOF ends it

What a run may be: what ``rlvr export`` takes (``weights.checkpoint_of``): a run folder or a run's name (its last
checkpoint), a checkpoint path or folder. ``checkpoint`` picks another: the name of one of the run's own checkpoints
(``step-000010``, as its ``checkpoints/weights/`` holds them), or any checkpoint path.

Prompts go through the model's chat template as user turns (``sample(raw=True)``: the text as it is); a chat sends
the whole conversation each turn, the replies included. The defaults come from the run's ``config.yaml``: its
``max_tokens`` (the token budget it trained with) and ``temperature``; 0 is greedy. The engine computes in the
precision the run recorded.

What it is not: an evaluation (``rlvr eval``), or a server (``rlvr serve`` has the OpenAI chat endpoint).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.errors import CheckpointNotFoundError, ConfigurationError
from rlvr.home import checkpoint_root

__all__ = ["EXIT", "RunModel", "chat", "open_run_model", "sample"]

EXIT = "/exit"
"""The line that ends a chat (as does the end of its input)."""
DEFAULT_MAX_TOKENS = 256
"""The token budget when the run records none (a checkpoint given by path)."""


@dataclass
class RunModel:
    """A run's checkpoint, loaded for sampling."""

    checkpoint: str
    """The state path it was loaded from."""
    sampler: Any
    """A SamplingClient with its weights."""
    tokenizer: Any
    max_tokens: int
    """The default budget of a reply: the run's ``max_tokens``."""
    temperature: float
    """The default sampling temperature: the run's."""


def open_run_model(run: str | Path, checkpoint: str | None = None) -> RunModel:
    """Load ``run``'s last checkpoint (or ``checkpoint``: see the module docstring) for sampling."""
    from rlvr.client import ServiceClient
    from rlvr.weights import checkpoint_of

    folder = _run_folder(run)
    config = _run_config(folder)
    if checkpoint is None:
        path = checkpoint_of(run)
    elif folder is not None and (folder / "checkpoints" / "weights" / checkpoint / "rlvr.json").is_file():
        path = str(folder / "checkpoints" / "weights" / checkpoint)
    else:
        try:
            path = checkpoint_of(checkpoint)
        except CheckpointNotFoundError:
            raise CheckpointNotFoundError(f"--checkpoint {checkpoint!r} is neither one of {run}'s checkpoints (see "
                                          f"its checkpoints/weights/) nor a checkpoint path or folder") from None
    from rlvr.numerics import ENVIRONMENT, Numerics

    # the run's own numerics settings (its config.yaml's; unset ones from the environment), as it trained
    service = ServiceClient(numerics=Numerics.resolve(**{name: config.get(name) for name in ENVIRONMENT}))
    training_client = service.create_training_client_from_state(path)
    return RunModel(path, training_client.save_weights_and_get_sampling_client(), training_client.get_tokenizer(),
                    int(config.get("max_tokens") or DEFAULT_MAX_TOKENS), float(config.get("temperature", 1.0)))


def sample(model: RunModel, prompt: str, n: int = 1, temperature: float | None = None, max_tokens: int | None = None,
           seed: int | None = None, raw: bool = False) -> list[str]:
    """``n`` answers to ``prompt`` (a user turn through the chat template; ``raw``: the text as it is)."""
    if raw:
        tokens = model.tokenizer.encode(prompt, add_special_tokens=False)
    else:
        tokens = _template(model.tokenizer, [{"role": "user", "content": prompt}])
    return _answers(model, tokens, n, temperature, max_tokens, seed)


def chat(model: RunModel, lines: Iterable[str], say: Callable[[str], None], temperature: float | None = None,
         max_tokens: int | None = None, seed: int | None = None,
         ask: Callable[[], None] | None = None) -> list[dict[str, str]]:
    """A conversation: each of ``lines`` (a person's turn) is answered with the whole conversation so far as the
    prompt, and the reply given to ``say``; ``/exit`` or the end of ``lines`` ends it. Empty lines are skipped;
    ``ask`` is called before each turn is read (a prompt sign on a terminal). Each reply is sampled with ``seed``.
    Returns the conversation as chat messages."""
    messages: list[dict[str, str]] = []
    if ask is not None:
        ask()
    for line in lines:
        text = line.rstrip("\r\n")
        if text.strip() == EXIT:
            break
        if text.strip():
            messages.append({"role": "user", "content": text})
            reply = _answers(model, _template(model.tokenizer, messages), 1, temperature, max_tokens, seed)[0]
            messages.append({"role": "assistant", "content": reply})
            say(reply)
        if ask is not None:
            ask()
    return messages


def _answers(model: RunModel, tokens: list[int], n: int, temperature: float | None, max_tokens: int | None,
             seed: int | None) -> list[str]:
    from rlvr import types

    if n < 1:
        raise ConfigurationError(f"--n {n}: ask for at least one answer")
    params = types.SamplingParams(max_tokens=model.max_tokens if max_tokens is None else max_tokens,
                                  temperature=model.temperature if temperature is None else temperature, seed=seed)
    result = model.sampler.sample(types.ModelInput.from_ints(tokens), n, params).result()
    return [model.tokenizer.decode(s.tokens, skip_special_tokens=True) for s in result.sequences]


def _template(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigurationError("this model's tokenizer has no chat template; use rlvr sample --raw to send the text "
                                 "as it is")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def _run_folder(run: str | Path) -> Path | None:
    """The run folder ``run`` names (a folder, a name under ./runs, or a run whose folder owns its checkpoints)."""
    from rlvr.weights import RUNS

    text = str(run)
    if Path(text).is_dir() and (Path(text) / "config.yaml").is_file():
        return Path(text)
    if "/" not in text and text and (RUNS / text / "config.yaml").is_file():
        return RUNS / text
    named = checkpoint_root() / text if "/" not in text and text else None
    if named is not None and named.is_symlink() and named.exists():
        return named.resolve().parent
    return None


def _run_config(folder: Path | None) -> dict[str, Any]:
    import yaml

    if folder is None:
        return {}
    values = yaml.safe_load((folder / "config.yaml").read_text())
    return values if isinstance(values, dict) else {}
