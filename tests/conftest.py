"""Shared fixtures: an isolated RLVR_HOME per test session (models already in the user cache are read from there, and
the embedded model's download lands there, so it is fetched once per machine; models the tests convert or write, such
as GGUF files under ``tmp_path``, stay in the session's home), and one engine for the whole session."""

from __future__ import annotations

import gc
import os
from pathlib import Path

gc.disable()  # until the test modules are imported: see pytest_collection_finish
# Under pytest-xdist (``./run-tests``: ``-n 2``) the workers split the cores, one thread each on 2 cores, and so does
# every thread pool in a worker and in the processes it starts (runs in fresh processes, ``rlvr`` commands, Ray
# actors): OMP_NUM_THREADS, read as torch and the other native libraries load. RLVR_THREADS alone fixes only the
# engine's thread; a fresh process's other pools kept the machine's size, and their spinning threads made two
# processes on 2 cores run 4-5x slower each (tests/rl/test_loop.py beside test_determinism_smollm2.py under two
# workers: 150 s, 33 s with this).
if os.environ.get("PYTEST_XDIST_WORKER"):
    share = len(os.sched_getaffinity(0)) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("RLVR_THREADS", str(max(1, share)))
    os.environ.setdefault("OMP_NUM_THREADS", os.environ["RLVR_THREADS"])

import pytest  # noqa: E402
import torch  # noqa: E402

# Triton's kernels (engine/gpu/triton_kernels.py) run in its interpreter where no GPU is visible. Triton reads this as
# triton.language is first imported (transformers imports it), so it is set here, before anything imports that.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from rlvr.model_names import SMOLLM2  # noqa: E402

_real_home = Path(os.environ.get("RLVR_HOME", Path.home() / ".cache" / "rlvr")).expanduser()
# The suite's process engine runs on the CPU even where a GPU is visible (the `gpu` tests build CUDA engines of their
# own); RLVR_DEVICE set by the caller wins.
os.environ.setdefault("RLVR_DEVICE", "cpu")
# Engines share the cores with other rlvr processes (engine/cores.py), and a different thread count rounds sums
# differently; the suite fixes torch's default count, so a child process started while this one was computing (the
# determinism tests compare such runs bit for bit) computes exactly as it would alone. Under pytest-xdist: the share
# set above.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(int(os.environ["RLVR_THREADS"]))
os.environ.setdefault("RLVR_THREADS", str(torch.get_num_threads()))


def pytest_sessionstart(session: pytest.Session) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER") and getattr(session.config.option, "dist", "no") != "no":
        gc.enable()  # pytest-xdist's controller, which collects nothing: its workers do


def pytest_collection_finish(session: pytest.Session) -> None:
    """The collector back on, the objects the imports of the test modules made frozen (``rlvr/startup.py``: a
    collection during those imports frees nothing, and later ones need not walk them)."""
    gc.freeze()
    gc.enable()


@pytest.fixture(scope="session", autouse=True)
def rlvr_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("rlvr_home")
    cached = _real_home / "models"
    (cached / "gguf").mkdir(parents=True, exist_ok=True)  # the embedded model's GGUF, downloaded once per machine
    (home / "models").mkdir()
    for entry in cached.iterdir():  # each, not the folder: what the session writes stays out of the user's cache
        if not entry.name.startswith("."):  # lock files stay per session
            (home / "models" / entry.name).symlink_to(entry)
    if os.environ.get("PYTEST_XDIST_WORKER") and not (cached / SMOLLM2).exists():
        # the embedded model is converted once per suite run, by the first worker that needs it (under its lock)
        shared = tmp_path_factory.getbasetemp().parent / "shared-models"  # one for all workers of this run
        shared.mkdir(exist_ok=True)
        for name in (SMOLLM2, f".{SMOLLM2}.lock"):
            (home / "models" / name).symlink_to(shared / name)
    os.environ["RLVR_HOME"] = str(home)
    return home


@pytest.fixture(scope="session")
def service():
    import rlvr

    return rlvr.ServiceClient()


SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(params=["bf16", "bf16x1"])
def bfloat16_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each kernel a bfloat16 model's frozen products can take (``packed.bfloat16_kind``: oneDNN's, or the AMX
    kernel's one-product form), forced for the test; skipped where this machine lacks it."""
    from rlvr.engine.cpu import amx_linear, packed

    if not packed.bfloat16_supported():
        pytest.skip("no oneDNN bfloat16 matmul on this CPU")
    if request.param == "bf16x1" and not (amx_linear.buildable() and amx_linear.kernel() is not None):
        pytest.skip("no AMX product kernel on this CPU")
    monkeypatch.setattr(packed, "bfloat16_kind", lambda: request.param)
    return request.param
