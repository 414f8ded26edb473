"""Experiment trackers: metrics.jsonl, and each optional backend read back with its own package's reader.

Every test runs offline with HOME, the XDG folders and each package's cache in tmp_path, and checks that the fake
home stays empty. A backend whose package is not installed is skipped (``rlvr[dev]`` installs all three).
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.errors import ConfigurationError
from rlvr.rl.tracking import BACKENDS, flatten_config, mlflow_name, open_trackers

CONFIG = {"lr": 2e-4, "trackers": ["mlflow"], "distributed": {"backend": "local", "address": None}}
ROWS = [  # names with '/' and ':' as the loop logs them; a NaN that only metrics.jsonl keeps
    {"env/all/reward/mean": 0.25, "optim/loss:sum": 1.0},
    {"env/all/reward/mean": math.nan, "optim/loss:sum": 0.5},
    {"env/all/reward/mean": 0.75, "optim/loss:sum": 0.25},
]


@pytest.fixture(autouse=True)
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake, empty HOME; W&B offline and quiet; no MLflow server or telemetry."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var, sub in [("XDG_CONFIG_HOME", ".config"), ("XDG_CACHE_HOME", ".cache"), ("XDG_DATA_HOME", ".local")]:
        monkeypatch.setenv(var, str(home / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    for var, sub in [("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"), ("WANDB_DATA_DIR", "data")]:
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / sub))
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return home


def log_rows(names: list[str], run_dir: Path) -> None:
    with open_trackers(names, run_dir, CONFIG) as tracker:
        for step, row in enumerate(ROWS):
            tracker.log(row, step)


def finite_history(name: str) -> list[tuple[int, float]]:
    return [(step, row[name]) for step, row in enumerate(ROWS) if math.isfinite(row[name])]


def test_metrics_jsonl_keeps_every_value_and_a_resumed_run_appends(tmp_path):
    log_rows([], tmp_path / "run")
    with open_trackers([], tmp_path / "run") as tracker:
        tracker.log({"optim/loss:sum": 0.125}, step=3)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in lines] == [0, 1, 2, 3]
    assert lines[0] == {"step": 0, **ROWS[0]}
    assert math.isnan(lines[1]["env/all/reward/mean"])  # the JSONL is the full record, NaN included
    assert lines[3] == {"step": 3, "optim/loss:sum": 0.125}


def test_unknown_tracker_fails_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigurationError, match=r"unknown \['neptune'\]; choose from \['mlflow', 'tensorboard'"):
        open_trackers(["mlflow", "neptune"], tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("tracker", "module"), [("mlflow", "mlflow"), ("mlflow", "sqlalchemy"),
                                                 ("tensorboard", "tensorboardX"), ("wandb", "wandb")])
def test_missing_package_names_the_extra(tmp_path, monkeypatch, tracker, module):
    for name in [m for m in sys.modules if m.startswith(f"{module}.")] + [module]:
        monkeypatch.setitem(sys.modules, name, None)  # makes `import name` raise ImportError
    with pytest.raises(ConfigurationError, match=rf"trackers=\['{tracker}'\] needs: pip install 'rlvr\[{tracker}\]'"):
        open_trackers([tracker], tmp_path / "run")


def test_backend_names_are_the_extras_in_pyproject():
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    for name in BACKENDS:
        assert f"\n{name} = [" in pyproject


def test_flatten_config_dots_nested_keys_and_writes_lists_as_json():
    assert flatten_config(CONFIG) == {"lr": 2e-4, "trackers": '["mlflow"]', "distributed.backend": "local",
                                      "distributed.address": None}


def test_mlflow_names_are_portable():
    assert mlflow_name("optim/loss:sum") == "optim/loss.sum"
    assert mlflow_name("env/all/reward/mean") == "env/all/reward/mean"
    assert mlflow_name("reward/a@b (x)<2>") == "reward/a_b _x__2_"


@pytest.fixture
def fast_sqlite():
    """SQLite without fsync: a new MLflow store runs ~100 schema migrations, each one synced to disk (seconds on a
    slow disk), and durability is not what these tests check."""
    sqlalchemy = pytest.importorskip("sqlalchemy")

    def no_sync(connection, _record):
        connection.execute("PRAGMA synchronous=OFF")
        connection.execute("PRAGMA journal_mode=MEMORY")

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "connect", no_sync)
    yield
    sqlalchemy.event.remove(sqlalchemy.engine.Engine, "connect", no_sync)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated:DeprecationWarning")  # MLflow's
def test_mlflow_writes_a_sqlite_store_in_the_run_folder(tmp_path, offline, fast_sqlite):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run-a"
    log_rows(["mlflow"], run_dir)

    client = MlflowClient(tracking_uri=f"sqlite:///{(run_dir / 'mlruns' / 'mlflow.db').as_posix()}")
    experiment = client.get_experiment_by_name("run-a")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "run-a"
    assert run.data.params == {"lr": "0.0002", "trackers": '["mlflow"]', "distributed.backend": "local",
                               "distributed.address": "None"}
    assert set(run.data.metrics) == {"env/all/reward/mean", "optim/loss.sum"}
    for name in ("env/all/reward/mean", "optim/loss:sum"):
        history = client.get_metric_history(run.info.run_id, mlflow_name(name))
        assert sorted((m.step, m.value) for m in history) == finite_history(name)
    assert experiment.artifact_location.startswith((run_dir / "mlruns").resolve().as_uri())
    assert not any(offline.rglob("*")), "MLflow wrote to the home folder"


def test_tensorboard_event_files_keep_tag_names(tmp_path, offline):
    pytest.importorskip("tensorboardX")
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

    log_rows(["tensorboard"], tmp_path / "run")

    events = accumulator.EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"env/all/reward/mean", "optim/loss:sum"}
    for name in ("env/all/reward/mean", "optim/loss:sum"):
        expected = finite_history(name)
        assert [e.step for e in events.Scalars(name)] == [step for step, _ in expected]
        assert [e.value for e in events.Scalars(name)] == pytest.approx([v for _, v in expected])  # float32 on disk
    assert "config/text_summary" in events.Tags()["tensors"]
    assert not any(offline.rglob("*")), "TensorBoard wrote to the home folder"


@pytest.mark.slow
def test_wandb_run_stays_offline_in_the_run_folder(tmp_path, offline):
    wandb = pytest.importorskip("wandb")

    try:
        log_rows(["wandb"], tmp_path / "run")
        [run_folder] = (tmp_path / "run" / "wandb").glob("offline-run-*")
        [log_file] = run_folder.glob("run-*.wandb")
        # `wandb leet inspect` is W&B's reader of the offline transaction log.
        out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log_file)],
                             capture_output=True, text=True, check=True, timeout=120)
    finally:
        wandb.teardown()  # stop the wandb-core service this test started
    records = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    [run] = [r["run"] for r in records if r["type"] == "run"]
    assert run["project"] == "rlvr" and run["display_name"] == "run" and run["telemetry"]["feature"]["offline"]
    assert run["config"]["update"]["distributed"] == CONFIG["distributed"]
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    for name in ("env/all/reward/mean", "optim/loss:sum"):
        assert [(h["_step"], h[name]) for h in history if name in h] == finite_history(name)
    assert [r["exit"]["exit_code"] for r in records if r["type"] == "exit"] == [0]
    assert not any(offline.rglob("*")), "W&B wrote to the home folder"


def test_a_failing_backend_is_counted_and_metrics_jsonl_still_written(tmp_path, monkeypatch):
    class Broken:
        def __init__(self, run_dir, config):
            pass

        def log(self, metrics, step):
            raise OSError("tracking server unreachable")

        def close(self):
            raise OSError("tracking server unreachable")

    monkeypatch.setitem(BACKENDS, "broken", Broken)
    with open_trackers(["broken"], tmp_path) as tracker:
        for step, row in enumerate(ROWS):
            tracker.log(row, step)
    assert tracker.auxiliary.failures == {"tracker Broken": len(ROWS) + 1}  # every log and the close
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().split("\n") if line]
    assert [r["step"] for r in rows] == [0, 1, 2]
