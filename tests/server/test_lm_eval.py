"""lm-evaluation-harness (``lm_eval.simple_evaluate``) against a live ``rlvr serve``'s ``/v1``: a multiple-choice task
scored by loglikelihood through ``local-completions`` (``echo`` with prompt logprobs) and a generation task scored by
exact match through ``local-chat-completions``, both defined on local JSONL files (no hub). Their scores, and every
per-item number behind them, equal what rlvr's engine computes for the same prompts directly: the choices'
logprobs from ``SamplingClient.compute_logprobs``, whether a choice is the greedy continuation from greedy samples,
the generations from the engine's greedy samples of the chat-templated prompts."""

from __future__ import annotations

import json
import random
from concurrent.futures import Future

import numpy as np
import pytest
import yaml
from tinker import types

lm_eval = pytest.importorskip("lm_eval", reason="the lm-eval test needs lm-eval: pip install 'rlvr[eval]'")

pytestmark = pytest.mark.slow  # lm-eval's import and ~100 engine requests: tens of seconds on two cores

ITEMS = 12
"""Items per task: enough that an equal score is no coincidence."""
MAX_GEN = 4
"""Tokens a generation item samples at most."""


@pytest.fixture(scope="module")
def sampler(service):
    return service.create_sampling_client(base_model="tiny")


@pytest.fixture(scope="module")
def tokenizer(sampler):
    return sampler.get_tokenizer()


def _greedy(sampler, prompt: list[int], max_tokens: int, stop: list[str] | None = None) -> Future:
    """The engine's greedy sample of ``prompt``, as a future (its ``.result().sequences[0].tokens``)."""
    params = types.SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=stop)
    return sampler.sample(types.ModelInput.from_ints(prompt), 1, params)


def _tokens(future: Future) -> list[int]:
    return future.result().sequences[0].tokens


def _round_trips(tokenizer, tokens: list[int]) -> bool:
    """The tokens' text encodes back to them (no broken UTF-8, no special token), so lm-eval sends the same ids."""
    text = tokenizer.decode(tokens)
    return bool(text) and tokenizer.encode(text) == tokens and text.isprintable()


def _write_task(folder, name: str, rows: list[dict], config: dict) -> None:
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = {"task": name, "dataset_path": "json", "test_split": "test",
              "dataset_kwargs": {"data_files": {"test": str(data)}, "cache_dir": str(folder / "datasets")}, **config}
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(config))


def _evaluate(server, monkeypatch, folder, model: str, task: str, **kwargs) -> dict:
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("OPENAI_API_KEY", server.api_key)  # what local-completions sends as its Bearer key
    route = "chat/completions" if model == "local-chat-completions" else "completions"
    model_args = {"model": "tiny", "base_url": f"{server.base_url}/v1/{route}", "max_retries": 1,
                  "num_concurrent": 1, **kwargs.pop("model_args", {})}
    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=[task], log_samples=True,
                                   task_manager=TaskManager(include_path=str(folder), include_defaults=False),
                                   bootstrap_iters=0, **kwargs)


