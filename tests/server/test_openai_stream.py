"""Streaming on the OpenAI routes (``rlvr.server.openai_stream``), through the official ``openai`` client against a
live ``rlvr serve``: chunks leave while the engine still samples (the sampler is held after its first step until the
test has the first chunk: no timing), they concatenate to the non-streamed choice of the same seed (text, token ids,
logprobs, usage), a character split across tiny's byte tokens arrives whole, a stop string spanning chunks is never
sent, and a client that goes away cancels its request in the engine. ``ChoiceText`` is checked on its own against
the whole-text decode for arbitrary tokens, broken UTF-8 and special tokens included."""

from __future__ import annotations

import random
import threading

import httpx
import pytest

from rlvr.engine.models.tiny import build_tiny_tokenizer
from rlvr.engine.sample.watch import Watch
from rlvr.server.openai_stream import ChoiceText, choice_text, undecided

openai = pytest.importorskip("openai")

MESSAGES = [{"role": "user", "content": "What is 2+2?"}]
HOLD_S = 30  # how long a held sampler waits for the test before it goes on (only a failing test waits that long)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.api_key, max_retries=0)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def _choice_chunks(chunks, index: int) -> list:
    return [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]


# -- ChoiceText, on its own -------------------------------------------------------------------------------------------

def test_a_character_split_across_tokens_is_held_until_whole(tokenizer):
    text = ChoiceText(tokenizer, ())
    euro = tokenizer.encode("€", add_special_tokens=False)
    assert len(euro) == 3  # tiny's tokens are bytes: the character spans three
    assert [text.add([t]) for t in tokenizer.encode("a", add_special_tokens=False) + euro] == ["a", "", "", "€"]
    broken = ChoiceText(tokenizer, ())
    assert broken.add(euro[:2]) == "" and broken.finish(euro[:2]) == tokenizer.decode(euro[:2])  # U+FFFD, as whole


def test_a_possible_stop_string_is_held_until_decided(tokenizer):
    def each(stops: list[str], written: str) -> list[str]:
        text = ChoiceText(tokenizer, stops)
        tokens = tokenizer.encode(written, add_special_tokens=False)
        return [text.add([t]) for t in tokens] + [text.finish(tokens)]

    assert each(["abc"], "xabz") == ["x", "", "", "abz", ""]  # "ab" might have begun "abc": held, then sent
    assert each(["abc"], "xabcd") == ["x", "", "", "", "", ""]  # the stop and all after it: never sent
    assert each(["bcd", "ab"], "abcd") == ["", "", "", "", ""]  # "ab" cuts first, though "bcd" is found first
    assert undecided("hello wor", ["world"]) == 6 and undecided("a\nb", ["\n"]) == 1 and undecided("ab", []) == 2


def test_text_sent_is_always_a_prefix_of_the_final_text_whatever_the_tokens(tokenizer):
    rng = random.Random(0)
    words = ["é", "€", "😀", "ab", " ", "\n", "<|im_end|>", "\x00", "stop", "st"]
    for _ in range(400):
        tokens = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 30))]  # any bytes, specials too
        if rng.random() < 0.5:
            tokens = tokenizer.encode("".join(rng.choice(words) for _ in range(8)), add_special_tokens=False)
            tokens = tokens[rng.randrange(len(tokens)):]  # often starting mid-character
        stops = rng.sample(["stop", "€", "b ", "\n", "😀s", "x"], rng.randrange(3))
        final = choice_text(tokenizer, tokens, stops)
        text, sent, i = ChoiceText(tokenizer, stops), "", 0
        while i < len(tokens):
            step = rng.randrange(1, 4)
            sent += text.add(tokens[i:i + step])
            i += step
            assert final.startswith(sent), (tokens, stops, sent, final)
        assert sent + text.finish(tokens) == final


# -- through the server -----------------------------------------------------------------------------------------------

def test_the_first_chunk_arrives_before_the_last_token_is_drawn(oai, monkeypatch):
    from rlvr.engine.sample import sampler

    steps, draws, received = [], [], threading.Event()
    real, real_choose = Watch.step, sampler._choose
    monkeypatch.setattr(sampler, "_choose", lambda *args: draws.append(1) or real_choose(*args))  # one per step

    def held(self, drawn):  # on the engine thread: after its first step the sampler waits for the test
        real(self, drawn)
        steps.append(drawn)
        if len(steps) == 1:
            received.wait(HOLD_S)

    monkeypatch.setattr(Watch, "step", held)
    stream = oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, seed=3, stream=True)
    chunks = iter(stream)
    first = next(chunks)
    drawn_when_first_arrived = len(draws)
    received.set()
    rest = list(chunks)
    assert drawn_when_first_arrived == 1 and len(first.choices[0].token_ids) == 1
    assert first.choices[0].delta.role == "assistant" and first.prompt_token_ids
    assert len(steps) > 1 and rest[-1].choices[0].finish_reason is not None


