"""OpenAI-compatible sampling (``rlvr.server.openai``) through the official ``openai`` client: against a live
``rlvr serve`` (``openai.OpenAI``) and in process (``openai_client``: ``openai.AsyncOpenAI`` over ASGI, no socket).
Every sampled number is checked against the engine's own: token ids, seeds, logprobs, checkpoint weights."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import numpy as np
import pytest
from tinker import types

openai = pytest.importorskip("openai")

from rlvr.server import openai_client  # noqa: E402  (after the skip: needs the server extra)

PROMPT = list(b"Q: 2+2? A:")
TARGET = list(b" four.")
DATUM = types.Datum(model_input=types.ModelInput.from_ints((PROMPT + TARGET)[:-1]), loss_fn_inputs={
    "target_tokens": types.TensorData(data=(PROMPT + TARGET)[1:], dtype="int64"),
    "weights": types.TensorData(data=[0.0] * (len(PROMPT) - 1) + [1.0] * len(TARGET), dtype="float32")})
"""Cross-entropy on TARGET after PROMPT: a few steps of it move the tiny model's greedy answer."""
MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2+2?"}]
NOT_IN_SPECIAL_TOKENS = set("0123456789!#$%&()*+,-./:;=?@[]^`{}~ABCDEFGHIJKLMNOPQRSTUVWXYZbcghjklpquvwyz")
"""Stop characters the engine cannot see inside a special token's text (``<|im_end|>`` ...) where the returned text,
which leaves special tokens out, would not show them."""


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.api_key, max_retries=0)


@pytest.fixture(scope="module")
def tokenizer(service):
    return service.create_sampling_client(base_model="tiny").get_tokenizer()


@pytest.fixture(scope="module")
def checkpoint(service):
    """A tiny LoRA after three cross-entropy steps on PROMPT -> TARGET, saved for sampling under a fresh name."""
    tc = service.create_lora_training_client("tiny", rank=4, seed=0)
    for _ in range(3):
        tc.forward_backward([DATUM], "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=2e-2))
    name = f"oai-{uuid.uuid4().hex[:8]}"
    return name, tc.save_weights_for_sampler(name).result().path, tc


def _engine_logprobs(service, prompt: list[int], tokens: list[int], model_path: str | None = None) -> list[float]:
    """The engine's log p(token) for each of ``tokens`` after ``prompt`` (a forward over both, no sampling)."""
    client = service.create_sampling_client(model_path=model_path, base_model=None if model_path else "tiny")
    return client.compute_logprobs(types.ModelInput.from_ints(prompt + tokens)).result()[len(prompt):]


def _http(server, key: str | None = None) -> httpx.Client:
    return httpx.Client(base_url=f"{server.base_url}/v1", headers={"Authorization": f"Bearer {key or server.api_key}"},
                        timeout=60)


# -- sampling ---------------------------------------------------------------------------------------------------------

def test_completions_n_seed_and_token_ids(oai, tokenizer):
    def sample(seed: int):
        return oai.completions.create(model="tiny", prompt="Hello", max_tokens=6, n=3, seed=seed)

    first, again, other = sample(7), sample(7), sample(8)
    assert [c.index for c in first.choices] == [0, 1, 2]
    ids = [c.token_ids for c in first.choices]
    assert all(1 <= len(t) <= 6 for t in ids) and len({tuple(t) for t in ids}) > 1  # n draws, not one copied
    for choice in first.choices:
        assert choice.prompt_token_ids == tokenizer.encode("Hello")
        assert choice.text == tokenizer.decode(choice.token_ids, skip_special_tokens=True)
        assert choice.finish_reason == ("length" if len(choice.token_ids) == 6 else "stop")
    assert [c.token_ids for c in again.choices] == ids  # a seed reproduces
    assert [c.token_ids for c in other.choices] != ids
    assert first.usage.prompt_tokens == 5 and first.usage.completion_tokens == sum(len(t) for t in ids)


def test_several_prompts_in_one_completion_request_are_numbered_prompt_by_prompt(oai, tokenizer):
    texts = oai.completions.create(model="tiny", prompt=["Hi", "Yo"], max_tokens=4, n=2, seed=3)
    assert [c.index for c in texts.choices] == [0, 1, 2, 3]
    assert [c.prompt_token_ids for c in texts.choices] == [tokenizer.encode(p) for p in ("Hi", "Hi", "Yo", "Yo")]
    ids = [c.token_ids for c in texts.choices]
    assert ids[:2] != ids[2:] and texts.usage.prompt_tokens == 4
    assert texts.usage.completion_tokens == sum(len(t) for t in ids)
    tokens = oai.completions.create(model="tiny", prompt=[tokenizer.encode("Hi"), tokenizer.encode("Yo")],
                                    max_tokens=4, n=2, seed=3)
    assert [c.token_ids for c in tokens.choices] == ids  # one seed: a prompt as text or as its ids samples the same


def test_completion_logprobs_are_the_engines_for_the_same_tokens(oai, service):
    out = oai.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, seed=1, logprobs=3,
                                 extra_body={"return_tokens_as_token_ids": True}).choices[0]
    assert out.prompt_token_ids == PROMPT
    assert out.logprobs.tokens == [f"token_id:{t}" for t in out.token_ids]
    np.testing.assert_allclose(out.logprobs.token_logprobs, _engine_logprobs(service, PROMPT, out.token_ids),
                               atol=1e-4)
    for top, token, logprob in zip(out.logprobs.top_logprobs, out.token_ids, out.logprobs.token_logprobs,
                                   strict=True):
        assert len(top) == 3 and max(top.values()) >= logprob - 1e-4
        assert f"token_id:{token}" not in top or top[f"token_id:{token}"] == pytest.approx(logprob, abs=1e-4)