def test_multiple_choice_by_loglikelihood_scores_as_the_engines_logprobs(server, sampler, tokenizer, tmp_path,
                                                                         monkeypatch):
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    rows = []
    contexts = [f"Item {i}: the answer is" for i in range(64)]
    greedy_runs = [_greedy(sampler, tokenizer.encode(c), 2) for c in contexts]  # submitted together: one batch
    for context, future in zip(contexts, greedy_runs, strict=True):
        # contexts whose greedy continuation is text come first, one choice the model's own
        greedy = _tokens(future)
        if len(rows) < ITEMS // 2 and len(greedy) == 2 and _round_trips(tokenizer, greedy):
            others = ["".join(rng.choices(letters, k=rng.randint(1, 6))) for _ in range(3)]
            rows.append({"question": context, "choices": [tokenizer.decode(greedy), *others]})
        elif len(rows) >= ITEMS // 2:
            rows.append({"question": context, "choices": ["".join(rng.choices(letters, k=rng.randint(1, 6)))
                                                          for _ in range(4)]})
        if len(rows) == ITEMS:
            break
    assert len(rows) == ITEMS, "too few contexts with a printable greedy continuation"
    for row in rows:
        rng.shuffle(row["choices"])
        row["gold"] = rng.randrange(4)
    _write_task(tmp_path, "rlvr_choice", rows, {
        "output_type": "multiple_choice", "doc_to_text": "{{question}}", "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{gold}}", "target_delimiter": "",
        "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}]})
    tokenizer.save_pretrained(tmp_path / "tokenizer")  # lm-eval counts the context's tokens with the model's own

    out = _evaluate(server, monkeypatch, tmp_path, "local-completions", "rlvr_choice", batch_size=16, model_args={
        "tokenizer": str(tmp_path / "tokenizer"), "tokenizer_backend": "huggingface", "tokenized_requests": True})

    # the engine's own: log p(choice | question) summed over the choice's tokens, greedy if greedy decoding writes it
    expected_acc, expected_norm, greedy_choices = [], [], 0
    samples = sorted(out["samples"]["rlvr_choice"], key=lambda s: s["doc_id"])
    pairs = [(tokenizer.encode(row["question"]), tokenizer.encode(choice)) for row in rows for choice in row["choices"]]
    logprob_futures = [sampler.compute_logprobs(types.ModelInput.from_ints(c + x)) for c, x in pairs]
    greedy_futures = iter([_greedy(sampler, c, len(x)) for c, x in pairs])
    logprob_futures = iter(logprob_futures)
    for row, sample in zip(rows, samples, strict=True):
        context = tokenizer.encode(row["question"])
        scores = []
        for choice, (their_ll, their_greedy) in zip(row["choices"], sample["filtered_resps"], strict=True):
            continuation = tokenizer.encode(choice)
            ll = sum(next(logprob_futures).result()[len(context):])
            is_greedy = _tokens(next(greedy_futures)) == continuation
            assert float(their_ll) == pytest.approx(ll, abs=1e-5) and their_greedy == is_greedy
            greedy_choices += is_greedy
            scores.append(ll)
        expected_acc.append(float(np.argmax(scores) == row["gold"]))
        expected_norm.append(float(np.argmax(np.array(scores) / [len(c) for c in row["choices"]]) == row["gold"]))
    assert greedy_choices == ITEMS // 2  # is_greedy was put to the test both ways
    results = out["results"]["rlvr_choice"]
    assert results["acc,none"] == pytest.approx(np.mean(expected_acc), abs=1e-12)
    assert results["acc_norm,none"] == pytest.approx(np.mean(expected_norm), abs=1e-12)
    assert 0 < np.mean(expected_acc) < 1 or 0 < np.mean(expected_norm) < 1  # not a score any scorer gets


def test_generation_by_exact_match_scores_as_the_engines_greedy_samples(server, sampler, tokenizer, tmp_path,
                                                                       monkeypatch):
    stop = ["\n"]

    def engine_answer(question: str) -> str:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                               tokenize=False)
        # alone, as the server samples each chat request: a batch's rounding could break a near tie otherwise
        tokens = _tokens(_greedy(sampler, tokenizer.encode(prompt, add_special_tokens=False), MAX_GEN, stop))
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        return text.split(stop[0])[0]

    questions = [f"Question {i}: what comes next?" for i in range(ITEMS)]
    answers = [engine_answer(q) for q in questions]
    # half the targets are the engine's own answer, half are not: only the same generations score 0.5
    rows = [{"question": q, "answer": a if i % 2 == 0 else a + "?"}
            for i, (q, a) in enumerate(zip(questions, answers, strict=True))]
    _write_task(tmp_path, "rlvr_generate", rows, {
        "output_type": "generate_until", "doc_to_text": "{{question}}", "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": stop, "max_gen_toks": MAX_GEN, "do_sample": False, "temperature": 0.0},
        "metric_list": [{"metric": "exact_match"}]})

    out = _evaluate(server, monkeypatch, tmp_path, "local-chat-completions", "rlvr_generate",
                    apply_chat_template=True)

    samples = sorted(out["samples"]["rlvr_generate"], key=lambda s: s["doc_id"])
    for question, answer, sample in zip(questions, answers, samples, strict=True):
        sent = json.loads(sample["arguments"][0][0][0])  # (JsonChatStr(prompt), gen_kwargs)
        assert sent == [{"role": "user", "content": question}]  # the prompt the engine's answer was sampled from
        assert sample["filtered_resps"] == [answer]
    assert out["results"]["rlvr_generate"]["exact_match,none"] == 0.5
