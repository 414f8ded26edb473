"""GSM8K-format problems: the #### answer, demonstrations, splits, and the real training file."""

from pathlib import Path

import pytest

from rlvr.engine.models.tiny import build_tiny_tokenizer
from rlvr.tasks import Gsm8kSource, HubDataset
from rlvr.tasks.math import clean_solution, final_answer

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
RECORDS = [
    {"question": "Ann has 3 apples and buys 4. How many?", "answer": "3+4=<<3+4=7>>7\n#### 7"},
    {"question": "A car costs $1,000 more than $80. Price?", "answer": "It costs 1000+80=<<1000+80=1080>>1080\n"
                                                                      "So 1080 dollars.\n#### 1,080"},
]


def test_final_answer_and_clean_solution():
    assert final_answer("a\n#### 1,080") == "1080"
    assert final_answer("x #### $5 ") == "5"
    expected = "It costs 1000+80=1080\nSo 1080 dollars.\nThe answer is \\boxed{1080}."
    assert clean_solution(RECORDS[1]["answer"]) == expected
    with pytest.raises(ValueError, match="####"):
        final_answer("no marker")


def test_records_become_problems():
    source = Gsm8kSource(RECORDS)
    first, second = source.problems("train")
    assert (first.id, first.answer, first.difficulty) == ("gsm8k/0", "7", 1.0)
    assert (second.answer, second.difficulty) == ("1080", 2.0)
    assert second.solution == RECORDS[1]["answer"]
    assert source.score(second, "so \\boxed{1080}") == 1.0
    assert source.score(second, "so \\boxed{1,080}") == 1.0
    assert source.score(second, "so \\boxed{1081}") == 0.0
    assert source.score(second, "The answer is 1080.") == pytest.approx(0.9)  # correct, not boxed
    assert source.score(second, "It is 1080") == pytest.approx(-0.1)  # a number among words states no answer


def test_a_bad_record_names_its_index_and_fields():
    with pytest.raises(ValueError, match=r"record 1 of split 'train'.*\['answer', 'question'\]"):
        Gsm8kSource([RECORDS[0], {"question": "q", "answer": "no final line"}]).problems("train")


def test_hub_spec_fetches_nothing_until_asked():
    assert Gsm8kSource.hub() == HubDataset("openai/gsm8k", "main")
    assert Gsm8kSource(Gsm8kSource.hub()).splits() == ("train", "test")


def test_real_training_file():
    path = DATA / "gsm8k" / "train.jsonl"
    if not path.is_file():
        pytest.skip(f"GSM8K data not found at {path} (the shared data folder sits at ../shared/data)")
    source = Gsm8kSource(str(path), test_fraction=0.1, split_seed=0, few_shot=2)
    train, test = source.problems("train"), source.problems("test")
    assert len(train) + len(test) == 7473 and len(test) == 747
    assert not {p.id for p in train} & {p.id for p in test}
    assert [p.id for p in test] == [p.id for p in Gsm8kSource(str(path), test_fraction=0.1).problems("test")]
    assert all(p.answer.lstrip("-").replace(".", "").isdigit() for p in train)
    assert min(p.difficulty for p in train) >= 1 and max(p.difficulty for p in train) >= 8
    problem = test[0]
    prompt = source.render(problem, build_tiny_tokenizer())
    assert prompt.count("The answer is \\boxed{") == 2 and "<<" not in prompt
    assert prompt.endswith(f"{problem.question}\n\n{source.instruction}<|im_end|>\n<|im_start|>assistant\n")
