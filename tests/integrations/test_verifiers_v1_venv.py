"""verifiers 0.4 beside the dev environment's 0.3: where ``verifiers.v1`` is not importable here (the dev extra holds
verifiers 0.3.x and openai 3.x, which 0.4's ``openai<3`` excludes), ``tests/integrations/test_verifiers_v1.py`` runs in
``.venv-verifiers4``, made on first use by ``scripts/ensure-venv-verifiers4.sh`` (rlvr with verifiers 0.4.0, openai
2.x, renderers and uv over .venv's other packages; ~15 s, then cached), in a subprocess of its own, with that
environment's ``uv`` on the PATH (verifiers' ``null`` harness fetches its script's packages with it on first use)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_verifiers_v1_tests_pass_with_verifiers_0_4():
    try:
        import verifiers

        here = verifiers.__version__.startswith("0.4")
    except ImportError:
        here = False
    if here:
        pytest.skip("verifiers 0.4 is installed here: tests/integrations/test_verifiers_v1.py runs in this session")
    made = subprocess.run(["bash", str(ROOT / "scripts" / "ensure-venv-verifiers4.sh")], capture_output=True,
                          text=True, timeout=1800)
    assert made.returncode == 0, f"could not make .venv-verifiers4:\n{made.stderr[-4000:]}"
    python = ROOT / ".venv-verifiers4" / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"  # its uv, for the harness that is a uv script
    # the project's addopts left out (their -q hides the summary line read below); slow tests included
    ran = subprocess.run([str(python), "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-q", "-m",
                          "not gpu", "tests/integrations/test_verifiers_v1.py"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=1800)
    assert ran.returncode == 0, f"tests/integrations/test_verifiers_v1.py in .venv-verifiers4:\n{ran.stdout[-6000:]}"
    assert " passed" in ran.stdout and " skipped" not in ran.stdout, ran.stdout[-2000:]
