"""One RL step, rlvr against TRL: rlvr's loop (``rlvr.rl.loop.train``) and TRL's ``GRPOTrainer`` (its Hugging Face
``generate`` path, ``use_vllm=False``) on the same model, prompts, batch, learning rate and loss family.

Each run trains ``--steps`` steps in a fresh subprocess; runs alternate rlvr, TRL, rlvr, TRL ... (``--repeats``
pairs per seed) so that whatever else the machine is doing falls on both. ``--seeds 0,1,2`` runs the pairs on each
seed (problem order, LoRA initialisation, sampling) and compares mean accuracies: after a few steps one seed is
one trajectory, and held-out accuracy swings by up to 0.25 between trajectories, so one seed cannot say which system
learns better. Printed: each step's wall time for both, the mean,
the ratio (TRL s/step over rlvr s/step), and held-out greedy accuracy after the last step for both, measured by one
evaluator in this process: both LoRA results are loaded as peft adapters onto one copy of the model and answer the
same held-out problems with ``generate`` (greedy), scored by the same reward. ``--profile`` adds one more rlvr run
of up to 3 steps under cProfile (the engine thread and the loop thread separately) and prints where its step time
goes; the TRL side's split (generate, rewards, the rest) is in every run's figures.

    python bench/rl_step.py [--model smollm2-135m] [--steps 8] [--repeats 1] [--seeds 0] [--eval-problems 64]
                            [--profile] [--json PATH]

Matched exactly:
  - model: SmolLM2-135M-Instruct, float32, from ``ensure_smollm2()``: TRL loads the same folder with transformers
    (the GGUF converted once, its quantization markers stripped; TRL refuses the GGUF-loaded model itself); or, with
    ``--model``, a published shape with random weights (``bench.common.bench_model``: the step's time does not
    depend on the weights, its accuracy is noise);
  - LoRA: rank 16, alpha 32, dropout 0, on q/k/v/o and gate/up/down, *not* lm_head: TRL refuses a LoRA on the
    LM head (it computes logprobs from ``lm_head.weight`` through a fused head), and ``LoopConfig`` has no field for
    the LoRA targets, so the rlvr worker wraps ``ServiceClient.create_lora_training_client`` to pass
    ``train_unembed=False`` (rlvr's default adapts lm_head too). The same initial weights: both draw the A matrices
    from ``torch.manual_seed(seed)`` in peft's module order; B starts at 0;
  - prompts: procedural arithmetic (``ArithmeticSource(levels=(1,))``, "Answer with only the number."), rendered by
    the model's chat template; the same problems in the same order, 4 per step (rlvr's loop order; TRL gets exactly
    those rows with ``shuffle_dataset=False``);
  - group size 8 (32 completions per step, one generation batch, one optimizer step: TRL
    ``per_device_train_batch_size=32``, ``gradient_accumulation_steps=1``, ``num_iterations=1``);
  - sampling: temperature 1.0, top_p 1, no top-k, at most 64 new tokens, stop at EOS (``<|im_end|>``);
  - reward: ``math_correct`` on the decoded answer (special tokens skipped), via ``source.score``;
  - advantages: reward minus the group mean, not divided by the std (TRL ``scale_rewards="none"``);
  - loss: PPO clipped surrogate with clip 0.2 (rlvr ``ppo`` with thresholds 0.8/1.2, TRL ``epsilon=0.2``);
    no KL term (TRL ``beta=0``; rlvr ``kl_penalty_coef=0``);
  - optimizer: AdamW, lr 2e-4 constant (TRL ``lr_scheduler_type="constant"``, no warm-up), betas (0.9, 0.95),
    eps 1e-12, weight decay 0, no gradient clipping (tinker's ``AdamParams`` defaults; TRL ``max_grad_norm=0``);
  - precision float32 on the CPU (TRL ``bf16=False``, ``use_cpu=True``), no gradient checkpointing (TRL's default
    is on; rlvr has none), dropout off. ``--precision bfloat16``: rlvr's base weights multiply in bfloat16 (its LoRA
    and optimizer state stay float32); TRL loads the model in bfloat16 and trains with ``bf16=True`` (peft keeps the
    adapter in float32), as its documentation sets up a bfloat16 run.

Not matched exactly:
  - loss normalisation: rlvr's losses are Tinker's per-token *sums*; TRL's closest, ``dr_grpo``, divides the same
    sum by a constant (batch x max_completion_length). With AdamW a constant factor on the gradient does not change
    the update (up to eps), so the updates agree; TRL's other loss types reweight tokens or sequences;
  - groups whose 8 rewards are all equal carry no gradient in either; rlvr drops them before training, TRL still
    runs their forward and backward (that saving is counted in rlvr's step time, as it is in a real run). When every
    group of a step is constant rlvr takes no optimizer step, while TRL takes an AdamW step on a zero gradient (which
    still moves the weights by the decayed momentum);
  - rlvr's step also publishes the weights to its sampler and checks the sampler's logprobs against the trainer's
    (one 16-token forward each), which TRL does not do (its generate runs on the training module itself), and writes
    the step's rollouts (JSONL and an HTML page; on by default), where TRL logs no completions by default;
  - random draws: the two samplers use different generators, so the completions differ from the first token on;
  - rewards: rlvr scores in killable forked worker processes with a timeout, TRL calls the function in-process;
  - TRL's step computes per-token entropies for its logs; rlvr's computes its kl_sample_train metrics;
  - time per step: rlvr's is the loop's ``time/total`` (sampler refresh and check, rollout, rewards, advantages,
    forward_backward, optim_step; its "sample" phase includes the sampler refresh and check); TRL's runs from
    ``on_step_begin`` to ``on_step_end`` (generation, rewards, advantages, forward, backward, optimizer step).
    Model loading, evaluation and checkpoint writing are outside both. The loop's own before/after evaluations are
    cut to 4 problems (they are not used here).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import BENCH_MODELS, bench_model, load_average, machine, positive_int, progress_bar, write_json

from rlvr.rewards import Reward

MARK = "@@rl_step "
"""Prefix of the lines a worker writes for the parent (JSON after it); everything else goes to the log."""
TARGET_MODULES = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
"""rlvr's LoRA targets on a Llama-style model without lm_head (``train_unembed=False``), sorted as rlvr sorts them."""
LOOP_EVAL_PROBLEMS = 4
"""Held-out problems for the loop's own before/after evaluation, which this benchmark does not use."""
PROFILE_STEPS = 3
"""Most steps of the ``--profile`` run (enough to see where the time goes)."""


