"""What the benchmarks share: a description of the machine (its load, its matmul and memory rates), the models
they run (the embedded one, or published shapes with random weights), result files and progress bars.

Not here: any benchmark's measurement (each lives in its own script) or the ``python -m bench`` driver
(``__main__.py``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

RESULTS = Path(__file__).resolve().parent / "results"
"""Where ``python -m bench`` writes its JSON files."""

PACKAGES = ("torch", "transformers", "peft", "trl", "accelerate", "tinker", "rlvr")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (runnable processes; above the core count, work is queueing)."""
    return [round(x, 2) for x in os.getloadavg()]


def versions() -> dict[str, str | None]:
    """Installed versions of the packages the benchmarks compare (None: not installed)."""
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine() -> dict[str, Any]:
    """CPU model, cores, torch threads, Python and package versions, and the load average now."""
    import torch

    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions(),
        "load_average": load_average(),
    }


def today() -> str:
    """Today's date as YYYY-MM-DD (local time), for result file names."""
    return datetime.date.today().isoformat()


def write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """Write ``data`` as indented JSON, creating the folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def progress_bar(console: Console | None = None) -> Progress:
    """A rich progress bar with count, elapsed time and ETA, plus a free-text ``info`` field per task."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=console)


def positive_int(text: str) -> int:
    """An argparse ``type``: an integer >= 1, or a usage error naming the value."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


BENCH_MODELS = "smollm2-135m (the embedded model) or a published shape with random weights: qwen2.5-0.5b, " \
               "qwen3-0.6b, llama-3.2-1b, qwen3-4b"


def bench_model(name: str) -> tuple[str, str]:
    """The ``base_model`` rlvr is given for ``name`` and the Hugging Face folder the baselines load: the embedded
    SmolLM2-135M, or a published shape (``random_models.REAL_SHAPES``) with random weights, float32, written once
    under ``$RLVR_HOME/models/random-<name>`` (speed does not depend on the weights; no download)."""
    from rlvr.engine.models.load import ensure_smollm2, rlvr_home
    from rlvr.engine.models.random_models import REAL_SHAPES, real_config, write_model_folder

    if name == "smollm2-135m":
        return name, str(ensure_smollm2())
    if name not in REAL_SHAPES:
        raise SystemExit(f"--model {name!r}: choose {BENCH_MODELS}")
    folder = rlvr_home() / "models" / f"random-{name}"
    if not (folder / "config.json").exists():
        print(f"writing random weights of the {name} shape to {folder} (once)", flush=True)
        partial = folder.with_name(folder.name + ".partial")
        write_model_folder(real_config(name), partial, seed=0)
        partial.rename(folder)
    return str(folder), str(folder)


def linear_shape(folder: str) -> dict[str, float]:
    """Multiply-adds per token in a model's linear layers (the output layer included) and their float32 bytes, from
    its config (``rlvr.engine.models.load.linear_parameters``): the work a sampled or trained token costs at least."""
    from rlvr.engine.models.load import linear_parameters

    linear = linear_parameters(folder)
    if linear is None:
        raise ValueError(f"{folder}: no model config to count its linear weights from")
    return {"linear_params": linear, "weight_bytes": 4 * linear}


def matmul_flops(dtype: torch.dtype = torch.float32) -> float:
    """Sustained matmul FLOP/s of this machine in ``dtype`` (best of a few 1024^3 products)."""
    a, b = torch.randn(1024, 1024, dtype=dtype), torch.randn(1024, 1024, dtype=dtype)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * 1024**3 / best


def memory_bandwidth() -> float:
    """Bytes/s a large float32 copy moves (read and write), best of a few."""
    x = torch.empty(2**26)
    y = torch.empty_like(x)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        y.copy_(x)
        best = min(best, time.perf_counter() - start)
    return 2 * x.numel() * 4 / best
