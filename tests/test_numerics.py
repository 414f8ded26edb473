"""rlvr.numerics: one policy, resolved config > environment > machine, read from the environment in that module only,
recorded by a run (RL and sft) and checked on resume."""

import ast
import json
from pathlib import Path

import pytest
import yaml

import rlvr
from rlvr.errors import ConfigurationError
from rlvr.numerics import ENVIRONMENT, Numerics, activated, active, check_resume
from rlvr.tasks.base import Problem, ProblemSource

SETTINGS = [  # (field, the config's value, the environment's value as text, the environment's value, the default)
    ("precision", "float32", "bfloat16", "bfloat16", None),
    ("matmul", "plain", "mkldnn", "mkldnn", None),
    ("attention", "torch", "fused", "fused", "auto"),
    ("heap", "system", "reuse", "reuse", "reuse"),
    ("threads", 3, "2", 2, None),
    ("device", "cpu", "cuda:1", "cuda:1", None),
]


@pytest.mark.parametrize(("name", "config", "text", "environment", "default"), SETTINGS)
def test_each_setting_is_the_configs_else_the_environments_else_the_default(name, config, text, environment,
                                                                            default):
    variable = ENVIRONMENT[name]
    assert getattr(Numerics.resolve(environ={}), name) == default
    from_environment = Numerics.resolve(environ={variable: text})
    assert getattr(from_environment, name) == environment and from_environment.source(name) == variable
    assert getattr(Numerics.resolve(environ={variable: ""}), name) == default  # empty: unset
    from_config = Numerics.resolve(**{name: config}, environ={variable: text})
    assert getattr(from_config, name) == config and from_config.source(name) == name


def test_the_machine_resolves_what_is_left_as_an_engine_computes(monkeypatch):
    from rlvr.engine.cpu import packed
    from rlvr.engine.device import resolve_numerics

    monkeypatch.delenv("RLVR_MATMUL", raising=False)
    resolved = resolve_numerics(Numerics.resolve(environ={}))
    assert (resolved.precision, resolved.device) == ("float32", "cpu")  # the CPU's defaults
    expected = packed.fastest_kind("decode", packed.torch.randn(8, 4), 16) or "plain"
    trainer = packed.fastest_kind("train", packed.torch.randn(8, 4), 16, kinds=["mkldnn"]) or "plain"
    assert (resolved.sampler_kind, resolved.trainer_kind) == (expected, trainer)
    plain = resolve_numerics(Numerics.resolve(matmul="plain", environ={}))
    assert (plain.sampler_kind, plain.trainer_kind) == ("plain", "plain")
    assert resolve_numerics(Numerics.resolve(matmul="timed", environ={})).sampler_kind == "timed"
    assert resolved.as_record() == {"precision": "float32", "matmul": None, "attention": "auto", "heap": "reuse",
                                    "threads": None, "device": "cpu", "sampler_kind": expected,
                                    "trainer_kind": trainer}


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("RLVR_PRECISION", "fp8", "RLVR_PRECISION='fp8': choose one of ['float32', 'bfloat16']"),
    ("RLVR_MATMUL", "fmaa", "RLVR_MATMUL='fmaa': choose plain or one of ['mkldnn', 'mkl', 'fma', 'bf16x3', "
                            "'bf16x1'] (the engine checks which this machine has), or timed, or unset it for the fixed "
                            "preference (did you mean 'fma'?)"),
    ("RLVR_ATTENTION", "flash", "RLVR_ATTENTION='flash': choose auto, torch or fused"),
    ("RLVR_HEAP", "big", "RLVR_HEAP='big': use 'reuse' (the default: large freed blocks reused) or 'system'"),
    ("RLVR_THREADS", "two", "RLVR_THREADS='two': set it to a positive number of threads (such as 2), or unset it"),
    ("RLVR_THREADS", "0", "RLVR_THREADS='0': set it to a positive number"),
])
def test_a_bad_variable_is_named_with_the_fix(variable, value, message):
    with pytest.raises(ConfigurationError) as info:
        Numerics.resolve(environ={variable: value})
    assert str(info.value).startswith(message)


def test_a_bad_config_value_names_the_key_and_the_nearest_choice():
    from rlvr.app.settings import resolve_config

    with pytest.raises(ConfigurationError, match=r"matmul='fmaa': choose plain .* \(did you mean 'fma'\?\)"):
        resolve_config(overrides=["matmul=fmaa"])
    with pytest.raises(ConfigurationError, match="threads=0: set it to a positive number of threads"):
        resolve_config(overrides=["threads=0"])
    with pytest.raises(ConfigurationError, match="did you mean 'matmul'"):
        resolve_config(overrides=["matmull=plain"])
    assert resolve_config(overrides=["matmul=plain", "heap=system"]).requested_numerics(environment={}) == \
        Numerics(matmul="plain", heap="system")


READERS = tuple(ENVIRONMENT[name] for name in ("precision", "matmul", "attention", "heap", "threads"))


