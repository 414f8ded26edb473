"""reasoning-gym as a problem source: disjoint splits, the dataset's own scoring through the reward runner, composites,
and loud failures (unknown names, bad configs, a missing package, a scorer that raises or hangs)."""

import sys
import time
from dataclasses import dataclass

import pytest

pytest.importorskip("reasoning_gym")

from reasoning_gym.dataset import ProceduralDataset
from reasoning_gym.factory import DATASETS, register_dataset

from rlvr.errors import ConfigurationError
from rlvr.rewards import resolve_reward, score_batch
from rlvr.rewards.reasoning_gym import extract_answer
from rlvr.tasks import ReasoningGymSource

SMALL_SUMS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


# -- a dataset of our own whose scorer misbehaves -------------------------------------------------------------------
@dataclass
class EchoConfig:
    seed: int | None = None
    size: int = 10
    behaviour: str = "ok"

    def validate(self):
        assert self.behaviour in ("ok", "raise", "hang"), "behaviour must be ok, raise or hang"


class EchoDataset(ProceduralDataset):
    """Question ``Say i``, answer ``i``; ``score_answer`` is exact match, raises or hangs as configured."""

    def __init__(self, config: EchoConfig):
        super().__init__(config=config, seed=config.seed, size=config.size)

    def __getitem__(self, idx):
        return {"question": f"Say {self.seed + idx}", "answer": str(self.seed + idx), "metadata": {}}

    def score_answer(self, answer, entry):
        if self.config.behaviour == "raise":
            raise ValueError("this scorer is broken")
        if self.config.behaviour == "hang":
            time.sleep(60)
        return float(answer == entry["answer"])


if "rlvr_test_echo" not in DATASETS:
    register_dataset("rlvr_test_echo", EchoDataset, EchoConfig)


# -- splits -----------------------------------------------------------------------------------------------------------
def test_train_and_test_come_from_disjoint_seeds_and_share_no_question():
    source = ReasoningGymSource("leg_counting", config={"max_animals": 2, "min_animals": 1}, num_train=200,
                                num_test=40, seed=7)
    train, test = source.problems("train"), source.problems("test")
    assert len(test) == 40 and 0 < len(train) <= 200
    assert source.dataset("train").seed == 7 and source.dataset("test").seed == 7 + 1_000_000
    assert not {p.question for p in train} & {p.question for p in test}
    assert len({p.id for p in train + test}) == len(train) + len(test)
    # deterministic: the same seeds give the same problems
    again = ReasoningGymSource("leg_counting", config={"max_animals": 2, "min_animals": 1}, num_train=200,
                               num_test=40, seed=7)
    assert [p.question for p in again.problems("test")] == [p.question for p in test]


def test_a_train_question_that_is_also_a_test_question_is_dropped():
    # one-digit sums: only 200 distinct questions, so 300 train draws must meet the 64 test ones
    source = ReasoningGymSource("chain_sum", config=SMALL_SUMS, num_train=300, num_test=64)
    test = {p.question for p in source.problems("test")}
    raw = [source.dataset("train")[i]["question"] for i in range(300)]
    assert sum(q in test for q in raw) > 0
    assert [p.question for p in source.problems("train")] == [q for q in raw if q not in test]


def test_overlapping_seed_ranges_are_refused_with_the_fix():
    with pytest.raises(ConfigurationError, match=r"seeds 0\.\.99 and the test split 50\.\.59, which overlap; "
                                                 r"leave test_seed unset"):
        ReasoningGymSource("gcd", num_train=100, num_test=10, test_seed=50)
    ReasoningGymSource("gcd", num_train=100, num_test=10, test_seed=100)  # adjacent is fine


# -- scoring ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "config"), [("chain_sum", SMALL_SUMS), ("number_sorting", {"max_numbers": 4}),
                                              ("spell_backward", {})])
@pytest.mark.parametrize("answer_format", ["final", "answer_tag", "plain"])
def test_the_runner_scores_as_the_datasets_own_score_answer(name, config, answer_format):
    source = ReasoningGymSource(name, config=config, num_train=10, num_test=6, answer_format=answer_format)
    dataset = source.dataset("test")
    wrap = {"final": "So the answer is \\boxed{{{}}}.", "answer_tag": "Thinking... <answer>{}</answer>",
            "plain": "{}"}[answer_format]
    items, expected = [], []
    for problem in source.problems("test"):
        entry = problem.meta["rg_entry"]
        for answer in (entry["answer"], f"{entry['answer']} maybe", "no idea"):
            response = wrap.format(answer)
            items.append((problem.question, response, problem.reward_meta()))
            expected.append(dataset.score_answer(extract_answer(response, answer_format), entry))
        items.append((problem.question, "", problem.reward_meta()))    # no answer at all: scored as None is
        expected.append(dataset.score_answer(None, entry))
    scores = score_batch(source.reward(), items, timeout=30.0)
    assert scores.failed == 0
    assert scores.scores == pytest.approx(expected)
    assert expected[0] == 1.0 and 0.0 in expected                   # right answers score 1, wrong ones less


