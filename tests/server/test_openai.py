"""OpenAI-compatible sampling (``rlvr.server.openai``) through the official ``openai`` client: against a live
``rlvr serve`` (``openai.OpenAI``) and in process (``openai_client``: ``openai.AsyncOpenAI`` over ASGI, no socket).
Every sampled number is checked against the engine's own: token ids, seeds, logprobs, checkpoint weights. Tool calls
are parsed from replies scripted through ``tests/scripted.py`` (tiny writes noise), and text that is not a well-formed
call, whatever it holds, stays content."""

from __future__ import annotations

import asyncio
import json
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


def test_echo_scores_the_prompt_as_the_engines_forward_and_ranks_the_alternatives(oai, service, tokenizer):
    sampler = service.create_sampling_client(base_model="tiny")
    prompts = [PROMPT, [*PROMPT, *TARGET]]
    out = oai.completions.create(model="tiny", prompt=prompts, max_tokens=0, echo=True, logprobs=3, n=2,
                                 extra_body={"return_tokens_as_token_ids": True})
    assert [c.index for c in out.choices] == [0, 1, 2, 3] and out.usage.completion_tokens == 0
    for choice, prompt in zip(out.choices, [p for p in prompts for _ in range(2)], strict=True):
        assert choice.token_ids == [] and choice.prompt_token_ids == prompt and choice.finish_reason == "length"
        assert choice.text == tokenizer.decode(prompt)
        engine = sampler.compute_topk_logprobs(types.ModelInput.from_ints(prompt), 3).result()
        assert choice.logprobs.tokens == [f"token_id:{t}" for t in prompt]
        assert choice.logprobs.token_logprobs == sampler.compute_logprobs(types.ModelInput.from_ints(prompt)).result()
        assert choice.logprobs.top_logprobs[0] is None
        assert choice.logprobs.top_logprobs[1:] == [{f"token_id:{t}": lp for t, lp in row} for row in engine.topk[1:]]
        assert choice.logprobs.text_offset == [sum(len(f"token_id:{t}") for t in prompt[:i])
                                               for i in range(len(prompt))]


def test_echo_then_sample_puts_the_prompt_before_the_completion(oai, service, tokenizer):
    text = "Q: 2+2? A:"
    plain = oai.completions.create(model="tiny", prompt=text, max_tokens=5, seed=4, logprobs=2).choices[0]
    echo = oai.completions.create(model="tiny", prompt=text, max_tokens=5, seed=4, logprobs=2, echo=True).choices[0]
    prompt = tokenizer.encode(text)
    assert echo.token_ids == plain.token_ids and echo.text == text + plain.text
    n = len(prompt)
    assert echo.logprobs.tokens == [tokenizer.decode([t]) for t in prompt] + plain.logprobs.tokens
    assert echo.logprobs.token_logprobs[n:] == plain.logprobs.token_logprobs
    assert echo.logprobs.top_logprobs[n:] == plain.logprobs.top_logprobs
    assert echo.logprobs.token_logprobs[:n] == _engine_logprobs(service, [], prompt)
    assert echo.logprobs.text_offset == list(range(len(echo.logprobs.tokens)))  # one byte a token, all printable
    bare = oai.completions.create(model="tiny", prompt=text, max_tokens=5, seed=4, echo=True).choices[0]
    assert bare.text == echo.text and bare.logprobs is None


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
    assert raw.text.endswith("data: [DONE]\n\n")


# -- tools ------------------------------------------------------------------------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
         {"type": "function", "function": {"name": "neg", "parameters": {"type": "object", "properties": {
             "x": {"type": "integer"}}}}}]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
ASK = [{"role": "user", "content": "What is 2+3?"}]


@pytest.mark.parametrize(("text", "content", "calls"), [
    (CALL, None, [("add", {"a": 2, "b": 3})]),
    (f"Adding.\n{CALL}\nThen negating.<tool_call>{{\"name\": \"neg\", \"arguments\": {{\"x\": 5}}}}</tool_call>",
     "Adding.\n\nThen negating.", [("add", {"a": 2, "b": 3}), ("neg", {"x": 5})]),
    ('<tool_call>{"name": "neg", "arguments": "{\\"x\\": -1}"}</tool_call>', None, [("neg", {"x": -1})]),
    ('<tool_call>{"name": "neg"}</tool_call> done', "done", [("neg", {})]),
    ('<tool_call>{"name": "add", "arguments": {"a": "\u00e9\u4e00"}}</tool_call>', None, [("add", {"a": "é一"})]),
], ids=["one", "two-with-text", "arguments-as-json-text", "no-arguments", "unicode"])
def test_tool_calls_are_parsed_out_of_the_text(text, content, calls):
    from rlvr.server.openai_tools import parse_tool_calls

    got_content, got = parse_tool_calls(text, {"add", "neg"}, key=[[1, 2], [3]])
    assert got_content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in got)
    assert len({c["id"] for c in got}) == len(got)
    assert [c["id"] for c in parse_tool_calls(text, {"add", "neg"}, key=[[1, 2], [3]])[1]] == [c["id"] for c in got]
    assert [c["id"] for c in parse_tool_calls(text, {"add", "neg"}, key=[[1, 2], [4]])[1]] != [c["id"] for c in got]