def environment_readers(src: Path) -> list[str]:
    """Each place under ``src`` (but numerics.py) that names one of ``READERS`` as a whole string, which is how a
    module reads a variable (``os.environ.get("RLVR_MATMUL")``, ``os.environ["RLVR_HEAP"]``, ``os.getenv``)."""
    found = []
    for path in sorted(src.rglob("*.py")):
        if path == src / "numerics.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and node.value in READERS:
                found.append(f"{path.relative_to(src.parent)}:{node.lineno}: {node.value}")
    return found


def test_no_module_but_numerics_reads_the_numerics_variables(tmp_path):
    src = Path(rlvr.__file__).parent
    assert environment_readers(src) == []
    planted = tmp_path / "rlvr"  # the check itself: a copy of the package with one reader planted finds it
    for path in src.rglob("*.py"):
        (planted / path.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
        (planted / path.relative_to(src)).write_text(path.read_text())
    kernel = planted / "engine" / "cpu" / "packed.py"
    kernel.write_text(kernel.read_text() + '\n\nasked = os.environ.get("RLVR_MATMUL", "")\n')
    assert [line.split(": ")[-1] for line in environment_readers(planted)] == ["RLVR_MATMUL"]


def test_the_active_policy_is_the_engines_inside_its_jobs_and_the_environments_outside(monkeypatch):
    from rlvr.engine.engine import Engine

    monkeypatch.setenv("RLVR_ATTENTION", "fused")
    engine = Engine(numerics=Numerics.resolve(attention="torch", matmul="plain"))
    assert engine.run(active) is engine.numerics and engine.numerics.attention == "torch"
    assert active().attention == "fused"  # this thread runs no engine's job
    with activated(engine.numerics):
        assert active() is engine.numerics
    assert active().attention == "fused"


def test_the_recorded_kinds_are_the_ones_the_models_frozen_products_take(monkeypatch):
    from rlvr import types
    from rlvr.client import ServiceClient
    from rlvr.engine.cpu import decode, packed
    from rlvr.engine.engine import Engine

    monkeypatch.delenv("RLVR_MATMUL", raising=False)
    for policy in (Numerics.resolve(), Numerics.resolve(matmul="plain")):
        engine = Engine(numerics=policy)
        training = ServiceClient(engine=engine).create_lora_training_client(base_model="tiny", rank=4, seed=0)
        model = engine.host("tiny").base.model
        assert (packed.model_kind(model) or "plain") == engine.numerics.trainer_kind
        sampler = training.save_weights_and_get_sampling_client()
        sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 1, types.SamplingParams(max_tokens=2, seed=0)).result()
        kind = next((k for m, (k, _, _) in decode._PACKS.items() if m is model), None)
        assert (kind or "plain") == engine.numerics.sampler_kind, policy


def test_check_resume_compares_what_was_recorded_and_names_both():
    now = Numerics(precision="float32", device="cpu", sampler_kind="fma", trainer_kind="mkldnn")
    check_resume(None, now, "runs/a")  # a fresh run
    check_resume({"precision": "float32"}, now, "runs/a")  # a folder from before the kinds were recorded
    check_resume({**now.as_record(), "threads": 7, "attention": "torch"}, now, "runs/a")  # recorded, not compared
    with pytest.raises(ConfigurationError, match=r"^runs/a trained with precision=bfloat16; resuming it with "
                                                 r"precision=float32 .*set precision=bfloat16, or resume with "
                                                 r"accept_numerics=true"):
        check_resume({"precision": "bfloat16"}, now, "runs/a")
    plain = {**now.as_record(), "matmul": "plain", "sampler_kind": "plain", "trainer_kind": "plain"}
    with pytest.raises(ConfigurationError, match=r"trained with matmul kinds sampler=plain, trainer=plain; resuming "
                                                 r"it with matmul kinds sampler=fma, trainer=mkldnn .*set "
                                                 r"matmul=plain, or resume with accept_numerics=true"):
        check_resume(plain, now, "runs/a")
    check_resume(plain, now, "runs/a", accept=True)


# -- runs: recorded in config.yaml and each checkpoint, checked on resume ------------------------------------------


def lowercase_share(prompt, response, meta=None) -> float:
    return sum("a" <= c <= "z" for c in response) / max(len(response), 1)


class SayA(ProblemSource):
    """Problems rewarded by the share of lowercase letters in the answer (as in tests/rl/test_loop.py)."""

    name = "say-a"

    def __init__(self) -> None:
        super().__init__(reward=lowercase_share)

    def splits(self):
        return ("train", "test")

    def load(self, split):
        return [Problem(id=f"say-a/{split}/{i}", question=f"Say a, {i}.", answer="a") for i in range(8)]


