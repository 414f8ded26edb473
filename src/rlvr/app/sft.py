"""Supervised fine-tuning with the ``cross_entropy`` loss: ``rlvr sft`` and the warm-up before RL.

    state_path = sft(SftConfig(base_model="smollm2-135m", data="pairs.jsonl", steps=100))
    # then: rlvr train start_from_checkpoint=<state_path>

The data is a JSONL (or JSON/Parquet) file of ``{"prompt": ..., "completion": ...}`` records. Each prompt goes
through the model's chat template as a user turn; the completion is the assistant's answer, closed by the
tokenizer's end-of-turn token, and only its tokens carry weight. Like the RL loop it drives only the client API.

A run of ``rlvr sft`` is a run folder like ``rlvr train``'s, kept by the same run record (``rlvr.rl.run_record``):
``config.yaml`` (``kind: sft``, and the numerics it resolved, ``rlvr.numerics``), ``status.json``, ``metrics.jsonl``,
``checkpoints.jsonl`` and the states in ``checkpoints/`` (every ``save_every`` steps and at the end, pruned to
``keep_checkpoints``). SIGTERM or Ctrl-C finish the step in flight, checkpoint it and mark the run interrupted;
``rlvr resume <folder>`` (``resume=true``) continues it to the same weights.

What it is not: a packing or multi-turn SFT trainer; for those, build datums yourself and call forward_backward.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.errors import ConfigurationError
from rlvr.rl.config import NumericsConfig
from rlvr.rl.run_record import Checkpoint, RunRecord

if TYPE_CHECKING:
    from rlvr.numerics import Numerics


@dataclass
class SftConfig(NumericsConfig):
    """Settings of ``rlvr sft`` (the numerics ones: ``NumericsConfig``; an unset precision is the device's default)."""

    data: str = ""
    """JSONL (or JSON/Parquet) file of {"prompt", "completion"} records."""
    base_model: str = "smollm2-135m"
    """Model to fine-tune."""
    rank: int = 16
    """LoRA rank."""
    steps: int = 100
    """Optimizer steps."""
    batch_size: int = 16
    """Examples per step (drawn in a shuffled order, epoch after epoch)."""
    learning_rate: float = 1e-4
    """AdamW learning rate."""
    seed: int = 0
    """Seeds the LoRA initialisation and the example order."""
    save_every: int = 0
    """Checkpoint every this many steps (0 = only at the end); SIGTERM or Ctrl-C also writes one, at the step
    reached."""
    keep_checkpoints: int = 2
    """Checkpoints kept as the run goes: the last this many and the final one; older ones are deleted when a newer
    one is written (0 = keep all), as in ``rlvr train``."""
    out: str = "runs/sft"
    """Run folder: config.yaml, metrics.jsonl, checkpoints.jsonl (each checkpoint, the final state last),
    checkpoints/."""
    resume: bool = False
    """Continue from the last checkpoint in ``out`` (one a stop wrote)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.data:
            raise ConfigurationError("data: give the JSONL file of prompt/completion pairs (data=pairs.jsonl)")
        if not Path(self.data).is_file():
            raise ConfigurationError(f"data={self.data!r}: file does not exist")
        for name in ("rank", "steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.save_every < 0:
            raise ConfigurationError(f"save_every={self.save_every}: must be >= 0 (0 saves only at the end)")
        if self.keep_checkpoints < 0:
            raise ConfigurationError(f"keep_checkpoints={self.keep_checkpoints}: must be >= 0 (0 keeps every "
                                     "checkpoint; N keeps the last N and the final one)")


def read_pairs(path: str | Path) -> list[tuple[str, str]]:
    """(prompt, completion) pairs from a records file; a record without both text fields is an error naming it."""
    from rlvr.tasks.files import read_records

    pairs = []
    for i, record in enumerate(read_records(path)):
        prompt, completion = record.get("prompt"), record.get("completion")
        if not isinstance(prompt, str) or not isinstance(completion, str) or not completion:
            raise ConfigurationError(f"{path}: record {i} needs string fields 'prompt' and 'completion' (non-empty); "
                                     f"it has {sorted(record)}")
        pairs.append((prompt, completion))
    if not pairs:
        raise ConfigurationError(f"{path}: no prompt/completion records")
    return pairs


def encode_pair(tokenizer: Any, prompt: str | Sequence[int], completion: str) -> tuple[list[int], list[int]]:
    """Prompt ids (through the chat template, unless already ids) and completion ids ending in end-of-turn."""
    if isinstance(prompt, str):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        prompt_ids = tokenizer.encode(text, add_special_tokens=False)
    else:
        prompt_ids = prompt
    completion_ids = tokenizer.encode(completion, add_special_tokens=False)
    if tokenizer.eos_token_id is not None:
        completion_ids.append(tokenizer.eos_token_id)
    return list(prompt_ids), completion_ids


def supervised_steps(training_client: Any, examples: Sequence[tuple[Sequence[int], Sequence[int]]], steps: int,
                     batch_size: int, learning_rate: float, seed: int = 0,
                     on_step: Callable[[int, dict[str, float]], None] | None = None, start: int = 0) -> list[float]:
    """Cross_entropy steps ``start`` to ``steps - 1`` over (prompt ids, completion ids) examples; returns the mean
    loss per token of each. The batches depend only on ``seed`` and the step, so a run continued from a checkpoint
    of step ``start`` (its weights and AdamW state) trains on the batches the uninterrupted run would have."""
    from rlvr import types
    from rlvr.rl.datums import sft_datum

    datums = [sft_datum(p, c) for p, c in examples]
    order: list[int] = []
    rng = random.Random(seed)
    adam = types.AdamParams(learning_rate=learning_rate)
    losses = []
    for step in range(steps):
        batch: list[types.Datum] = []
        while len(batch) < batch_size:
            if not order:
                order = list(range(len(datums)))
                rng.shuffle(order)
            batch.append(datums[order.pop()])
        if step < start:  # drawn only to reach step start's place in the order
            continue
        fwd = training_client.forward_backward(batch, "cross_entropy")
        opt = training_client.optim_step(adam)
        out = fwd.result()
        opt.result()
        tokens = sum(float(sum(d.loss_fn_inputs["weights"].tolist())) for d in batch)
        loss = out.metrics["loss:sum"] / max(tokens, 1.0)
        losses.append(loss)
        if on_step is not None:
            on_step(step, {"train/loss_per_token": loss})
    return losses


def sft(config: SftConfig | dict[str, Any], progress: Callable[[int, dict[str, float]], None] | None = None,
        console: Any = None) -> str:
    """Fine-tune on ``config.data``; returns the final state path (for ``start_from_checkpoint``). ``console``: show
    the steps on it (``progress.py``), else ``progress`` is called after each step. A stop (SIGTERM, Ctrl-C) raises
    RunInterrupted after checkpointing the step reached."""
    import contextlib

    from rlvr.app.progress import StepProgress, make_console
    from rlvr.app.settings import build_config
    from rlvr.app.status import running, stopped_at
    from rlvr.client import ServiceClient

    if not isinstance(config, SftConfig):
        built: SftConfig = build_config(dict(config), SftConfig)
        config = built
    record = RunRecord(config.out)
    resumed = record.resume_point("sft", config.steps) if config.resume else None  # None: from step 0
    numerics = _numerics(config, record)
    service = ServiceClient(numerics=numerics)
    record.write_config(dataclasses.replace(config, resume=False, accept_numerics=False, precision=numerics.precision),
                        "sft", numerics=numerics.as_record())
    start = resumed.step if resumed is not None else 0
    shown = contextlib.nullcontext() if console is None else StepProgress(console, "step", config.steps, start=start)
    with running(record.run_dir, console or make_console(), lambda: stopped_at(record, config.steps),
                 kind="sft") as stop, shown as bar:
        def show(step: int, metrics: dict[str, float]) -> None:
            if bar is not None:
                bar.update(step + 1, f"loss/token {metrics['train/loss_per_token']:.4f}")
            if progress is not None:
                progress(step, metrics)

        return _sft(config, record, service, resumed, stop, show)


def _numerics(config: SftConfig, record: RunRecord) -> Numerics:
    """The numerics the run computes by, resolved by this process's engine (``rlvr.client.resolve_numerics``;
    its precision ``config.precision``, else ``$RLVR_PRECISION``, else the device's default), and on a resume
    checked against what the run recorded (``rlvr.numerics.check_resume``)."""
    from rlvr.client import resolve_numerics
    from rlvr.numerics import check_resume

    numerics = resolve_numerics(config.requested_numerics())
    check_resume(record.numerics if config.resume else None, numerics, record.run_dir, config.accept_numerics)
    return numerics


def _sft(config: SftConfig, record: RunRecord, service: Any, resumed: Checkpoint | None, stop: Any,
         on_step: Callable[[int, dict[str, float]], None]) -> str:
    """The steps of :func:`sft` from ``resumed`` (a checkpoint of the run, or None: from step 0), each saved as
    ``save_every`` says and where a stop finds it; returns the final state's path."""
    from rlvr.errors import RunInterrupted
    from rlvr.rl.tracking import open_trackers

    pairs = read_pairs(config.data)
    with stop.abandonable():  # loading the model: nothing to keep yet
        training_client = record.open_client(service, resumed, base_model=config.base_model, rank=config.rank,
                                             seed=config.seed)
    tokenizer = training_client.get_tokenizer()
    examples = [encode_pair(tokenizer, p, c) for p, c in pairs]
    start = resumed.step if resumed is not None else 0
    with open_trackers([], record.run_dir, start_step=start if config.resume else None) as tracker:
        def step_done(step: int, metrics: dict[str, float]) -> None:
            tracker.log(metrics, step)
            on_step(step, metrics)
            done = step + 1
            if done == config.steps:  # the final state is saved below
                return
            if stop.requested or (config.save_every and done % config.save_every == 0):
                record.save(training_client, "sft", done, keep=config.keep_checkpoints)
            if stop.requested:
                raise RunInterrupted(stop.signum, done)

        supervised_steps(training_client, examples, config.steps, config.batch_size, config.learning_rate,
                         seed=config.seed, on_step=step_done, start=start)
    return record.save(training_client, "sft", config.steps, final=True, keep=config.keep_checkpoints).state_path
