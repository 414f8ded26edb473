"""Shared fixtures: an isolated RLVR_HOME per test session (models still come from the user cache, so the embedded
model is fetched once per machine), and one engine for the whole session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_real_home = Path(os.environ.get("RLVR_HOME", Path.home() / ".cache" / "rlvr")).expanduser()
# The suite's process engine runs on the CPU even where a GPU is visible (the `gpu` tests build CUDA engines of their
# own); RLVR_DEVICE set by the caller wins.
os.environ.setdefault("RLVR_DEVICE", "cpu")


@pytest.fixture(scope="session", autouse=True)
def rlvr_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("rlvr_home")
    (_real_home / "models").mkdir(parents=True, exist_ok=True)
    (home / "models").symlink_to(_real_home / "models")
    os.environ["RLVR_HOME"] = str(home)
    return home


@pytest.fixture(scope="session")
def service():
    import rlvr

    return rlvr.ServiceClient()


SHARED = Path(__file__).resolve().parents[1].parent / "shared"