def test_chat_renders_the_chat_template_and_returns_the_engines_logprobs(oai, service, tokenizer):
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    parts = [MESSAGES[0], {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text",
                                                                                           "text": "2+2?"}]}]
    for messages in (MESSAGES, parts):
        out = oai.chat.completions.create(model="tiny", messages=messages, max_completion_tokens=5, seed=2,
                                          logprobs=True, top_logprobs=2)
        assert out.prompt_token_ids == tokenizer.encode(text, add_special_tokens=False)
        choice = out.choices[0]
        assert 1 <= len(choice.token_ids) <= 5 and choice.message.role == "assistant"
        assert choice.message.content == tokenizer.decode(choice.token_ids, skip_special_tokens=True)
        assert [len(e.top_logprobs) for e in choice.logprobs.content] == [2] * len(choice.token_ids)
        np.testing.assert_allclose([e.logprob for e in choice.logprobs.content],
                                   _engine_logprobs(service, out.prompt_token_ids, choice.token_ids), atol=1e-4)
    assert text.endswith("<|im_start|>assistant\n")


def test_stop_string_ends_the_sample_and_is_left_out_of_the_text(oai):
    for seed in range(20):
        full = oai.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, seed=seed).choices[0]
        stops = [i for i, c in enumerate(full.text[:-1]) if c in NOT_IN_SPECIAL_TOKENS]
        if stops:
            break
    stop = full.text[stops[0]]
    cut = oai.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, seed=seed, stop=[stop, "never"]
                                 ).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[:full.text.index(stop)]
    assert len(cut.token_ids) < len(full.token_ids) and cut.token_ids == full.token_ids[:len(cut.token_ids)]


