"""The simplest RLVR loop: sample a group per problem, score, centre, train, repeat. Client API only.

The RLVR loop in one function that reads top to bottom, on procedural arithmetic ("What is 37 + 48?") whose
answers a program checks. It is deliberately small: one synchronous step at a time, one reward, no KL penalty, no
resume. The full loop (envs, PPO/GRPO, streaming and async modes, checkpoints) is ``loop.py``; this one stays as the
readable reference.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from rlvr import types
from rlvr.client import ServiceClient
from rlvr.rewards import resolve_reward
from rlvr.rl.advantages import group_advantages, group_outcomes, is_constant
from rlvr.rl.datums import rl_datum, sample_train_metrics, sampled_logprobs
from rlvr.rl.plot import plot_run


@dataclass
class BasicConfig:
    """Settings of the basic loop; defaults fit a 2-core laptop in a few minutes."""

    base_model: str = "smollm2-135m"
    """Model to train (see ``rlvr models``)."""
    rank: int = 16
    """LoRA rank."""
    steps: int = 16
    """Training steps (each: sample, score, one forward_backward, one optim_step)."""
    problems_per_step: int = 4
    """Distinct problems per step."""
    group_size: int = 8
    """Samples per problem; advantages are rewards minus the group mean."""
    learning_rate: float = 2e-4
    """AdamW learning rate."""
    max_tokens: int = 12
    """Most tokens sampled per answer."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts (evaluation is greedy)."""
    max_operand: int = 20
    """Operands are drawn from 0..max_operand."""
    eval_problems: int = 48
    """Held-out problems scored greedily before and after training."""
    seed: int = 0
    """Seeds problems, LoRA initialisation and sampling."""
    out: str = "runs/basic"
    """Folder for metrics.jsonl and the config."""


def make_problem(rng: random.Random, max_operand: int) -> tuple[str, int]:
    a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
    return f"What is {a} + {b}? Answer with only the number.", a + b


math_correct = resolve_reward("math_correct")


def reward(response: str, answer: int) -> float:
    """1.0 when the response states the answer (the whole reply, "the answer is x", or a true sum "12 + 13 = 25"),
    else 0.0: the grader rlvr's recipes use (``math_correct``), never "the last number in the text", which a
    policy games by writing several numbers."""
    return math_correct("", response, {"answer": answer})


def render(tokenizer, question: str) -> types.ModelInput:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
    return types.ModelInput.from_ints(tokenizer.encode(text, add_special_tokens=False))


def held_out_accuracy(sampling_client, tokenizer, problems: list[tuple[str, int]], max_tokens: int) -> float:
    """Greedy accuracy on ``problems``."""
    params = types.SamplingParams(max_tokens=max_tokens, temperature=0.0)
    futures = [sampling_client.sample(render(tokenizer, q), 1, params) for q, _ in problems]
    scores = [reward(tokenizer.decode(f.result().sequences[0].tokens, skip_special_tokens=True), a)
              for f, (_, a) in zip(futures, problems, strict=True)]
    return sum(scores) / len(scores)


def train(config: BasicConfig, console: Console | None = None) -> dict[str, float]:
    console = console or Console()
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(config), indent=2))
    rng = random.Random(config.seed)
    eval_problems = [make_problem(random.Random(10_000 + i), config.max_operand) for i in range(config.eval_problems)]

    # Setup: one LoRA training client; its tokenizer renders prompts through the model's chat template.
    service = ServiceClient()
    training_client = service.create_lora_training_client(base_model=config.base_model, rank=config.rank,
                                                           seed=config.seed)
    tokenizer = training_client.get_tokenizer()
    adam = types.AdamParams(learning_rate=config.learning_rate)
    baseline = held_out_accuracy(training_client.save_weights_and_get_sampling_client(), tokenizer, eval_problems,
                        config.max_tokens)
    console.print(f"baseline held-out accuracy: {baseline:.3f}")

    columns = [TextColumn("step {task.completed}/{task.total}"), BarColumn(), TextColumn("{task.fields[status]}"),
               TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=console) as progress, open(out / "metrics.jsonl", "w") as log:
        task = progress.add_task("train", total=config.steps, status="")
        for step in range(config.steps):
            start = time.time()
            # 1. Refresh the sampler with the current weights (a stale sampler would train on old rollouts).
            sampling_client = training_client.save_weights_and_get_sampling_client()
            params = types.SamplingParams(max_tokens=config.max_tokens, temperature=config.temperature,
                                          seed=rng.randrange(2**31))
            problems = [make_problem(rng, config.max_operand) for _ in range(config.problems_per_step)]
            prompts = [render(tokenizer, q) for q, _ in problems]
            futures = [sampling_client.sample(p, config.group_size, params) for p in prompts]

            # 2. Score each group, 3. centre its rewards, 4. build datums (prompt positions carry no advantage).
            datums, masks, groups, tokens = [], [], [], 0
            for (_, answer), prompt, future in zip(problems, prompts, futures, strict=True):
                sequences = future.result().sequences
                rewards_G = [reward(tokenizer.decode(s.tokens, skip_special_tokens=True), answer) for s in sequences]
                groups.append(rewards_G)
                tokens += sum(len(s.tokens) for s in sequences)
                if is_constant(rewards_G):
                    continue  # no signal in this group
                for seq, advantage in zip(sequences, group_advantages(rewards_G), strict=True):
                    datum, mask = rl_datum(prompt.to_ints(), seq.tokens, sampled_logprobs(seq), advantage)
                    datums.append(datum)
                    masks.append(mask)

            # 5. Train: forward_backward and optim_step, submitted together.
            rewards = [r for g in groups for r in g]
            metrics = {"step": step, "reward/mean": sum(rewards) / len(rewards), "datums": len(datums),
                       **group_outcomes(groups)}
            if datums:
                fwd = training_client.forward_backward(datums, "importance_sampling")
                opt = training_client.optim_step(adam)
                result = fwd.result()
                metrics.update(result.metrics)
                metrics.update(opt.result().metrics or {})
                trained = [o["logprobs"].tolist() for o in result.loss_fn_outputs]
                sampled = [d.loss_fn_inputs["logprobs"].tolist() for d in datums]
                metrics.update(sample_train_metrics(trained, sampled, masks))
            metrics["time/step_s"] = time.time() - start
            metrics["tokens_per_s"] = tokens / metrics["time/step_s"]
            log.write(json.dumps(metrics) + "\n")
            log.flush()
            status = f"reward {metrics['reward/mean']:.2f}  datums {len(datums)}  {metrics['tokens_per_s']:.0f} tok/s"
            progress.update(task, advance=1, status=status)

    after = held_out_accuracy(training_client.save_weights_and_get_sampling_client(), tokenizer, eval_problems,
                     config.max_tokens)
    table = Table(title=f"rlvr basic loop: {config.base_model}, {config.steps} steps")
    for column in ("Metric", "Baseline", "After", "Improvement"):
        table.add_column(column)
    table.add_row("held-out accuracy", f"{baseline:.3f}", f"{after:.3f}", f"{after - baseline:+.3f}")
    console.print(table)
    plot = plot_run(out, extra={"baseline accuracy": baseline, "after accuracy": after})
    console.print(f"metrics: {out / 'metrics.jsonl'}   curves: {plot}")
    return {"baseline_accuracy": baseline, "after_accuracy": after}
