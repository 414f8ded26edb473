"""rlvr's policy-gradient update against TRL's, on the same rollouts from the same weights.

``bench/rl_step.py`` compares whole runs, and their rollouts differ from the first draw (each system samples with
its own random numbers), so a difference in held-out accuracy may come from the draws or from the update. This
script takes the draws out: TRL's ``GRPOTrainer`` (set up exactly as in ``rl_step.py``) trains ``--steps`` steps
while every step's batch (prompts, completions, advantages) and the LoRA weights before and after each step are
recorded; then rlvr's ``forward_backward`` (``ppo``, the same clip) and ``optim_step`` (the same AdamW settings)
take each recorded batch from TRL's weights before that step, and the two results are compared:

  - relative difference: |rlvr's weights - TRL's| / |TRL's step|, over all LoRA tensors (and the worst tensor);
  - direction: the least cosine, over the tensors, between rlvr's step and TRL's;
  - loss: rlvr's summed PPO loss over TRL's ``dr_grpo`` normaliser (batch x max completion length) against the
    loss TRL logs.

Each rlvr step starts from TRL's weights before that step, with the AdamW moments of rlvr's own previous steps (which
follow TRL's as long as the steps agree). The completions' old logprobs are rlvr's own forward at those weights, so
the importance ratio is 1 as in TRL (``num_iterations=1``).

    python bench/trl_update.py [--steps 3] [--seed 0] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine, positive_int, write_json
from bench.rl_step import Settings, trl_trainer

AGREE = 1e-2
"""Relative difference under which the two updates count as the same (float32 sums in another order, and AdamW's
first steps, which divide each gradient by its own magnitude, amplify rounding on near-zero gradients)."""


def trl_steps(settings: Settings, out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[float]]:
    """Train TRL; return each step's batch, the LoRA weights before each step and after the last, and the losses."""
    import torch
    from transformers import TrainerCallback

    batches: list[dict[str, Any]] = []
    losses: list[float] = []
    snapshots: list[dict[str, Any]] = []

    def lora(model: Any) -> dict[str, Any]:
        return {n.replace(".default.", "."): p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}

    class Recorder(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            snapshots.append(lora(model))

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None,
                   **kwargs: Any) -> None:
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    trainer = trl_trainer(settings, out, [Recorder()])
    snapshots.append(lora(trainer.model))
    generate = trainer._generate_and_score_completions

    def record(*args: Any, **kwargs: Any) -> Any:
        batch = generate(*args, **kwargs)
        batches.append({k: v.detach().clone() for k, v in batch.items() if isinstance(v, torch.Tensor)})
        return batch

    trainer._generate_and_score_completions = record
    trainer.train()
    return batches, snapshots, losses


def datums_of(batch: dict[str, Any]) -> list[Any]:
    """rlvr datums for TRL's batch: each completion after its unpadded prompt, with its advantage."""
    from rlvr.rl.datums import rl_datum

    datums = []
    for i in range(batch["prompt_ids"].shape[0]):
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
        completion = batch["completion_ids"][i][batch["completion_mask"][i].bool()].tolist()
        if completion:
            datums.append(rl_datum(prompt, completion, [0.0] * len(completion), float(batch["advantages"][i]))[0])
    return datums


def compare(rlvr: dict[str, Any], trl: dict[str, Any], before: dict[str, Any]) -> dict[str, float]:
    """How far rlvr's weights are from TRL's after one step from ``before``, relative to TRL's step."""
    import torch

    gap = sum(float((rlvr[n] - trl[n]).pow(2).sum()) for n in trl) ** 0.5
    step = sum(float((trl[n] - before[n]).pow(2).sum()) for n in trl) ** 0.5
    moved = [n for n in trl if float((trl[n] - before[n]).norm()) > 0]
    worst = max(float((rlvr[n] - trl[n]).norm() / (trl[n] - before[n]).norm()) for n in moved)
    cosine = min(float(torch.nn.functional.cosine_similarity((rlvr[n] - before[n]).flatten(),
                                                             (trl[n] - before[n]).flatten(), dim=0)) for n in moved)
    return {"relative_difference": gap / step, "worst_tensor": worst, "min_cosine": cosine}