@dataclass(frozen=True)
class Settings:
    """What both systems run with (see the module docstring for how each maps onto rlvr and TRL)."""

    steps: int = 8
    """Optimizer steps per run."""
    problems_per_step: int = 4
    """Distinct prompts per step."""
    group_size: int = 8
    """Completions per prompt."""
    max_tokens: int = 64
    """Most new tokens per completion (TRL ``max_completion_length``)."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts."""
    learning_rate: float = 2e-4
    """AdamW learning rate, constant."""
    rank: int = 16
    """LoRA rank."""
    alpha: int = 32
    """LoRA alpha (rlvr's fixed value)."""
    clip: float = 0.2
    """PPO clip range: ratios outside [1 - clip, 1 + clip] stop pushing."""
    levels: tuple[int, ...] = (1,)
    """Arithmetic difficulty levels of the prompts."""
    instruction: str = "Answer with only the number."
    """Appended to each question."""
    eval_problems: int = 64
    """Held-out problems for the shared evaluator."""
    seed: int = 0
    """Problem order, LoRA initialisation and sampling seeds."""
    model: str = "smollm2-135m"
    """The model (``bench.common.bench_model``): the embedded one, or a published shape with random weights."""
    precision: str = "float32"
    """The base weights' precision in both systems: float32, or bfloat16 (where this CPU multiplies it)."""
    reward: str = "math_correct"
    """``math_correct``; or ``alternating`` (every other answer the scoring process sees earns 1), for random
    weights: their answers are never correct (and decode to almost nothing), so every group would have equal
    rewards, rlvr would drop them all and train nothing while TRL trains on them anyway."""


