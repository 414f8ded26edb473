"""The layers of ``docs/architecture.md`` hold: no module of ``rlvr`` imports what its layer must not, none imports the
package face (``rlvr/__init__.py``: it imports the library, never the other way), no two modules import each other,
and each name has one import path. ``RULES`` is that page's table of layers, row for row, and a test checks the two
say the same.

Every module under ``src/rlvr`` is parsed with ``ast`` (nothing is imported or run), and every import in it is an
arrow: module-level or inside a function, class or ``if TYPE_CHECKING`` block, ``import x``, ``from x import y``
(an arrow to ``x`` and to ``x.y``, which may be a module), relative imports resolved against the importing module,
and ``importlib.import_module("x")`` with a literal name. An arrow is forbidden when ``RULES`` says its importer's
layer must not reach its target (a prefix: ``torch`` covers ``torch.nn``). Arrows are direct: that ``rlvr.rl``
uses ``rlvr.client``, which imports torch, is the design (the RL layer drives the client API).
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import rlvr

SRC = Path(rlvr.__file__).parent  # the rlvr under test (the worktree's src, first on sys.path)
ARCHITECTURE = SRC.parents[1] / "docs" / "architecture.md"  # where the rules are written for people

ALL_BUT_RAY_HOMES = ("rlvr", ("rlvr.distributed", "rlvr.cli"))
TORCH_FREE = ("torch", "rlvr.engine", "rlvr.rl", "rlvr.client")
BELOW_THE_WORKER = "the engine's sub-packages sit below the worker"

# importer (a prefix; with exemptions) | forbidden targets | why: docs/architecture.md's "Layers" table, row for row
RULES: list[tuple[str | tuple[str, tuple[str, ...]], tuple[str, ...], str]] = [
    ("rlvr.rl", ("torch", "rlvr.engine", "rlvr.app", "rlvr.integrations"),
     "the loop library drives only the client API; the run application and the integrations sit on it"),
    ("rlvr.app", ("torch", "rlvr.engine"), "the run application is RL layer: client API only"),
    ("rlvr.integrations", ("torch", "rlvr.engine", "rlvr.app"),
     "RL layer, on the loop library, beside the run application (which may use them)"),
    ("rlvr.rewards", ("torch", "rlvr.engine", "rlvr.rl", "rlvr.server"),
     "grading needs no model; the engine knows nothing of rewards"),
    ("rlvr.tasks", ("rlvr.engine", "rlvr.rl", "rlvr.server"), "problem sources neither sample nor train"),
    ("rlvr.sandbox", ("torch", "rlvr.rl", "rlvr.engine", "rlvr.server"), "it runs programs; it sits under the rewards"),
    ("rlvr.client", ("rlvr.rl", "rlvr.server", "rlvr.rewards"), "the clients sit below the loop and the server"),
    ("rlvr.engine", ("rlvr.rewards", "rlvr.rl", "rlvr.server", "rlvr.tasks", "rlvr.sandbox", "rlvr.distributed"),
     "the engine knows nothing of rewards, environments or the server"),
    ("rlvr.numerics", TORCH_FREE, "the numerics policy, resolved for the RL layer and the engine alike, so torch-free"),
    ("rlvr.metrics", TORCH_FREE, "shared by the RL layer and the engine, so torch-free"),
    ("rlvr.fileio", TORCH_FREE, "every layer writes run files with it, so torch-free"),
    ("rlvr.model_names", TORCH_FREE, "shared by the RL layer and the engine, so torch-free"),
    ("rlvr.home", TORCH_FREE, "where the RL layer and the engine find checkpoints, so torch-free"),
    ("rlvr.loss_inputs", TORCH_FREE, "the loss table's names and inputs, for rlvr train --help, so torch-free"),
    (("rlvr.engine", ("rlvr.engine.engine", "rlvr.engine.gpu")), ("rlvr.engine.gpu",),
     "the GPU paths are chosen in one place, the worker"),
    ("rlvr.engine.gpu", ("rlvr.engine.cpu",), "a CUDA engine loads none of the CPU kernels"),
    ("rlvr.engine.cpu", ("rlvr.engine.gpu",), "the CPU kernels know nothing of the GPU paths"),
    *((f"rlvr.engine.{sub}", ("rlvr.engine.engine", "rlvr.engine.sample_queue"), BELOW_THE_WORKER)
      for sub in ("models", "train", "sample", "cpu", "gpu")),
    (ALL_BUT_RAY_HOMES, ("ray", "vllm"), "Ray and vLLM are extras, never needed on a laptop"),
]


def documented_rules(text: str) -> list[tuple[str | tuple[str, tuple[str, ...]], tuple[str, ...], str]]:
    """The rows of the table headed ``| importer | must not import | why |`` in ``text``, as ``RULES`` writes them:
    an importer cell that reads "a except b, c" (each name in backticks) is ``("a", ("b", "c"))``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"\|\s*importer\s*\|\s*must not import\s*\|", line))
    rules = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        importer, forbidden, why = (cell.strip() for cell in line.strip().strip("|").split("|"))
        layer, *exempt = re.findall(r"`([^`]+)`", importer)
        rules.append(((layer, tuple(exempt)) if exempt else layer, tuple(re.findall(r"`([^`]+)`", forbidden)), why))
    return rules


