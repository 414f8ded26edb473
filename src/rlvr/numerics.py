"""The numerics policy: how an engine computes, decided once, when a run (or a server) builds its engine.

    policy = Numerics.resolve(precision=config.precision, matmul=config.matmul)  # config > environment
    service = rlvr.ServiceClient(numerics=policy)     # the engine resolves the machine's part
    service.engine.numerics.as_record()               # what the run writes into config.yaml and each checkpoint

A ``Numerics`` holds five settings, each taken from the config (an argument here), else from its environment
variable, else left to the machine (``None``, or the default named below):

- ``precision`` (``RLVR_PRECISION``): what frozen base-model matmuls multiply in, ``float32`` or ``bfloat16``;
  None: the device's default (a training run: ``run_default_precision``, by the model's size);
- ``matmul`` (``RLVR_MATMUL``): the kernel of the CPU's frozen products (``rlvr.engine.cpu.packed``); None: the
  machine's fixed preference; ``timed``: the fastest, timed once per process;
- ``attention`` (``RLVR_ATTENTION``): the CPU decoder's attention, ``auto``, ``torch`` or ``fused``;
- ``heap`` (``RLVR_HEAP``): a CPU engine's C heap, ``reuse`` or ``system`` (``rlvr.engine.cpu.heap``);
- ``threads`` (``RLVR_THREADS``): a fixed thread count; None: share the cores with other rlvr processes;

and ``device`` (``RLVR_DEVICE``: ``auto``, ``cpu``, ``cuda``, ``cuda:N``; checked by ``rlvr.engine.device``).

An engine resolves the rest on its machine (``rlvr.engine.device.resolve_numerics``): the concrete precision and
device, and the matmul kinds ``sampler_kind`` and ``trainer_kind``, the kernels of the sampler's and the trainer's
frozen products (``rlvr.engine.cpu.packed``; the GPU paths: ``plain``). Each pair gives a seed its own trajectory, so
a resume compares them and the precision with what the run recorded (``check_resume``); the attention, heap,
threads and device are recorded but not compared.

This module is the only reader of those environment variables; everything below it takes the policy of the engine
it works for (``active``). Torch-free: the run's config and the loop read it without loading the engine.

Not here: whether this machine can do what the policy asks (the engine checks that when it is created), the kernels.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.errors import ConfigurationError

__all__ = ["AUTO_BFLOAT16_PARAMS", "ENVIRONMENT", "MATMULS", "PRECISIONS", "Numerics", "activated", "active",
           "base_precision", "check_resume", "run_default_precision"]

PRECISIONS = ("float32", "bfloat16")
MATMUL_KINDS = ("mkldnn", "mkl", "fma", "bf16x3", "bf16x1")
"""The kernels ``matmul`` can fix, besides ``plain`` (a plain ``F.linear``); what this machine has is the engine's to
check."""
MATMULS = ("plain", *MATMUL_KINDS, "timed")
ATTENTIONS = ("auto", "torch", "fused")
HEAPS = ("reuse", "system")
ENVIRONMENT = {"precision": "RLVR_PRECISION", "matmul": "RLVR_MATMUL", "attention": "RLVR_ATTENTION",
               "heap": "RLVR_HEAP", "threads": "RLVR_THREADS", "device": "RLVR_DEVICE"}
"""Each setting's environment variable."""
COMPARED = ("precision", "sampler_kind", "trainer_kind")
"""The recorded fields a resume must match: each changes the run's arithmetic."""
AUTO_BFLOAT16_PARAMS = 300_000_000
"""Linear-layer weights from which a training run picks bfloat16 on a CPU that multiplies it in hardware, when no
precision is set (``run_default_precision``): Qwen2.5-0.5B has 494M, SmolLM2-135M 135M."""