MALFORMED = {
    "bad-json": '<tool_call>{"name": "add", "arguments": {"a": 2,}}</tool_call>',
    "unknown-function": '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
    "arguments-a-list": '<tool_call>{"name": "add", "arguments": [2, 3]}</tool_call>',
    "arguments-bad-json-text": '<tool_call>{"name": "add", "arguments": "{a: 2"}</tool_call>',
    "name-not-text": '<tool_call>{"name": ["add"], "arguments": {}}</tool_call>',
    "not-an-object": '<tool_call>"add"</tool_call>',
    "empty": "<tool_call></tool_call>",
    "left-open": 'Sure. <tool_call>{"name": "add", "arguments": {"a": 2, "b"',
    "close-only": '</tool_call>{"name": "add"}',
    "nested-tags": f"<tool_call>{CALL}</tool_call>",
    "deep-nesting": '<tool_call>{"name": "add", "arguments": ' + "[" * 100_000 + "</tool_call>",
    "deep-nesting-closed": '<tool_call>{"name": "add", "arguments": {"a": ' + "[" * 5000 + "]" * 5000
                           + "}}</tool_call>",
    "lone-surrogate": '<tool_call>{"name": "add", "arguments": {"a": "\\ud800"}}</tool_call>',
    "infinity": '<tool_call>{"name": "add", "arguments": {"a": Infinity}}</tool_call>',
    "overflowing-float": '<tool_call>{"name": "add", "arguments": {"a": 1e999}}</tool_call>',
    "too-many-digits": '<tool_call>{"name": "add", "arguments": {"a": ' + "9" * 5000 + "}}</tool_call>",
    "broken-utf8": "<tool_call>" + b'{"name": "add\xff", "arguments": {}}'.decode("utf-8", "replace") + "</tool_call>",
    "control-characters": '<tool_call>{"name": "add\x00", "arguments": {}}</tool_call>\x1b[2J',
}


@pytest.mark.parametrize("text", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_tool_call_text_stays_content(text):
    from rlvr.server.openai_tools import parse_tool_calls

    assert parse_tool_calls(text, {"add", "neg"}) == (text, [])


def test_any_text_a_model_writes_parses_without_raising():
    """Random mixes of the pieces a tool call is made of: the parser returns, and a call it finds is valid JSON."""
    import random

    from rlvr.server.openai_tools import parse_tool_calls

    pieces = ["<tool_call>", "</tool_call>", "<tool_", "call>", '{"name": "add"', '"arguments": ', "{", "}", "[",
              "]", '"', "\\", ",", ":", "1e999", "NaN", "\\ud800", "\ufffd", "\x00", " ", "\n", "add", "é"]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(40)))
        content, calls = parse_tool_calls(text, {"add"}, key=text)
        for call in calls:
            assert isinstance(json.loads(call["function"]["arguments"]), dict)
        assert calls or content == text


def test_chat_with_tools_returns_the_tool_calls_and_the_exact_sampled_tokens(oai, service, tokenizer, monkeypatch):
    from scripted import script_chat

    replies = {"call": f"Let me add.\n{CALL}", "noise": '<tool_call>{"name": "add", "argu'}
    reply = ["call"]
    prompts = script_chat(monkeypatch, lambda prompt: replies[reply[0]])
    out = oai.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, logprobs=True, seed=0)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me add."
    [call] = choice.message.tool_calls
    assert (call.type, call.function.name, json.loads(call.function.arguments)) == ("function", "add", {"a": 2, "b": 3})
    # The trainer still gets every sampled token, the call's included, with the engine's logprobs.
    assert choice.token_ids == tokenizer.encode(replies["call"], add_special_tokens=False) + [tokenizer.eos_token_id]
    np.testing.assert_allclose([e.logprob for e in choice.logprobs.content],
                               _engine_logprobs(service, out.prompt_token_ids, choice.token_ids), atol=1e-4)
    # tiny's template has no tool support: the fallback lists the functions in a system turn.
    assert prompts[-1].startswith("<|im_start|>system\n# Tools") and '"name": "add"' in prompts[-1]
    assert tokenizer.decode(out.prompt_token_ids) == prompts[-1]

    # The call and its result go back as the next request's conversation.
    follow = [*ASK, choice.message.model_dump(exclude_none=True),
              {"role": "tool", "tool_call_id": call.id, "content": "5"}]
    again = oai.chat.completions.create(model="tiny", messages=follow, tools=TOOLS)
    assert again.choices[0].message.tool_calls[0].id != call.id  # ids differ turn to turn
    assert prompts[-1].endswith(f"<|im_start|>assistant\n{replies['call']}<|im_end|>\n<|im_start|>user\n"
                                "<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n")

    streamed = list(oai.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, stream=True, seed=0))
    assert streamed[-1].choices[0].finish_reason == "tool_calls"
    [delta] = streamed[-1].choices[0].delta.tool_calls
    assert (delta.index, delta.id, delta.function.name) == (0, call.id, "add")

    plain = oai.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="none")
    assert plain.choices[0].message.content == replies["call"] and not plain.choices[0].message.tool_calls
    reply[0] = "noise"
    broken = oai.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS).choices[0]
    assert broken.message.content == replies["noise"] and broken.finish_reason == "stop"
    assert not broken.message.tool_calls


