#!/usr/bin/env bash
# Creates .venv-verifiers4 in the repository root, once: rlvr with the current verifiers release (0.4.x, its v1 stack)
# and what that requires (openai 2.x, renderers), which cannot share .venv with the dev extra's verifiers 0.3.x and
# openai 3.x; and uv, which runs verifiers' harnesses that are PEP 723 scripts. tests/rl/test_verifiers_v1_venv.py
# runs the v1 adapter's tests there (first use: about two minutes, 114 s on 2 busy cores).
# torch is pinned to the CPU build (torch==2.13.0); an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-verifiers4"
STAMP="$VENV/.rlvr-installed"
if [[ ! -x "$VENV/bin/python" ]]; then
    echo "rlvr: creating $VENV" >&2
    python3 -m venv "$VENV"
fi
if [[ ! -f "$STAMP" || "$ROOT/pyproject.toml" -nt "$STAMP" || "${BASH_SOURCE[0]}" -nt "$STAMP" ]]; then
    echo "rlvr: installing rlvr[verifiers,server] with verifiers 0.4 into $VENV" >&2
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0" \
        -e "$ROOT[verifiers,server]" "verifiers==0.4.0" "pytest>=8" "pytest-xdist>=3.6,<4" "uv>=0.9"
    touch "$STAMP"
fi
