"""The problem interface: reward meta, splits, deterministic shuffling, difficulty filters, few-shot prompts and
rendering through a chat template."""

import pytest

import rlvr.rewards
import rlvr.tasks
from rlvr.engine.models.tiny import build_tiny_tokenizer
from rlvr.errors import ConfigurationError
from rlvr.rewards import resolve_reward
from rlvr.tasks import FileSource, Problem, select

RECORDS = [{"question": f"What is {i} + 1?", "answer": str(i + 1), "solution": f"{i} + 1 = \\boxed{{{i + 1}}}",
            "level": i % 3 + 1} for i in range(10)]
FIELDS = {"question": "question", "answer": "answer", "solution": "solution", "difficulty": "level"}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def test_exports_are_sorted_and_exist():
    for module in (rlvr.rewards, rlvr.tasks):
        assert module.__all__ == sorted(module.__all__)
        assert all(hasattr(module, name) for name in module.__all__)


def test_reward_meta_merges_answer_tests_and_id():
    problem = Problem(id="x/1", question="q", answer="3", tests=("assert f() == 3",), meta={"test_setup_code": ""})
    assert problem.reward_meta() == {"test_setup_code": "", "answer": "3", "tests": ["assert f() == 3"],
                                     "problem_id": "x/1"}
    assert Problem(id="y", question="q").reward_meta() == {"problem_id": "y"}


def test_select_by_difficulty():
    problems = [Problem(id=str(d), question="q", difficulty=d) for d in (1, 2, 3)] + [Problem(id="n", question="q")]
    assert [p.id for p in select(problems, max_difficulty=2)] == ["1", "2"]
    assert [p.id for p in select(problems, min_difficulty=2, max_difficulty=3)] == ["2", "3"]
    assert len(select(problems)) == 4


def test_problems_order_shuffle_limit_and_split_errors():
    source = FileSource(RECORDS, FIELDS)
    canonical = [p.id for p in source.problems("train")]
    assert canonical == [f"file/{i}" for i in range(10)]
    shuffled = [p.id for p in source.problems("train", shuffle=True, seed=3)]
    assert shuffled == [p.id for p in FileSource(RECORDS, FIELDS).problems("train", shuffle=True, seed=3)]
    assert shuffled != canonical and sorted(shuffled) == sorted(canonical)
    assert shuffled != [p.id for p in source.problems("train", shuffle=True, seed=4)]
    assert [p.difficulty for p in source.problems("train", max_difficulty=1, limit=2)] == [1.0, 1.0]
    with pytest.raises(ConfigurationError, match=r"splits \['train'\]"):
        source.problems("test")


def test_render_through_the_chat_template(tokenizer):
    source = FileSource(RECORDS, FIELDS, system_prompt="Be brief.", instruction="Box it.")
    problem = source.problems("train")[0]
    expected = ("<|im_start|>system\nBe brief.<|im_end|>\n"
                "<|im_start|>user\nWhat is 0 + 1?\n\nBox it.<|im_end|>\n"
                "<|im_start|>assistant\n")
    assert source.render(problem, tokenizer) == expected
    ids = source.render_ids(problem, tokenizer)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert tokenizer.decode(ids) == expected


def test_few_shot_examples_never_include_the_problem_itself(tokenizer):
    source = FileSource(RECORDS, FIELDS, few_shot=2, seed=0)
    for problem in source.problems("train"):
        messages = source.messages(problem)
        assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
        assert messages[-1]["content"].startswith(problem.question)
        assert problem.question not in messages[0]["content"] + messages[2]["content"]
        assert messages[1]["content"].endswith("}")  # the worked solution, with its \boxed{}
    text = source.render(source.problems("train")[0], tokenizer)
    assert text.count("<|im_start|>user") == 3 and text.count("<|im_start|>assistant") == 3


def test_explicit_few_shot_examples_and_missing_solutions():
    shot = Problem(id="shot", question="What is 9 + 9?", solution="\\boxed{18}")
    source = FileSource(RECORDS, FIELDS, few_shot=[shot], instruction="")
    messages = source.messages(source.problems("train")[0])
    assert messages[:2] == [{"role": "user", "content": "What is 9 + 9?"}, {"role": "assistant",
                                                                            "content": "\\boxed{18}"}]
    bare = FileSource(RECORDS, {"question": "question", "answer": "answer"}, few_shot=1)
    with pytest.raises(ConfigurationError, match="has no solution"):
        bare.messages(bare.problems("train")[0])
    with pytest.raises(ConfigurationError, match="few_shot"):
        FileSource(RECORDS, FIELDS, few_shot=-1)


def test_tokenizer_without_a_template_gets_plain_turns():
    class Plain:
        chat_template = None

    source = FileSource(RECORDS, FIELDS, instruction="")
    text = source.render(source.problems("train")[1], Plain())
    assert text == "User: What is 1 + 1?\n\nAssistant:"


def test_score_and_reward_override():
    source = FileSource(RECORDS, FIELDS)
    problem = source.problems("train")[4]
    assert source.score(problem, "so \\boxed{5}") == 1.0
    assert source.score(problem, "5") == pytest.approx(0.9)      # correct, not boxed: format_correct
    assert source.score(problem, "\\boxed{6}") == 0.0
    strict = FileSource(RECORDS, FIELDS, reward=resolve_reward("math_correct", require_boxed=True))
    assert strict.score(problem, "5") == 0.0 and strict.reward().name == "math_correct"