def test_a_bad_tool_choice_is_400_and_the_next_tool_request_is_served(oai, monkeypatch):
    from scripted import script_chat

    script_chat(monkeypatch, lambda prompt: CALL)
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required")
    assert refused.value.body["param"] == "tool_choice" and '"none"' in refused.value.body["message"]
    out = oai.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="auto")
    assert out.choices[0].message.tool_calls[0].function.name == "add"


TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTOOLS {{ tools | map(attribute='function.name') | join(',') }}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} {{ c.function.arguments.a }}{% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
"""A template with tool support of its own: it reads each call's arguments as an object, as transformers' do."""


def test_a_template_with_tool_support_renders_the_tools_itself():
    from rlvr.engine.models.tiny import build_tiny_tokenizer
    from rlvr.server.openai_wire import ChatRequest, chat_prompt

    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = TOOL_TEMPLATE
    req = ChatRequest.model_validate({"model": "tiny", "tools": TOOLS, "messages": [
        *ASK, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"}]})
    text = tokenizer.decode(chat_prompt(req.messages, tokenizer, "tiny", req.tools))
    assert text == ("<|im_start|>system\nTOOLS add,neg<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
                    "<|im_start|>assistant\nCALL add 2<|im_end|>\n<|im_start|>tool\n5<|im_end|>\n"
                    "<|im_start|>assistant\n")


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
    ("/completions", {"prompt": [300000]}, "prompt", "outside the vocabulary"),
    ("/completions", {"prompt": [5] * 9000}, "prompt", "fills the model's context"),
    ("/completions", {"prompt": ["x", [1]]}, "prompt", "a list of token ids"),
    ("/completions", {"prompt": []}, "prompt", "none empty"),
    ("/completions", {"prompt": "x", "stop": 5}, "stop", "valid string or Input should be a valid list"),
    ("/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens", "only echo=true"),
    ("/completions", {"prompt": "x", "max_tokens": -1}, "max_tokens", "greater than or equal to 0"),
    ("/completions", {"prompt": [5] * 9000, "echo": True, "logprobs": 1, "max_tokens": 0}, "prompt",
     "more than the model's context"),
    ("/completions", {"prompt": "x\ud800"}, "prompt", "surrogate"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "\udfff"}]}, "messages", "surrogate"),
    ("/chat/completions", {"messages": []}, "messages", "at least 1 item"),
    ("/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages.0.content", "text parts only"),
    ("/chat/completions", {"messages": MESSAGES, "tools": [{"type": "function"}]}, "tools.0.function",
     "tools.0.function is required"),
    ("/chat/completions", {"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "a b"}}]},
     "tools.0.function.name", "letters, digits, underscores or dashes"),
    ("/chat/completions", {"messages": MESSAGES, "tool_choice": "required"}, "tool_choice", 'supports "auto"'),
    ("/chat/completions", {"messages": MESSAGES, "tool_choice": {"type": "function", "function": {"name": "add"}}},
     "tool_choice", "constrained decoding"),
    ("/chat/completions", {"messages": MESSAGES, "parallel_tool_calls": False}, "parallel_tool_calls",
     "every tool call"),
    ("/chat/completions", {"messages": MESSAGES, "functions": [{"name": "add"}]}, "functions", "offer them as tools"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "x", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "add", "arguments": "{}"}}]}]},
     "messages.0.tool_calls", "only assistant messages"),
    ("/chat/completions", {"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs", "needs logprobs=true"),
    ("/chat/completions", {"messages": MESSAGES, "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
]


@pytest.mark.parametrize(("route", "body", "param", "says"), BAD_REQUESTS, ids=[f"{r}:{p}:{s[:12]}" for r, _, p, s
                                                                                in BAD_REQUESTS])
def test_a_malformed_request_is_400_naming_the_field_and_the_next_request_succeeds(server, route, body, param, says):
    with _http(server) as http:
        # json.dumps writes a lone surrogate as the escape \ud800, where httpx's json= cannot encode it at all
        refused = http.post(route, content=json.dumps({"model": "tiny", **body}),
                            headers={"Content-Type": "application/json"})
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error" and says in error["message"]
        assert (error["code"] == "context_length_exceeded") == ("context" in says)  # how clients tell an overflow
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
    assert [t for chunk in chunks for t in chunk.choices[0].token_ids] == chat.choices[0].token_ids
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
