"""`rlvr sample` and `rlvr chat` on a run of tiny: the answers are the engine's own sampling from the run's checkpoint
with the same seed, through the chat template, a chat keeps its history, and the defaults are the run's."""

import functools

import pytest
from typer.testing import CliRunner

import rlvr
from rlvr import types
from rlvr.cli import app
from rlvr.rl import LoopConfig, train
from rlvr.rl.checkpoints import last_checkpoint
from rlvr.tasks.base import Problem, ProblemSource


class Lowercase(ProblemSource):
    """Any question; the reward is the share of lowercase letters in the answer (so groups differ and tiny learns)."""

    name = "lowercase"

    def __init__(self) -> None:
        super().__init__(reward=lambda prompt, response, meta=None: sum("a" <= c <= "z" for c in response)
                         / max(len(response), 1))

    def splits(self):
        return ("train", "test")

    def load(self, split):
        return [Problem(id=f"{split}/{i}", question=f"Say a, {i}.", answer="a") for i in range(8)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Two RL steps of tiny at a high learning rate (so its answers are not the base model's), a checkpoint each; its
    config.yaml records max_tokens=5 and temperature=0.9."""
    folder = tmp_path_factory.mktemp("chat") / "run"
    train(LoopConfig(base_model="tiny", rank=8, steps=2, problems_per_step=2, group_size=4, max_tokens=5,
                     temperature=0.9, learning_rate=0.05, eval_problems=1, save_every=1, keep_checkpoints=0,
                     out=str(folder)), Lowercase())
    return folder


@functools.cache
def loaded(state_path):
    training_client = rlvr.ServiceClient().create_training_client_from_state(state_path)
    return training_client.save_weights_and_get_sampling_client(), training_client.get_tokenizer()


def engine_answers(state_path, messages, n, **params):
    """What the engine samples from ``state_path`` for ``messages`` through the chat template."""
    sampler, tokenizer = loaded(state_path)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt = types.ModelInput.from_ints(tokenizer.encode(text, add_special_tokens=False))
    sequences = sampler.sample(prompt, n, types.SamplingParams(**params)).result().sequences
    return [tokenizer.decode(s.tokens, skip_special_tokens=True) for s in sequences]


def invoke(*args, input=None):
    result = CliRunner().invoke(app, list(args), input=input, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_sample_is_the_engines_own_sampling_from_the_run_with_the_same_seed(run):
    question = [{"role": "user", "content": "What is 2 + 3?"}]
    expected = engine_answers(last_checkpoint(run)["state_path"], question, 3, max_tokens=12, temperature=1.0, seed=7)
    out = invoke("sample", str(run), "What is 2 + 3?", "--n", "3", "--seed", "7", "--temperature", "1", "--max-tokens",
                 "12")
    assert out == "".join(f"--- {i + 1}/3 ---\n{answer}\n" for i, answer in enumerate(expected))
    base = rlvr.ServiceClient().create_lora_training_client(base_model="tiny", rank=8, seed=0).save_state("b")
    assert engine_answers(base.result().path, question, 3, max_tokens=12, temperature=1.0, seed=7) != expected


def test_sample_defaults_to_the_runs_budget_and_temperature_and_takes_a_named_checkpoint(run):
    first = str(run / "checkpoints" / "weights" / "step-000001")
    expected = engine_answers(first, [{"role": "user", "content": "1 + 1"}], 1, max_tokens=5, temperature=0.9,
                              seed=1)
    assert invoke("sample", str(run), "1 + 1", "--seed", "1", "--checkpoint", "step-000001") == f"{expected[0]}\n"
    result = CliRunner().invoke(app, ["sample", str(run), "1 + 1", "--checkpoint", "step-000009"])
    assert result.exit_code == 1 and "'step-000009' is neither one of" in result.output


def test_chat_uses_the_chat_template_and_keeps_the_history(run):
    """Each reply answers the whole conversation so far (replies included); /exit ends it. Control and separator
    characters in a turn are text like any other."""
    state = last_checkpoint(run)["state_path"]
    turns = ["hello", "and \x00\u2028 now? é", "/exit", "never read"]
    messages, replies = [], []
    for turn in turns[:2]:
        messages.append({"role": "user", "content": turn})
        replies.append(engine_answers(state, messages, 1, max_tokens=8, temperature=0.9, seed=3)[0])
        messages.append({"role": "assistant", "content": replies[-1]})
    out = invoke("chat", str(run), "--seed", "3", "--max-tokens", "8", input="\n".join(turns) + "\n")
    assert out == "".join(f"{reply}\n" for reply in replies)
    alone = engine_answers(state, messages[2:3], 1, max_tokens=8, temperature=0.9, seed=3)[0]
    assert alone != replies[1]  # without the history, the second turn gets another answer
    assert invoke("chat", str(run), "--seed", "3", "--max-tokens", "8", input="hello") == f"{replies[0]}\n"  # EOF
    broken = invoke("chat", str(run), "--seed", "3", "--max-tokens", "8", input=b"caf\xe9 \xff\n")  # not UTF-8
    replaced = [{"role": "user", "content": "caf\ufffd \ufffd"}]
    assert broken == engine_answers(state, replaced, 1, max_tokens=8, temperature=0.9, seed=3)[0] + "\n"
