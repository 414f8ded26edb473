"""Shared fixtures for the sandbox tests: one warm pool for the session, and a check that it survived."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from rlvr.sandbox import Sandbox


@pytest.fixture(scope="session")
def sandbox() -> Iterator[Sandbox]:
    """Two fork servers without bwrap (so the root privilege drop, Landlock and seccomp are what is tested)."""
    with Sandbox(num_workers=2, timeout=2.0, memory_mb=256, disk_mb=64, use_bwrap=False) as pool:
        yield pool


@pytest.fixture
def survives(sandbox: Sandbox) -> Callable[[], None]:
    """Call at the end of a hostile test: the same fork servers are alive, nothing restarted, jobs still run."""
    pids, restarts = sandbox.server_pids(), sandbox.restarts

    def check() -> None:
        assert sandbox.server_pids() == pids, "a fork server was replaced"
        assert sandbox.restarts == restarts, "a fork server had to be restarted"
        for pid in pids:
            assert os.path.exists(f"/proc/{pid}"), f"fork server {pid} is gone"
        results = sandbox.run_many([{"code": "def ok():\n    return 1", "tests": ["assert ok() == 1"]}] * 2)
        assert all(r.passed for r in results), [r.stderr_tail for r in results]

    return check