def test_a_composite_mixes_its_datasets_by_weight_and_scores_each_with_its_own():
    config = {"datasets": [{"name": "gcd", "weight": 3, "config": {"max_value": 20}},
                           {"name": "lcm", "config": {"max_value": 20}}]}
    source = ReasoningGymSource("composite", config=config, num_train=50, num_test=40, answer_format="plain")
    test = source.problems("test")
    kinds = [p.meta["rg_source"] for p in test]
    assert set(kinds) == {"gcd", "lcm"} and kinds.count("gcd") > kinds.count("lcm")
    scores = score_batch(source.reward(), [(p.question, p.answer, p.reward_meta()) for p in test])
    assert scores.scores == [1.0] * len(test)
    with pytest.raises(ConfigurationError, match="has weight 0; weights must be positive"):
        ReasoningGymSource("composite", config={"datasets": [{"name": "gcd", "weight": 0}]})


def test_answer_extraction_follows_the_format():
    assert extract_answer("a \\boxed{1} then \\boxed{ 42 }", "final") == "42"
    assert extract_answer("The answer is 7.", "final") == "7"        # no \\boxed{}: a final-answer line
    assert extract_answer("7.", "final") == "7"                      # else the whole reply
    assert extract_answer("", "final") is None
    assert extract_answer("<answer>1</answer> <answer> x y </answer>", "answer_tag") == "x y"
    assert extract_answer("  42 \n", "plain") == "42"
    assert extract_answer("   ", "plain") is None


def test_the_prompt_says_how_to_answer():
    for answer_format, words in (("final", "\\boxed{}"), ("answer_tag", "<answer>"), ("plain", "only the answer")):
        source = ReasoningGymSource("gcd", num_train=5, num_test=5, answer_format=answer_format)
        problem = source.problems("test")[0]
        assert source.prompt_text(problem).startswith(problem.question) and words in source.prompt_text(problem)


# -- bad input --------------------------------------------------------------------------------------------------------
def test_an_unknown_dataset_name_says_what_is_near_and_how_to_list_them():
    with pytest.raises(ConfigurationError, match=r"no dataset 'leg_countin' \(did you mean 'leg_counting'.*"
                                                 r"listed by python -c .*reasoning_gym\.factory"):
        ReasoningGymSource("leg_countin")
    with pytest.raises(ConfigurationError, match="no dataset 'gdc'"):
        ReasoningGymSource("composite", config={"datasets": [{"name": "gdc"}]})


def test_a_bad_config_names_the_dataset_and_its_keys():
    with pytest.raises(ConfigurationError, match=r"'gcd': .*'max_animals'; its config keys are \[.*'max_value'"):
        ReasoningGymSource("gcd", config={"max_animals": 2})
    with pytest.raises(ConfigurationError, match=r"'gcd': its config \{'min_value': -1\} is refused"):
        ReasoningGymSource("gcd", config={"min_value": -1})
    with pytest.raises(ConfigurationError, match="config.seed is set by rlvr"):
        ReasoningGymSource("gcd", config={"seed": 3})


def test_a_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)   # `import reasoning_gym` now raises ImportError
    with pytest.raises(ConfigurationError, match=r"pip install 'rlvr\[reasoning-gym\]'"):
        ReasoningGymSource("gcd", num_test=3, seed=123)


def test_a_scorer_that_raises_is_counted_as_an_error_not_scored_zero():
    source = ReasoningGymSource("rlvr_test_echo", config={"behaviour": "raise"}, num_train=2, num_test=2,
                                answer_format="plain")
    problems = source.problems("test")
    scores = score_batch(source.reward(), [(p.question, p.answer, p.reward_meta()) for p in problems])
    assert scores.scores == [None, None] and scores.errors == 2 and scores.timeouts == 0
    assert "this scorer is broken" in scores.failures[0].message
    assert scores.metrics()["reward/errors:sum"] == 2.0


def test_a_scorer_that_hangs_is_killed_at_the_timeout_and_counted():
    source = ReasoningGymSource("rlvr_test_echo", config={"behaviour": "hang"}, num_train=2, num_test=2,
                                answer_format="plain")
    problem = source.problems("test")[0]
    started = time.monotonic()
    scores = score_batch(source.reward(), [(problem.question, problem.answer, problem.reward_meta())], timeout=0.5)
    assert time.monotonic() - started < 10
    assert scores.scores == [None] and scores.timeouts == 1


def test_the_reward_refuses_meta_without_an_entry():
    scores = score_batch(resolve_reward("reasoning_gym"), [("q", "1", {"answer": "1"})])
    assert scores.errors == 1 and "needs meta with 'rg_entry'" in scores.failures[0].message
    with pytest.raises(ConfigurationError, match="answer_format='xml'"):
        resolve_reward("reasoning_gym", answer_format="xml")
