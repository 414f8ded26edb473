"""``rlvr eval``: a model or checkpoint on a task's held-out problems: pass@k, mean reward, per-problem JSONL.

    result = evaluate({"recipe": "arithmetic"}, checkpoint="runs/arithmetic-.../", num_samples=8, k=[1, 4])

``checkpoint`` is a state path (``save_state``), a run folder (its last checkpoint) or None (the base model). With
one sample per problem decoding is greedy; with more, samples are drawn at the config's temperature and pass@k is
the unbiased estimator of Chen et al. (2021): ``1 - C(n - c, k) / C(n, k)`` for ``c`` correct of ``n``, averaged
over problems. A sample is correct when its reward is at least ``correct_at`` (1.0: full marks). ``clipped`` is the
share of samples cut at ``max_tokens`` (the run's own budget when ``config`` is a run's).

What it is not: the loop's in-training evaluation (``rlvr.rl.loop.evaluate``, greedy pass@1 only).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlvr.app.progress import ClippedWatch, StepProgress
from rlvr.app.settings import as_config
from rlvr.errors import CheckpointNotFoundError, ConfigurationError
from rlvr.fileio import jsonl_line, write_atomic

logger = logging.getLogger("rlvr.eval")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` samples drawn without replacement from ``n`` (``c`` correct) is."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise ConfigurationError(f"pass_at_k(n={n}, c={c}, k={k}): need 0 <= c <= n and 1 <= k <= n")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def resolve_checkpoint(checkpoint: str | Path) -> str:
    """A state path from a state path or a run folder (its last checkpoint)."""
    from rlvr.rl.checkpoints import last_checkpoint

    path = Path(str(checkpoint))
    if path.is_dir() and (path / "checkpoints.jsonl").exists():
        entry = last_checkpoint(path)
        if entry is None:
            raise CheckpointNotFoundError(f"{path}: checkpoints.jsonl has no complete entry")
        return entry["state_path"]
    if path.is_dir() and (path / "config.yaml").exists():
        raise CheckpointNotFoundError(f"run folder {path} has no checkpoint yet (no checkpoints.jsonl)")
    return str(checkpoint)


def evaluate(config: Any, checkpoint: str | Path | None = None, *, num_samples: int = 1,
             k: Sequence[int] = (1,), problems: int | None = None, correct_at: float = 1.0,
             out: str | Path | None = None, source: Any = None, console: Any = None) -> dict[str, Any]:
    """Evaluate on the held-out split of ``config``'s task (a TrainConfig, a dict of settings or a YAML path);
    writes per-problem records to ``out`` (JSONL). ``console`` (a rich Console): shows the problems answered so far,
    with the rate and ETA (``progress.py``); None: quiet."""
    from rlvr import types
    from rlvr.app.sources import build_source
    from rlvr.client import ServiceClient
    from rlvr.rewards import RewardItem, RewardRunner

    if num_samples < 1:
        raise ConfigurationError(f"num_samples={num_samples}: must be >= 1")
    bad = [x for x in k if not 1 <= x <= num_samples]
    if bad:
        raise ConfigurationError(f"k={list(k)}: each k must be between 1 and num_samples={num_samples}")
    config = as_config(config)
    source = source or build_source(config)
    from rlvr.rl.envs import RLDataset  # here, not at import: rlvr train checks a config without loading torch
    from rlvr.rl.problems import future_done

    if not isinstance(source, RLDataset):  # the problems first: a short split is told before the model loads
        asked = problems or config.eval_problems
        chosen = source.problems(source.eval_split(), limit=asked)
        if not chosen:
            raise ConfigurationError(f"the {source.eval_split()!r} split of recipe {config.recipe!r} holds no "
                                     "problems to evaluate; give data with held-out problems (task.test_fraction, "
                                     "or a test split)")
        if len(chosen) < asked:
            _warn(console, f"warning: {asked} problems asked, but the {source.eval_split()!r} split holds "
                           f"{len(chosen)}: evaluating {len(chosen)}")
    service = ServiceClient(numerics=config.requested_numerics())  # a run's numerics settings, as it trained
    if checkpoint is None:
        sampler = service.create_sampling_client(base_model=config.base_model)
        tokenizer = sampler.get_tokenizer()
    else:
        training_client = service.create_training_client_from_state(resolve_checkpoint(checkpoint))
        sampler = training_client.save_weights_and_get_sampling_client()
        tokenizer = training_client.get_tokenizer()
    if isinstance(source, RLDataset):  # an env recipe: its held-out games, played greedily
        return _evaluate_envs(config, source, sampler, tokenizer, num_samples, problems, console)
    params = types.SamplingParams(max_tokens=config.max_tokens, seed=config.seed,
                                  temperature=0.0 if num_samples == 1 else config.temperature)
    futures = [sampler.sample(types.ModelInput.from_ints(source.render_ids(p, tokenizer)), num_samples, params)
               for p in chosen]
    responses, clipped = [], 0
    with StepProgress(console, "answered", len(chosen), unit="problem") if console else contextlib.nullcontext() \
            as progress:
        for future in futures:  # in order; the engine answers them in batches, shown when a batch is in
            sequences = future.result().sequences
            responses.append([tokenizer.decode(s.tokens, skip_special_tokens=True) for s in sequences])
            clipped += sum(s.stop_reason == "length" for s in sequences)
            if progress is not None and (len(responses) == len(futures) or not future_done(futures[len(responses)])):
                progress.update(len(responses), "")
    with RewardRunner(source.reward(), timeout=config.reward_timeout) as runner:
        scores = runner.score([RewardItem(p.question, r, p.reward_meta())
                               for p, group in zip(chosen, responses, strict=True) for r in group])
    records = []
    for i, (problem, group) in enumerate(zip(chosen, responses, strict=True)):
        rewards = scores.scores[i * num_samples:(i + 1) * num_samples]
        correct = sum(r is not None and r >= correct_at for r in rewards)
        records.append({"problem_id": problem.id, "question": problem.question, "answer": problem.answer,
                        "responses": group, "rewards": rewards, "correct": correct,
                        **{f"pass@{x}": pass_at_k(num_samples, correct, x) for x in k}})
    scored = [r for r in scores.scores if r is not None]
    result: dict[str, Any] = {
        "problems": len(records), "samples_per_problem": num_samples,
        "mean_reward": sum(scored) / len(scored) if scored else math.nan,
        "reward_failures": scores.failed,
        "clipped": clipped / max(len(chosen) * num_samples, 1),
        **{f"pass@{x}": sum(r[f"pass@{x}"] for r in records) / max(len(records), 1) for x in k},
    }
    if console is not None:
        ClippedWatch(console, config.max_tokens).check("eval", result["clipped"], "the answers")
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, b"".join(jsonl_line(r) for r in records))
        result["records"] = str(out)
    return result


def _evaluate_envs(config: Any, dataset: Any, sampler: Any, tokenizer: Any, num_samples: int,
                   problems: int | None, console: Any = None) -> dict[str, Any]:
    """An env dataset's held-out groups (the first ``problems``), one greedy episode each, as the loop evaluates
    them: ``test/reward/mean``, ``test/correct`` (episode reward >= 1), ``test/turns`` (no per-game records)."""
    if num_samples != 1:
        raise ConfigurationError(f"samples={num_samples}: recipe {config.recipe!r} is evaluated greedily, one "
                                 "episode per held-out game; pass@k is for problem recipes")
    dataset.bind_tokenizer(tokenizer)
    groups = list(dataset.test_groups())[:problems or None]
    if not groups:
        raise ConfigurationError(f"recipe {config.recipe!r} has no held-out groups (eval_problems=0?)")
    if problems and len(groups) < problems:
        _warn(console, f"warning: {problems} problems asked, but recipe {config.recipe!r} holds {len(groups)} "
                       f"held-out games (eval_problems={config.eval_problems}): evaluating {len(groups)}")
    from rlvr.rl.envs import evaluate_envs

    return {"problems": len(groups), **evaluate_envs(sampler, groups, config.max_tokens, config.max_turns)}


def _warn(console: Any, text: str) -> None:
    """``text`` on ``console`` (rlvr eval's stderr), else as a logged warning."""
    if console is not None:
        console.print(text, style="yellow", highlight=False, markup=False, soft_wrap=True)
    else:
        logger.warning("%s", text.removeprefix("warning: "))