class Alternating(Reward):
    """A reward of 1 for every other response this process scores and 0 for the rest: groups of mixed rewards
    whatever the answers say, so that both systems train every datum (rlvr's reward workers are forked, each
    counting on its own, which still mixes every group they score). A run of any recipe on random weights takes it
    as ``reward=bench.rl_step:Alternating`` with the repository on ``PYTHONPATH``, so that its step trains."""

    name = "alternating"

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, prompt: str, response: str, meta: Any = None) -> float:
        self.calls += 1
        return float(self.calls % 2)


def make_source(settings: Settings) -> Any:
    """The problem source both systems draw from."""
    from rlvr.tasks.arithmetic import ArithmeticSource

    reward = "math_correct" if settings.reward == "math_correct" else Alternating()
    return ArithmeticSource(levels=settings.levels, instruction=settings.instruction, reward=reward,
                            num_test=settings.eval_problems, seed=settings.seed)


def training_problems(source: Any, settings: Settings) -> list[Any]:
    """The problems of every step, in the order rlvr's loop takes them (its shuffled train split, in slices)."""
    problems = source.problems("train", shuffle=True, seed=settings.seed)
    count = settings.steps * settings.problems_per_step
    return [problems[i % len(problems)] for i in range(count)]


def emit(kind: str, **data: Any) -> None:
    """Tell the parent process something (one JSON line on stdout)."""
    print(MARK + json.dumps({"kind": kind, **data}), flush=True)


# -- the rlvr worker --------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def profiled(out: Path | None) -> Iterator[Callable[[], None]]:
    """cProfile the engine's worker thread and this thread separately (cProfile sees one thread each) into
    ``out/engine.pstats`` and ``out/loop.pstats``; nothing when ``out`` is None. Yields ``stop``, which ends the
    profile early (after the last step, so the loop's final evaluation and plot stay out of it)."""
    if out is None:
        yield lambda: None
        return
    from rlvr.engine.engine import Engine

    engine, loop = cProfile.Profile(), cProfile.Profile()
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if not stopped:
            stopped = True
            loop.disable()
            Engine.default().run(engine.disable)

    Engine.default().run(engine.enable)  # enable() hooks the thread it runs on: the engine's one worker thread
    loop.enable()
    try:
        yield stop
    finally:
        stop()
        engine.dump_stats(out / "engine.pstats")
        loop.dump_stats(out / "loop.pstats")


@contextlib.contextmanager
def lora_without_unembed() -> Iterator[None]:
    """Make the loop's training client leave lm_head alone, as TRL must (LoopConfig has no field for it)."""
    from rlvr.client import ServiceClient

    original = ServiceClient.create_lora_training_client

    def create(self: ServiceClient, *args: Any, **kwargs: Any) -> Any:
        return original(self, *args, **{**kwargs, "train_unembed": False})

    ServiceClient.create_lora_training_client = create  # type: ignore[method-assign]
    try:
        yield
    finally:
        ServiceClient.create_lora_training_client = original  # type: ignore[method-assign]


def run_rlvr(settings: Settings, out: Path, profile: bool) -> dict[str, Any]:
    """Train with rlvr's loop; write the final adapter to ``out/adapter.safetensors``."""
    from rlvr.home import resolve
    from rlvr.rl import LoopConfig, train
    from rlvr.rl.checkpoints import last_checkpoint

    source = make_source(settings)
    config = LoopConfig(
        base_model=bench_model(settings.model)[0], rank=settings.rank, steps=settings.steps,
        problems_per_step=settings.problems_per_step, group_size=settings.group_size, loss_fn="ppo",
        loss_fn_config={"clip_low_threshold": 1 - settings.clip, "clip_high_threshold": 1 + settings.clip},
        learning_rate=settings.learning_rate, max_tokens=settings.max_tokens, temperature=settings.temperature,
        eval_problems=LOOP_EVAL_PROBLEMS, seed=settings.seed, precision=settings.precision, out=str(out / "run"))
    steps: list[dict[str, float]] = []

    def progress(step: int, metrics: dict[str, float]) -> None:
        if step == settings.steps - 1:
            stop_profile()  # set by the `with` below, before training starts
        total = metrics["time/total"]
        phases = {"sample": metrics["time/sample"], "score": metrics["time/reward"], "train": metrics["time/train"]}
        phases["other"] = total - sum(phases.values())
        steps.append({"seconds": total, **phases, "completion_tokens": metrics["env/all/ac_tokens_per_turn"],
                      "reward_mean": metrics.get("env/all/reward/mean", float("nan")),
                      "datums": metrics["train/datums"]})
        emit("step", step=step, seconds=total)

    started = time.perf_counter()
    with lora_without_unembed(), profiled(out if profile else None) as stop_profile:
        train(config, source, progress=progress)
    wall = time.perf_counter() - started
    entry = last_checkpoint(out / "run")
    if entry is None:
        raise RuntimeError(f"rlvr's loop wrote no checkpoint to {out / 'run'}")
    folder = resolve(entry["state_path"])
    shutil.copy(folder / "adapter_model.safetensors", out / "adapter.safetensors")
    shutil.rmtree(folder.parents[1], ignore_errors=True)  # this run's checkpoints under $RLVR_HOME: ours alone
    return {"steps": steps, "wall_s": wall}