@dataclass(frozen=True)
class Numerics:
    """How an engine computes (the module docstring): five settings and the device, and once an engine has resolved
    them on its machine, the concrete precision, device and matmul kinds. Build one with ``resolve``."""

    precision: str | None = None
    """``float32`` or ``bfloat16``; None: the device's default (resolved: never None)."""
    matmul: str | None = None
    """The CPU's frozen-product kernel: plain, mkldnn, mkl, fma, bf16x3, bf16x1 or timed; None: the machine's fixed
    preference."""
    attention: str = "auto"
    """The CPU decoder's attention: auto (the fused kernel where it runs), torch or fused (an error where not)."""
    heap: str = "reuse"
    """A CPU engine's C heap: reuse (large freed blocks reused) or system (glibc's defaults)."""
    threads: int | None = None
    """A CPU engine's fixed thread count; None: shared with the other rlvr processes computing."""
    device: str | None = None
    """auto, cpu, cuda or cuda:N; None: auto (resolved: the device's name, such as cpu or cuda:0)."""
    sampler_kind: str | None = None
    """Resolved: the kernel of the sampler's frozen products (None until an engine resolves the policy)."""
    trainer_kind: str | None = None
    """Resolved: the kernel of the trainer's frozen forward products (None until an engine resolves the policy)."""
    from_environment: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    """The settings taken from the environment: errors name their variable, not the config key."""

    def __post_init__(self) -> None:
        for name, choices in (("precision", PRECISIONS), ("matmul", MATMULS)):
            value = getattr(self, name)
            if value is not None and value not in choices:
                raise ConfigurationError(f"{self.source(name)}={value!r}: {_choices(name, value)}")
        for name, choices in (("attention", ATTENTIONS), ("heap", HEAPS)):
            value = getattr(self, name)
            if value not in choices:
                raise ConfigurationError(f"{self.source(name)}={value!r}: {_choices(name, value)}")
        threads = self.threads
        if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
            raise ConfigurationError(f"{self.source('threads')}={threads!r}: {_choices('threads', threads)}")
        if self.device is not None and not isinstance(self.device, str):
            raise ConfigurationError(f"{self.source('device')}={self.device!r} is not a device name: choose auto, "
                                     "cpu, cuda or cuda:N (N: a GPU index)")

    @classmethod
    def resolve(cls, *, precision: str | None = None, matmul: str | None = None, attention: str | None = None,
                heap: str | None = None, threads: int | str | None = None, device: str | None = None,
                environ: Mapping[str, str] | None = None) -> Numerics:
        """The policy from the given settings (a config's), each unset one (None) from its environment variable
        (``environ``, default ``os.environ``; an empty variable counts as unset), else the default. A bad value is a
        ConfigurationError naming the key or the variable and the choices."""
        environ = os.environ if environ is None else environ
        given = {"precision": precision, "matmul": matmul, "attention": attention, "heap": heap, "threads": threads,
                 "device": device}
        values: dict[str, Any] = {}
        taken: set[str] = set()
        for name, value in given.items():
            if value is None and (environ.get(ENVIRONMENT[name]) or "").strip():
                value, _ = environ[ENVIRONMENT[name]].strip(), taken.add(name)
            if value is not None:
                values[name] = value
        if "threads" in taken:
            text = values["threads"]
            if not text.isdigit() or int(text) < 1:
                raise ConfigurationError(f"RLVR_THREADS={text!r}: {_choices('threads', text)}")
            values["threads"] = int(text)
        return cls(**values, from_environment=frozenset(taken))

    def source(self, name: str) -> str:
        """What set the setting ``name``: its environment variable, or the config key."""
        return ENVIRONMENT[name] if name in self.from_environment else name

    @property
    def resolved(self) -> bool:
        """Whether an engine has resolved the policy on its machine (``rlvr.engine.device.resolve_numerics``)."""
        return self.sampler_kind is not None

    def settings(self) -> dict[str, Any]:
        """The settings as given to ``resolve`` (precision, matmul, attention, heap, threads, device)."""
        return {name: getattr(self, name) for name in ENVIRONMENT}

    def as_record(self) -> dict[str, Any]:
        """What a run writes into ``config.yaml`` (its ``numerics:`` mapping) and each checkpoint entry: every field
        but ``from_environment``, as plain YAML/JSON values."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "from_environment"}


def _choices(name: str, value: Any) -> str:
    """The fix for a bad ``value`` of setting ``name``: its choices, and the nearest one."""
    if name == "threads":
        return "set it to a positive number of threads (such as 2), or unset it to share the cores with other rlvr " \
               "processes"
    choices = {"precision": PRECISIONS, "attention": ATTENTIONS, "heap": HEAPS, "matmul": MATMULS}[name]
    close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    if name == "matmul":
        return (f"choose plain or one of {list(MATMUL_KINDS)} (the engine checks which this machine has), or timed, "
                f"or unset it for the fixed preference{hint}")
    if name == "attention":
        return f"choose auto, torch or fused{hint}"
    if name == "heap":
        return f"use 'reuse' (the default: large freed blocks reused) or 'system' (glibc's defaults), or unset it{hint}"
    return f"choose one of {list(PRECISIONS)}{hint}"


# -- the active policy ---------------------------------------------------------------------------------------------

_local = threading.local()


def active() -> Numerics:
    """The policy of the engine whose work runs on this thread (its worker installs it, ``activated``); outside any
    engine's work (a kernel called directly, as the kernel tests do), the environment's (``Numerics.resolve()``)."""
    policy = getattr(_local, "policy", None)
    return policy if policy is not None else Numerics.resolve()


@contextlib.contextmanager
def activated(policy: Numerics) -> Iterator[Numerics]:
    """``active()`` is ``policy`` on this thread while the block runs (an engine's job, its model loading)."""
    before = getattr(_local, "policy", None)
    _local.policy = policy
    try:
        yield policy
    finally:
        _local.policy = before


# -- precision -----------------------------------------------------------------------------------------------------


def base_precision(precision: str | None = None) -> str:
    """What frozen base weights are multiplied in on the CPU: ``precision`` if given, else ``RLVR_PRECISION``, else
    float32 (a name only: whether this CPU can is the engine's check).

    - ``"float32"``: float32 throughout, except the sampler's decode products on a CPU with AMX (three bfloat16
      products each, ~16 bits: see ``rlvr.engine.cpu.packed``); the sampler's logprobs equal the trainer's to ~1e-5
      per token.
    - ``"bfloat16"``: every frozen base matmul (trainer and sampler alike) takes bfloat16 inputs and weights on
      oneDNN and rounds its result to bfloat16; the residual stream, norms, attention, LoRA and logits stay float32.
      The sampler and the trainer then agree only to bfloat16 rounding.
    """
    return Numerics.resolve(precision=precision).precision or "float32"


def run_default_precision(linear_params: int | None, native_bfloat16: bool) -> str:
    """The precision a training run takes when neither ``precision`` nor ``RLVR_PRECISION`` sets one: bfloat16 for a
    model of at least ``AUTO_BFLOAT16_PARAMS`` linear weights on a CPU that multiplies bfloat16 in hardware (AMX or
    AVX512-BF16), float32 otherwise (a small model, an unknown size, a CPU without it)."""
    if native_bfloat16 and linear_params is not None and linear_params >= AUTO_BFLOAT16_PARAMS:
        return "bfloat16"
    return "float32"


# -- a resume's check ------------------------------------------------------------------------------------------------


def check_resume(recorded: Mapping[str, Any] | None, current: Numerics, run_dir: str | Path,
                 accept: bool = False) -> None:
    """Refuse to resume the run in ``run_dir``, which recorded ``recorded`` (its run record's ``numerics``), with the
    resolved policy ``current`` when they differ in precision or matmul kinds (``COMPARED``: each gives a seed its
    own trajectory), naming both and the override that accepts it; ``accept`` (the ``accept_numerics`` key) accepts
    it. Fields a run did not record (a folder from before they were) are not compared."""
    if not recorded or accept:
        return
    now = current.as_record()
    differ = [name for name in COMPARED if recorded.get(name) is not None and recorded[name] != now[name]]
    if not differ:
        return
    if "precision" in differ:  # each precision has its own kinds: the precision says it all
        was, will = f"precision={recorded['precision']}", f"precision={now['precision']}"
        fix = f"set precision={recorded['precision']}"
    else:
        was = f"matmul kinds sampler={recorded.get('sampler_kind')}, trainer={recorded.get('trainer_kind')}"
        will = f"matmul kinds sampler={now['sampler_kind']}, trainer={now['trainer_kind']}"
        setting = recorded.get("matmul")
        fix = (f"set matmul={setting}" if setting else "unset matmul and RLVR_MATMUL, on a machine like the run's "
               "(it took the machine's fixed preference)")
    raise ConfigurationError(f"{run_dir} trained with {was}; resuming it with {will} would change its arithmetic "
                             f"half-way: {fix}, or resume with accept_numerics=true to continue in the new numerics "
                             "(and record them), or start a new run")
