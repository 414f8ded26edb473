#!/usr/bin/env bash
# Creates .venv-verifiers4 in the repository root, once: rlvr with the current verifiers release (0.4.x, its v1 stack)
# and what that requires (openai 2.x, renderers), which cannot share .venv with the dev extra's verifiers 0.3.x and
# openai 3.x; and uv, which runs verifiers' harnesses that are PEP 723 scripts. tests/integrations/test_verifiers_v1_venv.py
# runs the v1 adapter's tests there.
# Where .venv exists with the same Python, .venv-verifiers4 reads .venv's packages behind its own (a .pth file adds
# .venv's site-packages after its own), so pip installs only what differs (verifiers, openai, renderers, uv and rlvr
# itself; pip leaves the packages it replaces in .venv alone, as "outside environment"): about 15 s instead of the
# minutes a full install with torch takes. Without .venv it installs everything.
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
    site_of() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
    version_of() { "$1" -c 'import sys; print(sys.version_info[:2])'; }
    if [[ -x "$ROOT/.venv/bin/python" && "$(version_of "$ROOT/.venv/bin/python")" == "$(version_of "$VENV/bin/python")" ]]; then
        "$VENV/bin/python" -c 'import pathlib, sys; pathlib.Path(sys.argv[2], "zz-rlvr-dev-packages.pth").write_text(
            f"import site; site.addsitedir({sys.argv[1]!r})\n")' "$(site_of "$ROOT/.venv/bin/python")" \
            "$(site_of "$VENV/bin/python")"
    fi
    echo "rlvr: installing rlvr[verifiers,server] with verifiers 0.4 into $VENV" >&2
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0" \
        -e "$ROOT[verifiers,server]" "verifiers==0.4.0" "pytest>=8" "pytest-xdist>=3.6,<4" "uv>=0.9"
    touch "$STAMP"
fi