# -- the TRL worker ---------------------------------------------------------------------------------------------------

def timed(fn: Callable[..., Any], totals: dict[str, float], name: str) -> Callable[..., Any]:
    """``fn``, adding the seconds each call takes to ``totals[name]``."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[name] = totals.get(name, 0.0) + time.perf_counter() - started
    return wrapper


def trl_trainer(settings: Settings, out: Path, callbacks: list[Any]) -> Any:
    """TRL's GRPOTrainer set up as this benchmark matches it to rlvr (module docstring), with ``callbacks``."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    source = make_source(settings)
    problems = training_problems(source, settings)
    folder = bench_model(settings.model)[1]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    bf16 = settings.precision == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16 if bf16 else torch.float32)
    lora = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=0.0, bias="none",
                      target_modules=TARGET_MODULES)
    torch.manual_seed(settings.seed)  # as rlvr draws its adapter: the same A matrices
    model = get_peft_model(model, lora)
    dataset = Dataset.from_list([{"prompt": source.messages(p), "index": i} for i, p in enumerate(problems)])

    def correct(completions: list[list[dict[str, str]]], index: list[int], **_: Any) -> list[float]:
        return [source.score(problems[i], c[0]["content"]) for c, i in zip(completions, index, strict=True)]

    config = GRPOConfig(
        output_dir=str(out / "trl"), max_steps=settings.steps, seed=settings.seed,
        per_device_train_batch_size=settings.problems_per_step * settings.group_size, gradient_accumulation_steps=1,
        num_generations=settings.group_size, num_iterations=1, shuffle_dataset=False,
        max_completion_length=settings.max_tokens, temperature=settings.temperature, top_p=1.0, top_k=0,
        use_vllm=False, beta=0.0, epsilon=settings.clip, loss_type="dr_grpo", scale_rewards="none",
        mask_truncated_completions=False, learning_rate=settings.learning_rate, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.95, adam_epsilon=1e-12, max_grad_norm=0.0,
        bf16=bf16, fp16=False, use_cpu=True, gradient_checkpointing=False, disable_dropout=True,
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, reward_funcs=[correct], args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=callbacks)
    check_prompt = trainer.processing_class.apply_chat_template(
        [source.messages(problems[0])], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"][0]
    if list(check_prompt) != source.render_ids(problems[0], tokenizer):
        raise RuntimeError("TRL's prompt tokens differ from rlvr's for the same problem; the comparison would be "
                           "unfair")
    return trainer


def run_trl(settings: Settings, out: Path) -> dict[str, Any]:
    """Train with TRL's GRPOTrainer; write the final adapter to ``out/adapter.safetensors``."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file
    from transformers import TrainerCallback

    phases: dict[str, float] = {}
    steps: list[dict[str, float]] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            phases.clear()
            self.started = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            seconds = time.perf_counter() - self.started
            sample, score = phases.get("sample", 0.0), phases.get("score", 0.0)
            steps.append({"seconds": seconds, "sample": sample, "score": score, "train": seconds - sample - score})
            emit("step", step=state.global_step - 1, seconds=seconds)

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None,
                   **kwargs: Any) -> None:
            if logs and steps and "reward" in logs:
                steps[-1]["reward_mean"] = logs["reward"]
                steps[-1]["completion_tokens"] = logs.get("completions/mean_length", float("nan"))

    trainer = trl_trainer(settings, out, [StepTimer()])
    trainer._generate_single_turn = timed(trainer._generate_single_turn, phases, "sample")
    trainer._calculate_rewards = timed(trainer._calculate_rewards, phases, "score")
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    state = get_peft_model_state_dict(trainer.model, save_embedding_layers=False)
    save_file({k: v.detach().contiguous() for k, v in state.items()}, out / "adapter.safetensors")
    return {"steps": steps, "wall_s": wall}


def worker(system: str, settings: Settings, out: Path, profile: bool) -> None:
    """Run one system in this process and report to the parent."""
    started = time.perf_counter()
    result = run_rlvr(settings, out, profile) if system == "rlvr" else run_trl(settings, out)
    result["process_s"] = time.perf_counter() - started
    import torch

    result["torch_threads"] = torch.get_num_threads()  # after training: what the run computed with
    emit("done", **result)


# -- the parent: alternate runs, evaluate, report ---------------------------------------------------------------------

def spawn(system: str, settings: Settings, out: Path, profile: bool, on_step: Callable[[dict], None],
          script: Path = Path(__file__), extra: Sequence[str] = ()) -> dict[str, Any]:
    """Run one training in a fresh interpreter: ``script`` (this file by default) with ``--worker system`` and
    ``extra`` arguments. Its chatter goes to ``out/log.txt``, each step's report to ``on_step``; its final report
    comes back."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(script.resolve()), "--worker", system, "--out", str(out),
               "--settings", json.dumps(asdict(settings)), *extra] + (["--profile"] if profile else [])
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    done: dict[str, Any] | None = None
    with open(out / "log.txt", "w") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith(MARK):
                message = json.loads(line[len(MARK):])
                if message["kind"] == "step":
                    on_step(message)
                elif message["kind"] == "done":
                    done = message
            else:
                log.write(line)
        code = process.wait()
    if code != 0 or done is None:
        tail = "".join((out / "log.txt").read_text().splitlines(keepends=True)[-30:])
        raise RuntimeError(f"the {system} run failed (exit {code}); last lines of {out / 'log.txt'}:\n{tail}")
    return done


