"""What a reward is, and how a name finds one: :class:`Reward`, ``@register_reward`` and ``resolve_reward``.

What it is: the contract every reward follows -- a callable ``(prompt, response, meta=None) -> float`` that
returns a finite number or raises -- and the table of named rewards. Three kinds of object can be registered:

* a plain function ``(prompt, response, meta=None) -> float`` (the seed cookbook's ``@register_reward`` form);
  ``resolve_reward(name, **kwargs)`` binds ``kwargs`` as extra keyword arguments of every call;
* a :class:`Reward` subclass: ``resolve_reward(name, **kwargs)`` builds ``cls(**kwargs)``;
* a factory (``factory=True``): a function of ``**kwargs`` that returns a reward.

``resolve_reward("package.module:function")`` imports a reward function that is not registered.

What it is not: the built-in rewards (``builtin``, ``math``, ``code``) or the machinery that runs rewards with
timeouts in killable workers (``runner``). Calling a reward directly runs it in the calling thread, unbounded;
the training loop scores batches through :func:`rlvr.rewards.score_batch`.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import logging
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlvr.errors import ConfigurationError, RewardError, UnknownRewardError

logger = logging.getLogger("rlvr.rewards")

RewardFn = Callable[..., float]
"""Any callable ``(prompt: str, response: str, meta: Mapping | None = None) -> float``."""



@dataclass(frozen=True)
class RewardItem:
    """One response to score, with what its reward needs to know."""

    prompt: str
    """The prompt the response answers (the question text, or the rendered prompt)."""

    response: str
    """The model's response text (decoded, without the prompt)."""

    meta: Mapping[str, Any] | None = field(default=None)
    """Reference data for the reward: ``answer``, ``tests``, ``test_setup_code``... (see each reward)."""


def as_item(item: RewardItem | Mapping[str, Any] | Sequence[Any]) -> RewardItem:
    """Accept a :class:`RewardItem`, a mapping with ``prompt``/``response``/``meta``, or a tuple
    ``(prompt, response)`` / ``(prompt, response, meta)``."""
    if isinstance(item, RewardItem):
        return item
    if isinstance(item, Mapping):
        unknown = set(item) - {"prompt", "response", "meta"}
        if unknown or "response" not in item:
            raise ConfigurationError(f"reward item keys {sorted(item)}: a mapping item needs 'response' and may have "
                                     "'prompt' and 'meta', nothing else")
        return RewardItem(str(item.get("prompt", "")), item["response"], item.get("meta"))
    if isinstance(item, Sequence) and not isinstance(item, str) and len(item) in (2, 3):
        return RewardItem(*item)
    raise ConfigurationError(f"reward item {item!r:.80}: give a RewardItem, a mapping with 'prompt', 'response' "
                             "and 'meta', or a tuple (prompt, response[, meta])")


def check_value(value: Any, name: str) -> float:
    """``value`` as a float; raises :class:`RewardError` unless it is a finite real number (bools count)."""
    if isinstance(value, numbers.Real):
        number = float(value)
        if math.isfinite(number):
            return number
        raise RewardError(f"reward {name!r} returned {number}; a reward must be a finite number")
    raise RewardError(f"reward {name!r} returned {value!r:.80} ({type(value).__name__}); a reward must return a "
                      "number (return 0.0 explicitly for a wrong answer, raise for a response it cannot judge)")


class Reward:
    """Base class of rlvr's rewards: a named callable ``(prompt, response, meta=None) -> float``.

    Subclasses implement :meth:`__call__`. A reward made of parts (``combine``, ``format_correct``) subclasses
    :class:`CompositeReward` instead, so the batch scorer can run and report each part separately.
    """

    name: str = "reward"
    """The name metrics and failure reports use."""

    inline: bool = False
    """True for rewards that bound their own running time (e.g. ``code_tests``, whose sandbox kills programs at
    their timeout), so the batch scorer runs them in the calling process, all items at once, via
    :meth:`score_many`. False (the default): each call runs in a killable worker."""

    def __call__(self, prompt: str, response: str, meta: Mapping[str, Any] | None = None) -> float:
        raise NotImplementedError

    def score_many(self, items: Sequence[RewardItem]) -> list[float | BaseException]:
        """Score ``items`` in this process; a failed item's entry is the exception, never a number."""
        results: list[float | BaseException] = []
        for item in items:
            try:
                results.append(check_value(self(item.prompt, item.response, item.meta), self.name))
            except Exception as exc:
                results.append(exc)
        return results

    def __repr__(self) -> str:
        return f"<reward {self.name}>"


class CompositeReward(Reward):
    """A reward computed from the scores of named parts. If any part fails, the whole item fails."""

    def parts(self) -> dict[str, Reward]:
        """The parts by name (names are unique within one composite); the same objects on every call."""
        raise NotImplementedError

    def merge(self, values: Mapping[str, float]) -> float:
        """The reward from each part's score."""
        raise NotImplementedError

    def __call__(self, prompt: str, response: str, meta: Mapping[str, Any] | None = None) -> float:
        values = {name: check_value(part(prompt, response, meta), name) for name, part in self.parts().items()}
        return self.merge(values)