def rlvr_steps(settings: Settings, batches: list[dict[str, Any]], snapshots: list[dict[str, Any]]
               ) -> list[dict[str, float]]:
    """Each recorded batch through rlvr's forward_backward + optim_step, from TRL's weights before it."""
    import torch

    import rlvr
    from rlvr import types

    client = rlvr.ServiceClient().create_lora_training_client(
        base_model="smollm2-135m", rank=settings.rank, seed=settings.seed, train_unembed=False)
    own_init = client.parameters()
    if set(own_init) != set(snapshots[0]):
        raise RuntimeError(f"rlvr's LoRA tensors differ from TRL's: {sorted(set(own_init) ^ set(snapshots[0]))[:4]}")
    same_init = all(torch.equal(own_init[n], snapshots[0][n]) for n in own_init if "lora_A" in n)
    trainer = client._trainer  # the live adapter weights (TrainingClient.parameters() gives copies)
    live = {n.replace(f".{trainer.adapter}.", "."): p for n, p in trainer.host.parameters(trainer.adapter).items()}
    adam = types.AdamParams(learning_rate=settings.learning_rate, beta1=0.9, beta2=0.95, eps=1e-12)
    clip = {"clip_low_threshold": 1 - settings.clip, "clip_high_threshold": 1 + settings.clip}
    results = []
    for step, batch in enumerate(batches):
        with torch.no_grad():
            for name, param in live.items():
                param.copy_(snapshots[step][name])
        datums = datums_of(batch)
        current = client.forward(datums, "importance_sampling").result()
        datums = [types.Datum(model_input=d.model_input,
                              loss_fn_inputs={**d.loss_fn_inputs, "logprobs": out["logprobs"]})
                  for d, out in zip(datums, current.loss_fn_outputs, strict=True)]
        loss = client.forward_backward(datums, "ppo", clip).result().metrics["loss:sum"]
        client.optim_step(adam).result()
        rows = batch["prompt_ids"].shape[0]  # TRL's dr_grpo divides by every row, an empty completion too
        results.append({"datums": len(datums), "loss": loss / (rows * settings.max_tokens),
                        **compare(client.parameters(), snapshots[step + 1], snapshots[step])})
    results[0]["same_initial_lora_a"] = same_init
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--steps", type=positive_int, default=3, help="TRL steps to record and replay (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="problem order, LoRA init and sampling seed (default 0)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    try:
        import trl  # noqa: F401
    except ImportError:
        print("error: TRL is not installed; install the benchmark extra: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    settings = Settings(steps=args.steps, seed=args.seed)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-trl-update-") as folder:
        batches, snapshots, trl_losses = trl_steps(settings, Path(folder))
    steps = rlvr_steps(settings, batches, snapshots)
    print(f"\nrlvr's step on TRL's rollouts from TRL's weights, {settings.steps} steps, seed {settings.seed} "
          f"(rlvr's own LoRA init equals TRL's A matrices: {steps[0]['same_initial_lora_a']})")
    print("| step | datums | relative difference | worst tensor | least cosine | loss rlvr | loss TRL |")
    print("|---|---|---|---|---|---|---|")
    for step, (row, trl_loss) in enumerate(zip(steps, trl_losses, strict=False)):
        print(f"| {step} | {row['datums']} | {row['relative_difference']:.1e} | {row['worst_tensor']:.1e} | "
              f"{row['min_cosine']:.6f} | {row['loss']:.5f} | {trl_loss:.5f} |")
    agree = all(row["relative_difference"] < AGREE for row in steps)
    print(f"\nthe same update (relative difference < {AGREE:g} at every step): {'yes' if agree else 'NO'}; "
          f"{time.perf_counter() - started:.0f} s")
    if args.json:
        write_json(args.json, {"benchmark": "trl_update", "settings": vars(args), "machine": machine(),
                               "steps": steps, "trl_losses": trl_losses, "same_update": agree})
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