def greedy_accuracy(model: Any, tokenizer: Any, source: Any, problems: list[Any], max_tokens: int,
                    batch_size: int = 16) -> float:
    """Fraction of ``problems`` whose greedy answer (HF ``generate``) earns the full reward."""
    import torch

    correct = 0
    for start in range(0, len(problems), batch_size):
        batch = problems[start:start + batch_size]
        prompts = [source.render_ids(p, tokenizer) for p in batch]
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])  # (B, P)
        attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])  # (B, P)
        with torch.inference_mode():
            out = model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=False,
                                 max_new_tokens=max_tokens, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id, top_k=None, top_p=None, temperature=None)
        texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
        correct += sum(source.score(p, text) >= 1.0 for p, text in zip(batch, texts, strict=True))
    return correct / len(problems)


def evaluate(settings: Settings, adapters: dict[str, Path]) -> dict[str, float]:
    """Held-out greedy accuracy of the base model and of each adapter, by one evaluator on one model copy."""
    import torch
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = make_source(settings)
    problems = source.problems("test", limit=settings.eval_problems)
    folder = bench_model(settings.model)[1]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    lora = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=0.0, bias="none",
                      target_modules=TARGET_MODULES)
    model = get_peft_model(model, lora).eval()
    lora_keys = {k for k in model.state_dict() if "lora_" in k}
    with model.disable_adapter():
        accuracy = {"base": greedy_accuracy(model, tokenizer, source, problems, settings.max_tokens)}
    for name, path in adapters.items():
        weights = load_file(path)
        result = set_peft_model_state_dict(model, weights)
        missing = sorted(k for k in result.missing_keys if k in lora_keys)
        if result.unexpected_keys or missing or len(weights) != len(lora_keys):
            raise RuntimeError(f"adapter {path} does not fit the evaluator's LoRA layout: unexpected "
                               f"{result.unexpected_keys[:3]}, missing {missing[:3]}, {len(weights)} tensors for "
                               f"{len(lora_keys)} LoRA parameters")
        accuracy[name] = greedy_accuracy(model, tokenizer, source, problems, settings.max_tokens)
    return accuracy


