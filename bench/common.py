"""What the benchmarks share: a description of the machine, its load, result files and progress bars.

Not here: any measurement (each lives in its own script) or the ``python -m bench`` driver (``__main__.py``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
from pathlib import Path
from typing import Any

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