def test_streams_carry_the_same_choices_and_end_with_done(oai, server):
    plain = oai.completions.create(model="tiny", prompt="Hi", max_tokens=5, n=2, seed=4)
    chunks = list(oai.completions.create(model="tiny", prompt="Hi", max_tokens=5, n=2, seed=4, stream=True,
                                         stream_options={"include_usage": True}))
    texts = {i: "".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i) for i in (0, 1)}
    assert texts == {c.index: c.text for c in plain.choices}
    assert chunks[-1].usage == plain.usage

    chat = oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, seed=4)
    streamed = list(oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, seed=4, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == chat.choices[0].message.content
    assert [c.choices[0].finish_reason for c in streamed][-1] == chat.choices[0].finish_reason

    with _http(server) as http:
        raw = http.post("/chat/completions", json={"model": "tiny", "messages": MESSAGES, "max_tokens": 3,
                                                   "stream": True})
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.endswith("data: [DONE]\n\n") and raw.text.count("data: ") == 2


# -- which weights ----------------------------------------------------------------------------------------------------

def test_a_saved_sampler_checkpoint_is_listed_and_sampled_with_its_own_weights(oai, service, checkpoint):
    name, path, _ = checkpoint
    listed = {m.id: m for m in oai.models.list().data}
    assert {"tiny", "smollm2-135m", path} <= set(listed) and listed[path].parent == "tiny"

    def greedy(model: str):
        return oai.completions.create(model=model, prompt=PROMPT, max_tokens=len(TARGET), temperature=0,
                                      logprobs=0).choices[0]

    base, trained = greedy("tiny"), greedy(path)
    assert trained.token_ids != base.token_ids
    np.testing.assert_allclose(trained.logprobs.token_logprobs,
                               _engine_logprobs(service, PROMPT, trained.token_ids, path), atol=1e-4)
    for alias in (name, path.replace("rlvr://", "tinker://"), path.removeprefix("rlvr://")):
        assert greedy(alias).token_ids == trained.token_ids


def test_checkpoints_made_through_the_server_belong_to_their_key(sdk, server):
    tc = sdk.create_lora_training_client(base_model="tiny", rank=2, seed=3).result()
    path = tc.save_weights_for_sampler(f"oai-owned-{uuid.uuid4().hex[:6]}").result().path  # tinker://...
    mine = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.api_key, max_retries=0)
    theirs = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.other_key, max_retries=0)
    assert path.replace("tinker://", "rlvr://") in {m.id for m in mine.models.list().data}
    assert path.replace("tinker://", "rlvr://") not in {m.id for m in theirs.models.list().data}
    assert mine.completions.create(model=path, prompt="x", max_tokens=2).choices[0].token_ids
    with pytest.raises(openai.NotFoundError) as refused:
        theirs.completions.create(model=path, prompt="x", max_tokens=2)
    assert refused.value.body["param"] == "model"


# -- keys and errors --------------------------------------------------------------------------------------------------

def test_a_wrong_or_missing_key_is_401_in_openais_shape(server):
    wrong = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="tml-wrong-key-000000000", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        wrong.models.list()
    assert refused.value.status_code == 401 and refused.value.body["code"] == "invalid_api_key"
    missing = httpx.post(f"{server.base_url}/v1/completions", json={"model": "tiny", "prompt": "x"}, timeout=30)
    assert missing.status_code == 401
    assert missing.json()["error"]["message"].startswith("missing API key")