class FunctionReward(Reward):
    """A plain reward function, with keyword arguments bound to every call, checked to return a number."""

    def __init__(self, fn: RewardFn, name: str | None = None, kwargs: Mapping[str, Any] | None = None) -> None:
        if not callable(fn):
            raise ConfigurationError(f"reward {name or fn!r}: {fn!r} is not callable; a reward is a function "
                                     "(prompt, response, meta=None) -> float")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or type(fn).__name__
        self.kwargs = dict(kwargs or {})
        if self.kwargs:
            try:
                inspect.signature(fn).bind("prompt", "response", None, **self.kwargs)
            except TypeError as exc:
                raise ConfigurationError(f"resolve_reward({self.name!r}, {_kwargs_text(self.kwargs)}): {exc}; "
                                         f"the function's signature is {self.name}{inspect.signature(fn)}") from None
            except ValueError:  # builtins without a signature: let the call tell
                pass
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn

    def __call__(self, prompt: str, response: str, meta: Mapping[str, Any] | None = None) -> float:
        return check_value(self.fn(prompt, response, meta, **self.kwargs), self.name)


@dataclass(frozen=True)
class _Entry:
    target: Any
    kind: str  # "function", "class", "factory" or "instance"


_REGISTRY: dict[str, _Entry] = {}


def _kwargs_text(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in kwargs.items())


def _origin(obj: Any) -> tuple[str, str]:
    return getattr(obj, "__module__", ""), getattr(obj, "__qualname__", repr(obj))


def register_reward(name: str, *, factory: bool = False, override: bool = False) -> Callable[[Any], Any]:
    """Register a reward under ``name``; use as a decorator. Returns the decorated object unchanged.

    ``factory=True`` marks a function of keyword arguments that *returns* a reward. Registering a name again
    from the same module and function (a re-run notebook cell, a reloaded module) replaces the entry; taking a
    name that another object holds needs ``override=True``.
    """
    if not isinstance(name, str) or not name.strip() or ":" in name:
        raise ConfigurationError(f"register_reward(name={name!r}): the name must be a non-empty string without ':'")

    def decorate(obj: Any) -> Any:
        if isinstance(obj, type) and issubclass(obj, Reward):
            kind = "class"
        elif isinstance(obj, Reward):
            kind = "instance"
        elif callable(obj):
            kind = "factory" if factory else "function"
        else:
            raise ConfigurationError(f"register_reward({name!r}) was given {obj!r:.80}, which is not callable")
        old = _REGISTRY.get(name)
        if old is not None and not override and _origin(old.target) != _origin(obj):
            module, qualname = _origin(old.target)
            raise ConfigurationError(f"register_reward({name!r}): the name is taken by {module}.{qualname}; pick "
                                     "another name or pass override=True to replace it")
        _REGISTRY[name] = _Entry(obj, kind)
        return obj

    return decorate


def unregister_reward(name: str) -> None:
    """Remove ``name`` from the registry (tests, notebooks); UnknownRewardError when it is not there."""
    if name not in _REGISTRY:
        raise _unknown(name)
    del _REGISTRY[name]


def list_rewards() -> list[str]:
    """The registered reward names, sorted."""
    return sorted(_REGISTRY)


def _unknown(name: str) -> UnknownRewardError:
    names = list_rewards()
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return UnknownRewardError(f"unknown reward {name!r}.{hint} Registered rewards: {', '.join(names)}. Register "
                              "your own with @register_reward(name), or give 'package.module:function'.")


def _import_target(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"resolve_reward({spec!r}): cannot import module {module_name!r} ({exc}); "
                                 "check the name and that it is on sys.path") from exc
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigurationError(f"resolve_reward({spec!r}): module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    return target


def resolve_reward(name: str | Reward | RewardFn, **kwargs: Any) -> Reward:
    """The reward registered as ``name``, configured with ``kwargs``; see the module docstring for the rules.

    Also accepts ``"package.module:function"``, a :class:`Reward` (returned as is) or a plain callable (wrapped).
    Raises :class:`UnknownRewardError` for a name nobody registered, :class:`ConfigurationError` for bad kwargs.
    """
    if isinstance(name, Reward):
        if kwargs:
            raise ConfigurationError(f"resolve_reward({name!r}, {_kwargs_text(kwargs)}): a Reward object is already "
                                     "configured; pass keyword arguments only with a name")
        return name
    if callable(name) and not isinstance(name, str):
        return FunctionReward(name, kwargs=kwargs)
    if not isinstance(name, str):
        raise ConfigurationError(f"resolve_reward(name={name!r}): give a reward name, a Reward or a function")
    if ":" in name:
        entry = _Entry(_import_target(name), "function")
        if isinstance(entry.target, type) and issubclass(entry.target, Reward):
            entry = _Entry(entry.target, "class")
        elif isinstance(entry.target, Reward):
            entry = _Entry(entry.target, "instance")
    elif name in _REGISTRY:
        entry = _REGISTRY[name]
    else:
        raise _unknown(name)
    label = name.rpartition(":")[2] or name
    if entry.kind == "function":
        return FunctionReward(entry.target, name=label, kwargs=kwargs)
    if entry.kind == "instance":
        return resolve_reward(entry.target, **kwargs)
    try:
        inspect.signature(entry.target).bind(**kwargs)
    except TypeError as exc:
        raise ConfigurationError(f"resolve_reward({name!r}, {_kwargs_text(kwargs)}): {exc}; "
                                 f"its parameters are {inspect.signature(entry.target)}") from None
    except ValueError:  # no signature to check against: let the call tell
        pass
    made = entry.target(**kwargs)
    reward = made if isinstance(made, Reward) else FunctionReward(made, name=label)
    if entry.kind == "factory" and reward.name in ("reward", "<lambda>"):
        reward.name = label
    return reward