def test_chunks_concatenate_to_the_non_streamed_choices_of_the_same_seed(oai):
    ask = {"model": "tiny", "prompt": ["Hi", "Yo"], "max_tokens": 12, "n": 2, "seed": 4, "logprobs": 0}
    plain = oai.completions.create(**ask)
    chunks = list(oai.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    for choice in plain.choices:
        mine = _choice_chunks(chunks, choice.index)
        assert "".join(m.text for m in mine) == choice.text
        assert [t for m in mine for t in m.token_ids] == choice.token_ids
        assert [lp for m in mine for lp in m.logprobs.token_logprobs] == choice.logprobs.token_logprobs
        assert [o for m in mine for o in m.logprobs.text_offset] == choice.logprobs.text_offset
        assert [len(m.token_ids) for m in mine[:-1]] == [1] * (len(mine) - 1)  # a chunk per token drawn
        assert [m.finish_reason for m in mine] == [None] * (len(mine) - 1) + [choice.finish_reason]
        assert mine[0].prompt_token_ids == choice.prompt_token_ids
    assert chunks[-1].usage == plain.usage and not chunks[-1].choices

    chat = oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, n=2, seed=5, logprobs=True)
    streamed = list(oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, n=2, seed=5,
                                                logprobs=True, stream=True, stream_options={"include_usage": True}))
    for choice in chat.choices:
        mine = _choice_chunks(streamed, choice.index)
        assert "".join(m.delta.content for m in mine) == choice.message.content
        assert [t for m in mine for t in m.token_ids] == choice.token_ids
        assert [e.logprob for m in mine for e in m.logprobs.content] == [e.logprob for e in choice.logprobs.content]
        assert mine[-1].finish_reason == choice.finish_reason
    assert streamed[0].prompt_token_ids == chat.prompt_token_ids and streamed[-1].usage == chat.usage


def test_a_character_split_across_byte_tokens_arrives_whole(oai, tokenizer):
    def multibyte(text: str) -> list[str]:
        return [c for c in text if len(c.encode()) > 1 and c != "\ufffd"]

    for seed in range(300):  # tiny writes noise bytes: find a sample holding a whole multi-byte character
        plain = oai.completions.create(model="tiny", prompt="Hi", max_tokens=12, seed=seed).choices[0]
        if multibyte(plain.text):
            break
    assert multibyte(plain.text), "no seed under 300 samples a multi-byte character"
    mine = _choice_chunks(list(oai.completions.create(model="tiny", prompt="Hi", max_tokens=12, seed=seed,
                                                      stream=True)), 0)
    assert "".join(m.text for m in mine) == plain.text
    char = multibyte(plain.text)[0]
    [whole] = [m for m in mine if char in m.text]
    held = mine[mine.index(whole) - 1]
    assert held.token_ids and held.text == ""  # its first byte came alone, with no text


def test_a_stop_string_spanning_chunks_is_never_sent(oai):
    def windows(text: str) -> list[str]:  # three ASCII characters after the first: three tokens, three chunks
        return [text[i:i + 3] for i in range(1, len(text) - 2) if text[i:i + 3].isascii()]

    for seed in range(100):
        full = oai.completions.create(model="tiny", prompt="Hi", max_tokens=16, seed=seed).choices[0]
        if windows(full.text):
            break
    stop = windows(full.text)[0]
    cut = oai.completions.create(model="tiny", prompt="Hi", max_tokens=16, seed=seed, stop=[stop]).choices[0]
    mine = _choice_chunks(list(oai.completions.create(model="tiny", prompt="Hi", max_tokens=16, seed=seed,
                                                      stop=[stop], stream=True)), 0)
    assert cut.finish_reason == "stop" and "".join(m.text for m in mine) == cut.text
    assert [t for m in mine for t in m.token_ids] == cut.token_ids  # the stop string's tokens all come, as ids


def test_top_logprobs_come_with_each_choice_whole_at_its_end(oai):
    ask = {"model": "tiny", "messages": MESSAGES, "max_tokens": 6, "seed": 2, "logprobs": True, "top_logprobs": 2}
    chat = oai.chat.completions.create(**ask)
    [chunk] = list(oai.chat.completions.create(**ask, stream=True))
    assert chunk.choices[0].delta.content == chat.choices[0].message.content
    assert [len(e.top_logprobs) for e in chunk.choices[0].logprobs.content] == [2] * len(chat.choices[0].token_ids)


def test_a_client_that_goes_away_cancels_its_request_and_the_next_is_served(oai, server, monkeypatch):
    plain = oai.completions.create(model="tiny", prompt="Hi", max_tokens=60, seed=8).choices[0]
    assert len(plain.token_ids) > 20  # the request would run long: only the cancel can end it after a step
    steps, cancelled, received = [], threading.Event(), threading.Event()
    real_step, real_cancel = Watch.step, Watch.cancel

    def held(self, drawn):
        steps.append(drawn)
        real_step(self, drawn)
        if len(steps) == 1:
            received.wait(HOLD_S)

    def cancel(self):
        real_cancel(self)
        cancelled.set()

    monkeypatch.setattr(Watch, "step", held)
    monkeypatch.setattr(Watch, "cancel", cancel)
    with httpx.Client(base_url=f"{server.base_url}/v1", headers={"Authorization": f"Bearer {server.api_key}"},
                      timeout=60) as http, \
            http.stream("POST", "/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 60, "seed": 8,
                                                      "stream": True}) as response:
        assert next(response.iter_lines()).startswith("data: {")
    # The connection is closed; the sampler is still held after its first step.
    assert cancelled.wait(HOLD_S), "the server did not cancel the request of a client that went away"
    received.set()
    after = oai.completions.create(model="tiny", prompt="Hi", max_tokens=5, seed=8).choices[0]
    assert after.token_ids == plain.token_ids[:5]
    assert len(steps) == 1  # the cancelled row left the batch after the step it was held in


def test_a_failure_after_the_stream_began_is_its_last_event(oai, monkeypatch):
    from rlvr.server import openai as endpoint

    async def breaks_midway(client, prompt, req, max_tokens, top, field, watch=None):
        watch.step([(0, 65, -1.0)])  # one token out, so the stream begins
        raise RuntimeError("the engine broke midway")

    monkeypatch.setattr(endpoint, "_sample", breaks_midway)
    stream = oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, stream=True)
    with pytest.raises(openai.APIError, match="the engine broke midway"):
        list(stream)