def profile_report(out: Path, steps: list[dict[str, float]], top: int = 18) -> dict[str, Any]:
    """Where a profiled rlvr run spent its time: the loop's phases and the engine thread's biggest functions."""
    phase_means = {k: statistics.fmean(s[k] for s in steps) for k in ("seconds", "sample", "score", "train", "other")}
    import rlvr.engine

    stats = pstats.Stats(str(out / "engine.pstats"))
    wanted = {("sampler.py", "sample_batch"): "sampler: batched decode",
              ("engine.py", "forward"): "forward / forward_backward (loss + backward)",
              ("engine.py", "_logprobs"): "  of which the trainer's forward (logits -> logprobs)",
              ("engine.py", "optim_step"): "optim_step (AdamW)",
              ("engine.py", "save_for_sampler"): "publish weights to the sampler",
              ("engine.py", "compute_logprobs"): "sampler check: the sampler's logprobs",
              ("batch.py", "check_data"): "datum checking"}
    package = Path(rlvr.engine.__file__).parent  # the engine's modules, wherever rlvr is installed
    functions: dict[str, float] = {}
    for (filename, _, name), (_, _, _, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        path = Path(filename)
        if path.parent == package and (path.name, name) in wanted:
            functions[wanted[path.name, name]] = functions.get(wanted[path.name, name], 0.0) + cumulative
    text = io.StringIO()
    pstats.Stats(str(out / "engine.pstats"), stream=text).sort_stats("tottime").print_stats(top)
    loop_text = io.StringIO()
    pstats.Stats(str(out / "loop.pstats"), stream=loop_text).sort_stats("cumulative").print_stats(top)
    return {"steps": len(steps), "phase_means_s": phase_means, "engine_functions_s": functions,
            "engine_by_tottime": text.getvalue(), "loop_by_cumulative": loop_text.getvalue()}


def summarise(runs: list[dict[str, Any]], accuracy: dict[str, float]) -> dict[str, Any]:
    """Mean s/step, the speed-up, and mean accuracy of each system."""
    out: dict[str, Any] = {}
    for system in ("rlvr", "trl"):
        seconds = [s["seconds"] for r in runs if r["system"] == system for s in r["steps"]]
        later = [s["seconds"] for r in runs if r["system"] == system for s in r["steps"][1:]]
        accuracies = [accuracy[r["name"]] for r in runs if r["system"] == system]
        out[system] = {"s_per_step": statistics.fmean(seconds),
                       "s_per_step_after_first": statistics.fmean(later) if later else None,
                       "accuracy": statistics.fmean(accuracies),
                       "completion_tokens": statistics.fmean(s.get("completion_tokens", float("nan"))
                                                             for r in runs if r["system"] == system
                                                             for s in r["steps"]),
                       **{f"{k}_s": statistics.fmean(s[k] for r in runs if r["system"] == system for s in r["steps"])
                          for k in ("sample", "score", "train")}}
    bases = [v for k, v in accuracy.items() if k == "base" or k.startswith("base-")]
    out["base_accuracy"] = statistics.fmean(bases)
    seeds = sorted({r["seed"] for r in runs})
    out["accuracy_by_seed"] = {str(seed): {system: statistics.fmean(accuracy[r["name"]] for r in runs
                                                                    if r["system"] == system and r["seed"] == seed)
                                           for system in ("rlvr", "trl")} for seed in seeds}
    out["speedup"] = out["trl"]["s_per_step"] / out["rlvr"]["s_per_step"]
    out["faster_3x"] = out["speedup"] >= 3.0
    out["accuracy_at_least_as_high"] = out["rlvr"]["accuracy"] >= out["trl"]["accuracy"]
    return out


def print_report(runs: list[dict[str, Any]], summary: dict[str, Any], accuracy: dict[str, float],
                 load: dict[str, list[float]]) -> None:
    print("\nper-step wall time (s):")
    for run in runs:
        times = " ".join(f"{s['seconds']:6.2f}" for s in run["steps"])
        print(f"  {run['name']:>7}: {times}   mean {statistics.fmean(s['seconds'] for s in run['steps']):.2f} "
              f"({run['torch_threads']} torch threads)")
    rlvr, trl = summary["rlvr"], summary["trl"]
    print("\n| metric | rlvr | TRL GRPOTrainer | ratio |\n|---|---|---|---|")
    print(f"| s/step (mean, all steps) | {rlvr['s_per_step']:.2f} | {trl['s_per_step']:.2f} | "
          f"{summary['speedup']:.2f}x |")
    if rlvr["s_per_step_after_first"] is not None:
        print(f"| s/step (steps after the first) | {rlvr['s_per_step_after_first']:.2f} | "
              f"{trl['s_per_step_after_first']:.2f} | "
              f"{trl['s_per_step_after_first'] / rlvr['s_per_step_after_first']:.2f}x |")
    for phase in ("sample", "score", "train"):
        print(f"| {phase} s/step | {rlvr[f'{phase}_s']:.2f} | {trl[f'{phase}_s']:.2f} | "
              f"{trl[f'{phase}_s'] / max(rlvr[f'{phase}_s'], 1e-9):.2f}x |")
    print(f"| completion tokens (mean) | {rlvr['completion_tokens']:.1f} | {trl['completion_tokens']:.1f} | |")
    seeds = summary["accuracy_by_seed"]
    mean = f"mean over seeds {', '.join(seeds)}, " if len(seeds) > 1 else ""
    print(f"| held-out greedy accuracy ({mean}base {summary['base_accuracy']:.3f}) | {rlvr['accuracy']:.3f} | "
          f"{trl['accuracy']:.3f} | |")
    if len(seeds) > 1:
        for seed, by_system in seeds.items():
            print(f"| seed {seed} (base {accuracy[f'base-{seed}']:.3f}) | {by_system['rlvr']:.3f} | "
                  f"{by_system['trl']:.3f} | |")
    verdict = ("yes" if summary["faster_3x"] else "NO") + (" / accuracy at least as high: " +
                                                            ("yes" if summary["accuracy_at_least_as_high"] else "NO"))
    print(f"\nrlvr >= 3x faster per step: {verdict}")
    print(f"load average before {load['before']}, after {load['after']} ({os.cpu_count()} CPUs)")


def seed_list(text: str) -> list[int]:
    """``--seeds``: comma-separated integers, each once."""
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes comma-separated integers, e.g. 0,1,2; got {text!r}") from None
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"--seeds lists a seed twice: {text!r}")
    return seeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--model", default="smollm2-135m", help=BENCH_MODELS)
    parser.add_argument("--steps", type=positive_int, default=8, help="optimizer steps per run (default 8)")
    parser.add_argument("--repeats", type=positive_int, default=1, help="rlvr/TRL run pairs, alternating (default 1)")
    parser.add_argument("--eval-problems", type=positive_int, default=64, help="held-out problems (default 64)")
    parser.add_argument("--max-tokens", type=positive_int, default=64, help="new tokens per completion (default 64)")
    parser.add_argument("--reward", choices=["math_correct", "alternating"], default="math_correct",
                        help="alternating: every other answer earns 1, so that random weights (never correct) still "
                        "give every group mixed rewards and both systems train every datum")
    parser.add_argument("--precision", choices=["float32", "bfloat16"], default="float32",
                        help="base weights' precision in both systems (bfloat16 needs a CPU that multiplies it)")
    parser.add_argument("--seeds", type=seed_list, default=[0], metavar="S[,S...]",
                        help="problem order, LoRA init and sampling seeds, a run pair (or --repeats pairs) on each "
                        "(default 0); accuracy after a few steps varies with the seed, so compare over several")
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)  # the older spelling of one seed
    parser.add_argument("--profile", action="store_true",
                        help=f"add a cProfiled rlvr run (up to {PROFILE_STEPS} steps) and print where its time goes")
    parser.add_argument("--keep", metavar="DIR", help="keep the runs' logs and adapters in DIR")
    parser.add_argument("--json", metavar="PATH", help="write the figures to this JSON file")
    parser.add_argument("--worker", choices=["rlvr", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        if not (args.settings and args.out):
            parser.error("--worker needs --settings and --out (it is started by the parent run)")
        raw = json.loads(args.settings)
        worker(args.worker, Settings(**{**raw, "levels": tuple(raw["levels"])}), Path(args.out), args.profile)
        return 0
    try:
        import trl  # noqa: F401
    except ImportError:
        print("error: TRL is not installed; install the benchmark extra: pip install -e '.[bench]'", file=sys.stderr)
        return 2

    seeds = [args.seed] if args.seed is not None else args.seeds
    settings = Settings(steps=args.steps, eval_problems=args.eval_problems, max_tokens=args.max_tokens, seed=seeds[0],
                        model=args.model, reward=args.reward, precision=args.precision)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="rlvr-bench-rl-step-"))
    load = {"before": load_average()}
    print(f"{settings.steps} steps x {settings.problems_per_step} prompts x {settings.group_size} completions, "
          f"{settings.max_tokens} new tokens, LoRA r{settings.rank}, lr {settings.learning_rate}, "
          f"{settings.precision}, reward "
          f"{settings.reward}; {args.repeats} "
          f"alternating pair(s) on seed(s) {', '.join(map(str, seeds))}; load average {load['before']} on "
          f"{os.cpu_count()} CPUs", flush=True)
    plan = [(system, seed, r) for seed in seeds for r in range(args.repeats) for system in ("rlvr", "trl")]
    runs: list[dict[str, Any]] = []
    try:
        with progress_bar() as bar:
            profile_settings = replace(settings, steps=min(settings.steps, PROFILE_STEPS))
            total = settings.steps * len(plan) + (profile_settings.steps if args.profile else 0)
            task = bar.add_task("rl_step", total=total, info="")
            for system, seed, repeat in plan:
                name = f"{system}-{repeat}" if len(seeds) == 1 else f"{system}-s{seed}-{repeat}"

                def on_step(message: dict, name: str = name) -> None:
                    bar.console.print(f"{name} step {message['step']}: {message['seconds']:.2f} s")
                    bar.update(task, advance=1, info=f"{name} {message['seconds']:.1f} s/step")

                done = spawn(system, replace(settings, seed=seed), root / name, False, on_step)
                runs.append({"system": system, "seed": seed, "repeat": repeat, "name": name, "steps": done["steps"],
                             "wall_s": done["wall_s"], "process_s": done["process_s"],
                             "torch_threads": done["torch_threads"]})
            profile = None
            if args.profile:
                def on_profiled_step(message: dict) -> None:
                    bar.update(task, advance=1, info=f"profiled rlvr {message['seconds']:.1f} s/step")

                done = spawn("rlvr", profile_settings, root / "rlvr-profiled", True, on_profiled_step)
                profile = profile_report(root / "rlvr-profiled", done["steps"])
        load["after_training"] = load_average()
        print("evaluating the adapters (greedy, one evaluator)...", flush=True)
        accuracy = {}
        for seed in seeds:  # each seed holds out its own problems
            by_seed = evaluate(replace(settings, seed=seed), {run["name"]: root / run["name"] / "adapter.safetensors"
                                                              for run in runs if run["seed"] == seed})
            accuracy.update({("base" if len(seeds) == 1 else f"base-{seed}") if k == "base" else k: v
                             for k, v in by_seed.items()})
        load["after"] = load_average()
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    summary = summarise(runs, accuracy)
    print_report(runs, summary, accuracy, load)
    if profile is not None:
        print("\nprofiled rlvr run (cProfile slows it down: read the shares, not the seconds); mean seconds per "
              "step by phase, from the loop's time/* metrics (sample includes the sampler refresh and check):")
        for phase, seconds in profile["phase_means_s"].items():
            print(f"  {phase:>8}: {seconds:.2f}")
        print(f"engine thread, cumulative seconds over the {profile['steps']} steps (and, before them, client setup "
              f"and the loop's {LOOP_EVAL_PROBLEMS}-problem greedy evaluation):")
        for what, seconds in sorted(profile["engine_functions_s"].items(), key=lambda kv: -kv[1]):
            print(f"  {seconds:8.2f}  {what}")
        print(profile["engine_by_tottime"])
    if args.json:
        write_json(args.json, {"benchmark": "rl_step", "settings": asdict(settings), "seeds": seeds,
                               "machine": machine(),
                               "load_average": load, "runs": runs, "accuracy": accuracy, "summary": summary,
                               "profile": profile})
    return 0


if __name__ == "__main__":
    sys.exit(main())