BAD_REQUESTS = [
    ("/completions", {"prompt": "x", "temperature": -1}, "temperature", "greater than or equal to 0"),
    ("/completions", {"prompt": "x", "top_p": 0}, "top_p", "greater than 0"),
    ("/completions", {"prompt": "x", "n": 0}, "n", "greater than or equal to 1"),
    ("/completions", {"prompt": "x", "logprobs": 21}, "logprobs", "less than or equal to 20"),
    ("/completions", {"prompt": "x", "stop": ["", "y"]}, "stop", "non-empty"),
    ("/completions", {}, "prompt", "prompt is required"),
    ("/completions", {"prompt": [300000]}, None, "outside the vocabulary"),
    ("/completions", {"prompt": ["x", [1]]}, "prompt", "a list of token ids"),
    ("/completions", {"prompt": []}, "prompt", "none empty"),
    ("/completions", {"prompt": "x", "stop": 5}, "stop", "valid string or Input should be a valid list"),
    ("/completions", {"prompt": "x", "echo": True}, "echo", "not supported"),
    ("/chat/completions", {"messages": []}, "messages", "at least 1 item"),
    ("/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages.0.content", "text parts only"),
    ("/chat/completions", {"messages": MESSAGES, "tools": [{"type": "function"}]}, "tools", "not supported"),
    ("/chat/completions", {"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs", "needs logprobs=true"),
    ("/chat/completions", {"messages": MESSAGES, "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
]


@pytest.mark.parametrize(("route", "body", "param", "says"), BAD_REQUESTS, ids=[f"{r}:{p}:{s[:12]}" for r, _, p, s
                                                                                in BAD_REQUESTS])
def test_a_malformed_request_is_400_naming_the_field_and_the_next_request_succeeds(server, route, body, param, says):
    with _http(server) as http:
        refused = http.post(route, json={"model": "tiny", **body})
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error" and says in error["message"]
        ok = http.post("/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["choices"][0]["token_ids"]


def test_unknown_models_routes_and_bodies_get_openais_errors(server, oai):
    with pytest.raises(openai.NotFoundError) as unknown:
        oai.completions.create(model="gpt-4o", prompt="x")
    assert unknown.value.body["code"] == "model_not_found" and "GET /v1/models" in unknown.value.body["message"]
    with pytest.raises(openai.NotFoundError) as training_state:
        oai.completions.create(model="rlvr://run-x/weights/s1", prompt="x")
    assert "not a sampler checkpoint" in training_state.value.body["message"]
    with pytest.raises(openai.NotFoundError) as route:
        oai.embeddings.create(model="tiny", input="x")
    assert "POST /v1/chat/completions" in route.value.body["message"]
    with _http(server) as http:
        not_json = http.post("/completions", content=b"{nope", headers={"Content-Type": "application/json"})
    assert not_json.status_code == 400 and "not JSON" in not_json.json()["error"]["message"]


# -- in process -------------------------------------------------------------------------------------------------------

def test_in_process_client_samples_as_the_server_does(oai, service):
    async def run() -> tuple:
        client = openai_client(service)
        completion = await client.completions.create(model="tiny", prompt="Hi", max_tokens=5, n=2, seed=9)
        chat = await client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, seed=9,
                                                    stream=True)
        return completion, [chunk async for chunk in chat], await client.models.list()

    completion, chunks, models = asyncio.run(run())
    served = oai.completions.create(model="tiny", prompt="Hi", max_tokens=5, n=2, seed=9)
    assert [c.token_ids for c in completion.choices] == [c.token_ids for c in served.choices]
    chat = oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, seed=9)
    assert chunks[0].choices[0].token_ids == chat.choices[0].token_ids
    assert {"tiny", "smollm2-135m"} <= {m.id for m in models.data}


def test_in_process_client_of_a_sampling_client_serves_its_unsaved_weights(service):
    tc = service.create_lora_training_client("tiny", rank=4, seed=1)  # a run that never writes to disk
    tc.forward_backward([DATUM], "cross_entropy")
    tc.optim_step(types.AdamParams(learning_rate=5e-2))
    sampler = tc.save_weights_and_get_sampling_client()  # in memory only

    async def run() -> tuple:
        client = openai_client(sampler)
        listed = [m.id for m in (await client.models.list()).data]
        out = await client.completions.create(model=sampler.model_path, prompt=PROMPT, max_tokens=6, seed=5,
                                              logprobs=0)
        return listed, out.choices[0]

    listed, choice = asyncio.run(run())
    assert listed[0] == sampler.model_path
    expected = sampler.compute_logprobs(types.ModelInput.from_ints(PROMPT + choice.token_ids)).result()[len(PROMPT):]
    np.testing.assert_allclose(choice.logprobs.token_logprobs, expected, atol=1e-4)
    base = _engine_logprobs(service, PROMPT, choice.token_ids)
    assert not np.allclose(choice.logprobs.token_logprobs, base, atol=1e-3)


@pytest.mark.slow
def test_chat_on_smollm2_renders_its_own_template(service):
    tokenizer = service.create_sampling_client(base_model="smollm2-135m").get_tokenizer()

    async def run():
        client = openai_client(service)
        return await client.chat.completions.create(model="smollm2-135m", messages=MESSAGES, max_tokens=12,
                                                    temperature=0, logprobs=True)

    out = asyncio.run(run())
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert out.prompt_token_ids == tokenizer.encode(text, add_special_tokens=False)
    assert "<|im_start|>assistant" in text
    choice = out.choices[0]
    assert choice.message.content == tokenizer.decode(choice.token_ids, skip_special_tokens=True)
    assert "4" in choice.message.content
