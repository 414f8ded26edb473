"""reasoning-gym's own scoring as an rlvr reward: ``reasoning_gym`` calls the dataset's ``score_answer``.

    reward = resolve_reward("reasoning_gym", answer_format="plain")
    reward(question, "292", problem.reward_meta())      # the dataset's score_answer("292", entry)

What it is: the glue between rlvr's rewards and the optional ``reasoning-gym`` package (``pip install
'rlvr[reasoning-gym]'``): :func:`build_dataset` makes a dataset from a plain spec ``{"name", "config", "seed",
"size"}`` (with errors that name the bad dataset or config key and the fix) and caches it per process, and
:class:`ReasoningGymScore` extracts the answer from a response and scores it with that dataset's
``score_answer(answer, entry)``. The problem's ``reward_meta()`` carries the spec (``rg_dataset``) and the
dataset's entry (``rg_entry``), both plain picklable data, so the reward runs in the runner's killable workers
with its timeout and failure counting: a scorer that raises is an error, one that hangs a timeout, neither a 0.

What it is not: the problem source (``rlvr.tasks.reasoning_gym``). A response without an answer in the asked
format is scored as reasoning-gym scores ``None`` (0 for its datasets), which is a wrong answer, not a failure.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from typing import Any

from rlvr.errors import ConfigurationError, RewardError
from rlvr.rewards.math import extract_answer as final_answer
from rlvr.rewards.registry import Reward, register_reward

INSTALL = "pip install 'rlvr[reasoning-gym]'"
LIST_NAMES = "python -c 'import reasoning_gym.factory as f; print(sorted(f.DATASETS))'"

ANSWER_FORMATS = ("final", "answer_tag", "plain")
"""Where a response gives its answer: ``final``, rlvr's final-answer convention for numbers (``math_correct``'s
``extract_answer``: the last ``\\boxed{}``, else a final-answer line (``#### x``, "the answer is x"), else the whole
reply; never a number picked out of prose);
``answer_tag``, reasoning-gym's ``<answer>...</answer>`` (the last one); ``plain``, the whole response (reasoning-gym's
bare answer). Text answers (words, lists) need ``answer_tag`` or ``plain``."""

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
_DATASETS: dict[str, Any] = {}  # spec as sorted JSON -> dataset; forked reward workers inherit what is built


def import_reasoning_gym() -> Any:
    """The ``reasoning_gym`` module, or a ConfigurationError naming the extra to install."""
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ConfigurationError(f"reasoning-gym is not installed ({exc}); install it with {INSTALL}") from None
    return reasoning_gym


def dataset_names() -> list[str]:
    """The names of reasoning-gym's datasets (``composite`` among them), sorted."""
    import_reasoning_gym()
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def build_dataset(spec: Mapping[str, Any]) -> Any:
    """The reasoning-gym dataset ``spec`` describes (``name``; ``config``, ``seed``, ``size`` optional), built once
    per process. A composite is ``name="composite"`` with ``config={"datasets": [{"name", "weight", "config"},
    ...]}`` (``weight`` defaults to 1, ``config`` to ``{}``)."""
    key = json.dumps(dict(spec), sort_keys=True, default=repr)
    if key not in _DATASETS:
        _DATASETS[key] = _create(spec)
    return _DATASETS[key]


def _create(spec: Mapping[str, Any]) -> Any:
    rg = import_reasoning_gym()
    name, config = spec.get("name"), dict(spec.get("config") or {})
    where = f"reasoning-gym dataset {name!r}"
    names = dataset_names()
    if not isinstance(name, str) or name not in names:
        close = difflib.get_close_matches(str(name), names, n=3, cutoff=0.6)
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
        raise ConfigurationError(f"reasoning-gym has no dataset {name!r}{hint}; set task.name to one of its "
                                 f"{len(names)} names, listed by {LIST_NAMES}")
    for key in ("seed", "size"):
        if key in config:
            raise ConfigurationError(f"{where}: config.{key} is set by rlvr (task.seed, task.test_seed, "
                                     f"task.num_train, task.num_test); remove it from task.config")
        if spec.get(key) is not None:
            config[key] = spec[key]
    if name == "composite":
        config["datasets"] = _composite_specs(config.get("datasets"))
        for part in config["datasets"]:
            _create({"name": part.name, "config": part.config, "size": 1})  # names and configs checked one by one
    try:
        return rg.create_dataset(name, **config)
    except TypeError as exc:
        from reasoning_gym.factory import DATASETS

        fields = sorted(set(getattr(DATASETS[name][1], "__dataclass_fields__", {})) - {"seed", "size"})
        raise ConfigurationError(f"{where}: {exc}; its config keys are {fields} (task.config)") from None
    except (AssertionError, ValueError) as exc:
        given = {k: v for k, v in config.items() if k not in ("seed", "size")}
        raise ConfigurationError(f"{where}: its config {given} is refused: {exc or type(exc).__name__}; fix "
                                 "task.config") from None


def _composite_specs(datasets: Any) -> list[Any]:
    from reasoning_gym.composite import DatasetSpec

    usage = ("a composite takes task.config={datasets: [{name: NAME, weight: 1.0, config: {...}}, ...]} (weight "
             "and config optional)")
    if not isinstance(datasets, list) or not datasets:
        raise ConfigurationError(f"reasoning-gym composite: config.datasets={datasets!r}; {usage}")
    out = []
    for part in datasets:
        if not isinstance(part, Mapping) or "name" not in part or set(part) - {"name", "weight", "config"}:
            raise ConfigurationError(f"reasoning-gym composite: dataset entry {part!r}; {usage}")
        weight = part.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise ConfigurationError(f"reasoning-gym composite: {part['name']!r} has weight {weight!r}; weights "
                                     "must be positive numbers")
        out.append(DatasetSpec(name=part["name"], weight=float(weight), config=dict(part.get("config") or {})))
    return out


def extract_answer(response: str, answer_format: str) -> str | None:
    """The answer ``response`` gives in ``answer_format`` (see :data:`ANSWER_FORMATS`); None when it gives none."""
    if answer_format == "final":
        return final_answer(response)
    if answer_format == "answer_tag":
        tagged = [t.strip() for t in _ANSWER_TAG.findall(response) if t.strip()]
        return tagged[-1] if tagged else None
    return response.strip() or None


@register_reward("reasoning_gym")
class ReasoningGymScore(Reward):
    """The reasoning-gym dataset's ``score_answer`` on the answer extracted from the response.

    Args:
        answer_format: where the answer is (see :data:`ANSWER_FORMATS`); match the source's instruction.

    Meta: ``rg_dataset`` (the dataset spec) and ``rg_entry`` (the dataset's entry), as
    ``ReasoningGymSource`` problems' ``reward_meta()`` gives them.
    """

    name = "reasoning_gym"

    def __init__(self, answer_format: str = "final") -> None:
        if answer_format not in ANSWER_FORMATS:
            raise ConfigurationError(f"reasoning_gym reward: answer_format={answer_format!r}; choose one of "
                                     f"{list(ANSWER_FORMATS)}")
        self.answer_format = answer_format

    def __call__(self, prompt: str, response: str, meta: Mapping[str, Any] | None = None) -> float:
        if not meta or "rg_entry" not in meta or "rg_dataset" not in meta:
            raise RewardError("reward 'reasoning_gym' needs meta with 'rg_entry' and 'rg_dataset' (a "
                              "ReasoningGymSource problem's reward_meta())")
        dataset = build_dataset(meta["rg_dataset"])
        return dataset.score_answer(extract_answer(response, self.answer_format), meta["rg_entry"])
