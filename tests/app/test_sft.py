"""Supervised fine-tuning: datums weight only the completion, and cross_entropy steps learn it."""

import json

import pytest

import rlvr
from rlvr.app.sft import SftConfig, encode_pair, read_pairs, supervised_steps
from rlvr.errors import ConfigurationError
from rlvr.rl.datums import sft_datum


def test_sft_datum_weights_only_the_completion():
    datum = sft_datum([1, 2, 3], [7, 8])
    assert datum.model_input.to_ints() == [1, 2, 3, 7]
    assert datum.loss_fn_inputs["target_tokens"].tolist() == [2, 3, 7, 8]
    assert datum.loss_fn_inputs["weights"].tolist() == [0.0, 0.0, 1.0, 1.0]
    with pytest.raises(ValueError):
        sft_datum([], [1])


def test_encode_pair_uses_the_chat_template_and_ends_the_turn(service):
    tokenizer = service.create_lora_training_client(base_model="tiny", rank=4).get_tokenizer()
    prompt, completion = encode_pair(tokenizer, "What is 2 + 2?", "4")
    text = tokenizer.decode(prompt)
    assert "What is 2 + 2?" in text and text.endswith("assistant\n")
    assert completion[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(completion[:-1]) == "4"


def test_supervised_steps_learn_the_completions(service):
    training_client = service.create_lora_training_client(base_model="tiny", rank=16, seed=0)
    tokenizer = training_client.get_tokenizer()
    examples = [encode_pair(tokenizer, f"Say {w}.", w) for w in ("apple", "pear", "plum", "fig")]
    losses = supervised_steps(training_client, examples, steps=40, batch_size=4, learning_rate=1e-2)
    assert losses[-1] < 0.2 * losses[0], losses[::8]


def test_read_pairs_names_the_bad_record(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n" + json.dumps({"prompt": "a"}) + "\n")
    with pytest.raises(ConfigurationError, match="record 1 needs"):
        read_pairs(path)
    with pytest.raises(ConfigurationError, match="does not exist"):
        SftConfig(data=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ConfigurationError, match="data"):
        SftConfig()


def test_sft_returns_a_loadable_state(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}?", "completion": f"{i}!"}) + "\n" for i in range(4)))
    from rlvr.app.sft import sft

    state = sft(SftConfig(data=str(path), base_model="tiny", rank=4, steps=2, batch_size=2, out=str(tmp_path / "o")))
    assert rlvr.ServiceClient().create_training_client_from_state(state).get_info().model_name


def test_python_api_takes_plain_dicts(tmp_path):
    """rlvr.sft and rlvr.evaluate take the same dicts as the YAML files; a misspelt key is refused by name."""
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1?", "completion": f"{i + 1}"}) + "\n" for i in range(4)))
    with pytest.raises(ConfigurationError, match="learning_rte.*learning_rate"):
        rlvr.sft({"data": str(path), "learning_rte": 1e-3})
    state = rlvr.sft({"data": str(path), "base_model": "tiny", "rank": 4, "steps": 1, "batch_size": 2,
                      "out": str(tmp_path / "o")})
    report = rlvr.evaluate({"recipe": "arithmetic", "base_model": "tiny", "max_tokens": 4}, checkpoint=state,
                           num_samples=2, k=[1, 2], problems=3)
    assert report["problems"] == 3 and report["samples_per_problem"] == 2
    assert 0.0 <= report["pass@1"] <= report["pass@2"] <= 1.0