@dataclass(frozen=True)
class Arrow:
    """One import: ``module`` (defined in ``path``) imports ``targets`` at ``line``; ``from x import y`` gives the
    targets ``x`` and ``x.y``."""

    module: str
    path: Path
    line: int
    targets: tuple[str, ...]


def _module_name(path: Path, root: Path) -> tuple[str, bool]:
    """The dotted name of the module in ``path`` under ``root`` (the folder holding the top package), and whether it
    is a package (``__init__.py``)."""
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _from_base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a ``from ... import`` reads from, relative levels resolved against ``module``."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    if node.level - 1 >= len(package):
        raise ValueError(f"{module}: relative import beyond the top package (level {node.level})")
    anchor = package[:len(package) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def arrows(package_dir: Path) -> Iterator[Arrow]:
    """Every import of every module under ``package_dir`` (a top package such as ``src/rlvr``)."""
    root = package_dir.parent
    for path in sorted(package_dir.rglob("*.py")):
        module, is_package = _module_name(path, root)
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Arrow(module, path, node.lineno, (alias.name,))
            elif isinstance(node, ast.ImportFrom):
                base = _from_base(node, module, is_package)
                yield Arrow(module, path, node.lineno,
                            (base, *(f"{base}.{a.name}" for a in node.names if a.name != "*")))
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                    yield Arrow(module, path, node.lineno, (node.args[0].value,))


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(package_dir: Path) -> list[str]:
    """One line per forbidden arrow: where it is, what it imports, and the rule it breaks."""
    found = []
    for arrow in arrows(package_dir):
        for importer, forbidden, source in RULES:
            layer, exempt = importer if isinstance(importer, tuple) else (importer, ())
            if not _under(arrow.module, layer) or any(_under(arrow.module, e) for e in exempt):
                continue
            target = next((t for t in arrow.targets if any(_under(t, f) for f in forbidden)), None)
            if target is not None:
                where = arrow.path.relative_to(package_dir.parent)
                found.append(f"{where}:{arrow.line}: {arrow.module} imports {target}, which {layer} must not "
                             f"import{' (outside ' + ', '.join(exempt) + ')' if exempt else ''} [{source}]")
    return found


def module_names(package_dir: Path) -> set[str]:
    """The dotted name of every module and package under ``package_dir``."""
    return {_module_name(path, package_dir.parent)[0] for path in package_dir.rglob("*.py")}


def _imported_modules(arrow: Arrow, modules: set[str]) -> set[str]:
    """The modules ``arrow`` reaches: each target as the longest module it names (``from x import f`` reaches ``x``,
    ``from x import sub`` reaches ``x.sub`` only); targets outside the package are left out."""
    def module_of(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    names = arrow.targets[1:] or arrow.targets
    return {m for m in map(module_of, names) if m and m != arrow.module}


def face_imports(package_dir: Path) -> list[str]:
    """One line per module that imports the top package itself (``import rlvr``, or ``from rlvr import`` a name that
    is not a module), the face excepted."""
    top, modules = package_dir.name, module_names(package_dir)
    found = []
    for arrow in arrows(package_dir):
        if arrow.module != top and arrow.targets[0] == top and top in _imported_modules(arrow, modules):
            found.append(f"{arrow.path.relative_to(package_dir.parent)}:{arrow.line}: {arrow.module} imports the "
                         f"package face {top}; import the module the name lives in ({top}.client, ...)")
    return found


def circles(package_dir: Path) -> list[str]:
    """One line per pair of modules that import each other (at any depth of their code, type-checking blocks too)."""
    modules = module_names(package_dir)
    reaches: dict[str, dict[str, int]] = {}
    for arrow in arrows(package_dir):
        for target in _imported_modules(arrow, modules):
            reaches.setdefault(arrow.module, {}).setdefault(target, arrow.line)
    return [f"{a} (line {lines[b]}) and {b} (line {reaches[b][a]}) import each other"
            for a, lines in sorted(reaches.items()) for b in sorted(lines) if a < b and a in reaches.get(b, {})]


FACES = {"rlvr.client": "LORA_ALPHA, for the RL layer, which must not import the engine",
         "rlvr.types": "the tinker SDK's types, as rlvr's own"}
"""Modules (not packages) whose ``__all__`` may list names defined elsewhere, and why."""


def reexports(package_dir: Path) -> list[str]:
    """One line per name that a module's ``__all__`` lists but the module does not define (it imports it): a second
    import path for that name. Packages (``__init__.py``, the faces) and ``FACES`` may re-export; a computed
    ``__all__`` is not read."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        module, is_package = _module_name(path, package_dir.parent)
        if is_package or module in FACES:
            continue
        listed, defined = [], set()
        for node in ast.parse(path.read_text(), filename=str(path)).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            defined |= names
            if "__all__" in names and isinstance(node.value, (ast.List, ast.Tuple)):
                listed = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
        where = path.relative_to(package_dir.parent)
        found += [f"{where}: {module}.__all__ lists {name}, defined elsewhere; import it from where it is defined"
                  for name in listed if name not in defined]
    return found


def test_rlvr_keeps_its_layers():
    assert SRC.name == "rlvr" and (SRC / "engine").is_dir()
    found = violations(SRC)
    assert not found, "forbidden imports (docs/architecture.md, 'Layers'):\n" + "\n".join(found)


def test_no_module_imports_the_package_face():
    found = face_imports(SRC)
    assert not found, "imports of the package face (docs/architecture.md: arrows point down only):\n" + "\n".join(found)


def test_the_architecture_page_states_these_rules():
    # A person reads the rules in docs/architecture.md; this test enforces RULES: the two say the same, row for row.
    assert documented_rules(ARCHITECTURE.read_text(encoding="utf-8")) == RULES


def test_a_planted_difference_between_page_and_rules_is_seen():
    page = ARCHITECTURE.read_text(encoding="utf-8")
    assert documented_rules(page.replace("| `rlvr.tasks` | `rlvr.engine`, ", "| `rlvr.tasks` | ", 1)) != RULES
    assert documented_rules(page.replace("`rlvr` except `rlvr.distributed`, `rlvr.cli`", "`rlvr`", 1)) != RULES


def test_no_two_modules_import_each_other():
    found = circles(SRC)
    assert not found, "import circles:\n" + "\n".join(found)


def test_each_name_has_one_import_path():
    found = reexports(SRC)
    assert not found, "re-exports outside the package faces:\n" + "\n".join(found)


def test_every_module_is_read():
    # The checker sees the layers it guards: a rule over an empty set of modules would pass vacuously.
    modules = {arrow.module for arrow in arrows(SRC)}
    for layer in ("rlvr.rl.loop", "rlvr.app.run", "rlvr.integrations.refine", "rlvr.engine.engine", "rlvr.sandbox",
                  "rlvr.rewards", "rlvr.tasks", "rlvr.client", "rlvr.server", "rlvr.distributed",
                  "rlvr.integrations.tensafe.critic"):
        assert any(_under(m, layer) for m in modules), layer


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "rlvr"


def test_planted_forbidden_imports_are_caught(tmp_path):
    package = _tree(tmp_path, {
        "rlvr/__init__.py": "",
        "rlvr/engine/__init__.py": "",
        "rlvr/rl/__init__.py": "",
        "rlvr/rl/loop.py": """\
            import rlvr.client
            from rlvr import types


            def backend():
                from ..engine import Engine  # relative, inside a function
                return Engine
            """,
        "rlvr/integrations/tensafe/__init__.py": "from .. import refine\nfrom ...engine.lora import LORA_ALPHA\n",
        "rlvr/rl/phases.py": "from rlvr.app.run import train\nfrom rlvr.integrations import textarena\n",
        "rlvr/engine/engine.py": "from rlvr import rewards\nfrom . import sampler\n",
        "rlvr/sandbox/executor.py": """\
            from typing import TYPE_CHECKING

            if TYPE_CHECKING:
                import torch.nn as nn
            """,
        "rlvr/tasks/__init__.py": '"""Docs may say: from rlvr.engine.tiny import build_tiny_tokenizer."""\n',
        "rlvr/rewards/math.py": "import importlib\n\nmod = importlib.import_module('rlvr.rl.loop')\n",
        "rlvr/client.py": "from rlvr.engine.engine import Engine\n",
        "rlvr/server/app.py": "from vllm import LLM\n",
        "rlvr/distributed/cluster.py": "import ray\nimport vllm\n",
        "rlvr/engine/gpu/device_sampler.py": "from rlvr.engine.cpu import packed\n",
        "rlvr/engine/train/prefix.py": "from rlvr.engine.gpu.packing import plan\n",
        "rlvr/engine/sample/sampler.py": "def late():\n    from rlvr.engine.engine import Engine\n",
    })
    found = violations(package)
    assert [line.split(" [")[0] for line in found] == [
        "rlvr/engine/engine.py:1: rlvr.engine.engine imports rlvr.rewards, which rlvr.engine must not import",
        "rlvr/engine/gpu/device_sampler.py:1: rlvr.engine.gpu.device_sampler imports rlvr.engine.cpu, which "
        "rlvr.engine.gpu must not import",
        "rlvr/engine/sample/sampler.py:2: rlvr.engine.sample.sampler imports rlvr.engine.engine, which "
        "rlvr.engine.sample must not import",
        "rlvr/engine/train/prefix.py:1: rlvr.engine.train.prefix imports rlvr.engine.gpu.packing, which rlvr.engine "
        "must not import (outside rlvr.engine.engine, rlvr.engine.gpu)",
        "rlvr/integrations/tensafe/__init__.py:2: rlvr.integrations.tensafe imports rlvr.engine.lora, which "
        "rlvr.integrations must not import",
        "rlvr/rewards/math.py:3: rlvr.rewards.math imports rlvr.rl.loop, which rlvr.rewards must not import",
        "rlvr/rl/loop.py:6: rlvr.rl.loop imports rlvr.engine, which rlvr.rl must not import",
        "rlvr/rl/phases.py:1: rlvr.rl.phases imports rlvr.app.run, which rlvr.rl must not import",
        "rlvr/rl/phases.py:2: rlvr.rl.phases imports rlvr.integrations, which rlvr.rl must not import",
        "rlvr/sandbox/executor.py:4: rlvr.sandbox.executor imports torch.nn, which rlvr.sandbox must not import",
        "rlvr/server/app.py:1: rlvr.server.app imports vllm, which rlvr must not import (outside rlvr.distributed, "
        "rlvr.cli)",
    ]
    assert found[0].endswith("[the engine knows nothing of rewards, environments or the server]")


def test_relative_imports_resolve_against_the_importer():
    def base(code: str, module: str, is_package: bool) -> str:
        return _from_base(ast.parse(code).body[0], module, is_package)

    assert base("from . import x", "rlvr.rl.loop", False) == "rlvr.rl"
    assert base("from . import x", "rlvr.rl", True) == "rlvr.rl"
    assert base("from ..engine import x", "rlvr.rl.loop", False) == "rlvr.engine"
    assert base("from ...engine.lora import x", "rlvr.integrations.tensafe", True) == "rlvr.engine.lora"
    assert base("from rlvr.engine import x", "rlvr.rl.loop", False) == "rlvr.engine"


def test_planted_face_imports_and_circles_are_caught(tmp_path):
    package = _tree(tmp_path, {
        "rlvr/__init__.py": "from rlvr.client import ServiceClient\n",
        "rlvr/client.py": "from rlvr import types\n",
        "rlvr/types.py": "",
        "rlvr/rl/__init__.py": "",
        "rlvr/rl/phases.py": "import rlvr\n",
        "rlvr/app/run.py": "def late():\n    from rlvr import ServiceClient\n",
        "rlvr/rl/config.py": "from rlvr.app.recipes import RECIPES\n",
        "rlvr/app/recipes.py": """\
            from typing import TYPE_CHECKING

            if TYPE_CHECKING:
                from rlvr.rl.config import TrainConfig
            """,
        "rlvr/rl/loop.py": "from rlvr.rl import phases\nfrom . import config\n",
    })
    assert [line.split(";")[0] for line in face_imports(package)] == [
        "rlvr/app/run.py:2: rlvr.app.run imports the package face rlvr",
        "rlvr/rl/phases.py:1: rlvr.rl.phases imports the package face rlvr",
    ]
    assert circles(package) == ["rlvr.app.recipes (line 4) and rlvr.rl.config (line 1) import each other"]


def test_planted_reexports_are_caught(tmp_path):
    package = _tree(tmp_path, {
        "rlvr/__init__.py": 'from rlvr.home import resolve\n__all__ = ["resolve"]\n',  # a face: allowed
        "rlvr/home.py": 'def resolve(p):\n    return p\nROOT: str = "/"\n__all__ = ["ROOT", "resolve"]\n',
        "rlvr/engine/__init__.py": "",
        "rlvr/engine/checkpoint.py": 'from rlvr.home import resolve\nKINDS = ()\n__all__ = ["KINDS", "resolve"]\n',
    })
    assert [line.split(",")[0] for line in reexports(package)] == [
        "rlvr/engine/checkpoint.py: rlvr.engine.checkpoint.__all__ lists resolve"]