def config(tmp_path: Path, **overrides):
    from rlvr.rl import LoopConfig

    values = dict(base_model="tiny", rank=4, steps=1, problems_per_step=2, group_size=2, max_tokens=4,
                  eval_problems=2, reward_timeout=5.0, out=str(tmp_path / "run"), seed=1, rollouts=False)
    return LoopConfig(**{**values, **overrides})


def numerics_of(run_dir: Path) -> dict:
    return yaml.safe_load((run_dir / "config.yaml").read_text())["numerics"]


def entries_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "checkpoints.jsonl").read_text().splitlines()]


@pytest.fixture
def fresh_process(monkeypatch):
    """As in a fresh process: no engine yet (each run's makes one by its policy), RLVR_MATMUL unset."""
    from rlvr.engine.engine import Engine

    monkeypatch.delenv("RLVR_MATMUL", raising=False)

    def fresh(matmul: str | None = None) -> None:
        monkeypatch.setattr(Engine, "_default", None)
        if matmul is not None:
            monkeypatch.setenv("RLVR_MATMUL", matmul)

    fresh()
    default = Numerics.resolve()
    from rlvr.engine.device import resolve_numerics

    if resolve_numerics(default).sampler_kind == "plain":
        pytest.skip("this machine's fixed preference is already plain: RLVR_MATMUL=plain changes nothing")
    return fresh


def test_an_rl_run_records_its_numerics_and_refuses_a_resume_in_other_kinds_unless_accepted(tmp_path,
                                                                                          fresh_process):
    from rlvr.engine.engine import Engine
    from rlvr.rl import train

    train(config(tmp_path, steps=1, save_every=1), SayA())
    run_dir = tmp_path / "run"
    recorded = numerics_of(run_dir)
    assert recorded == Engine.default().numerics.as_record()  # what the engine resolved
    assert recorded["precision"] == "float32" and recorded["sampler_kind"] != "plain"
    assert [e["numerics"] for e in entries_of(run_dir)] == [recorded]
    fresh_process("plain")
    with pytest.raises(ConfigurationError) as refused:
        train(config(tmp_path, steps=2, resume=True), SayA())
    assert (f"trained with matmul kinds sampler={recorded['sampler_kind']}, trainer={recorded['trainer_kind']}; "
            "resuming it with matmul kinds sampler=plain, trainer=plain") in str(refused.value)
    assert "accept_numerics=true" in str(refused.value)
    assert numerics_of(run_dir) == recorded  # nothing changed
    train(config(tmp_path, steps=2, resume=True, accept_numerics=True), SayA())
    now = numerics_of(run_dir)
    assert (now["sampler_kind"], now["trainer_kind"], now["matmul"]) == ("plain", "plain", "plain")
    assert entries_of(run_dir)[-1]["numerics"] == now
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["accept_numerics"] is False  # not kept


def test_a_resume_in_another_precision_is_refused_and_a_folder_from_before_resumes(tmp_path, fresh_process):
    from rlvr.rl import train

    train(config(tmp_path, steps=1, save_every=1), SayA())
    path = tmp_path / "run" / "config.yaml"
    values = yaml.safe_load(path.read_text())
    values["numerics"]["precision"] = "bfloat16"  # as if it had trained in bfloat16
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    fresh_process()
    with pytest.raises(ConfigurationError, match="trained with precision=bfloat16; resuming it with "
                                                 "precision=float32 .*accept_numerics=true"):
        train(config(tmp_path, steps=2, resume=True, precision="float32"), SayA())
    del values["numerics"]  # a run folder written before the numerics were recorded: its precision only
    values["precision"] = "float32"
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    fresh_process("plain")  # other kinds: not compared, since the folder never recorded any
    train(config(tmp_path, steps=2, resume=True), SayA())
    assert numerics_of(tmp_path / "run")["sampler_kind"] == "plain"


def test_an_sft_run_records_its_numerics_and_refuses_a_resume_in_other_kinds_unless_accepted(tmp_path,
                                                                                           fresh_process):
    from rlvr.app.sft import sft
    from rlvr.engine.engine import Engine

    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say {w}.", "completion": w}) + "\n" for w in ("a", "b")))
    settings = {"data": str(data), "base_model": "tiny", "rank": 4, "steps": 2, "batch_size": 2,
                "out": str(tmp_path / "sft")}
    sft(settings)
    run_dir = tmp_path / "sft"
    recorded = numerics_of(run_dir)
    assert recorded == Engine.default().numerics.as_record()
    assert [e["numerics"] for e in entries_of(run_dir)] == [recorded]
    fresh_process("plain")
    with pytest.raises(ConfigurationError, match=f"trained with matmul kinds sampler={recorded['sampler_kind']}.*"
                                                 "resuming it with matmul kinds sampler=plain.*accept_numerics=true"):
        sft({**settings, "steps": 3, "resume": True})
    sft({**settings, "steps": 3, "resume": True, "accept_numerics": True})
    assert numerics_of(run_dir)["sampler_kind"] == "plain"
    assert entries_of(run_dir)[-1]["numerics"]["sampler_kind"] == "plain"
