#!/usr/bin/env bash
# Creates .venv in the repository root and installs rlvr into it, once. Sourced by ./rlvr and ./run-tests.
# torch is pinned to the CPU build (torch==2.13.0); an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.rlvr-installed"
if [[ ! -x "$VENV/bin/python" ]]; then
    echo "rlvr: creating $VENV" >&2
    python3 -m venv "$VENV"
fi
# Reinstall when pyproject.toml changed since the last install.
if [[ ! -f "$STAMP" || "$ROOT/pyproject.toml" -nt "$STAMP" ]]; then
    echo "rlvr: installing rlvr and its dependencies into $VENV (first use takes a few minutes)" >&2
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[dev]"
    # tinker-cookbook, for the test that runs its rl.train against `rlvr serve`: 0.6.1 is the one release that accepts
    # tinker 0.38 and transformers 5.23, and it declares tml-renderers>=0.4.1, which PyPI here lacks and rl.train
    # never imports; so it goes in without its declared dependencies (the ones rl.train uses are in the dev extra).
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "tinker-cookbook==0.6.1"
    touch "$STAMP"
fi
