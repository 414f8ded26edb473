"""Streaming for the OpenAI routes: each choice's text, tokens and logprobs handed out as the engine samples them.

    calls = Calls()                                                    # on the route's event loop
    calls.start(sample(prompt, watch=calls.watch()))                   # one per sampling call
    await calls.started()                                              # a refused request raises here: a plain 400
    async for piece in pieces(calls, [[ChoiceText(tokenizer, stops) for _ in range(n)] for _ in prompts]):
        ...                                                            # one chunk per piece

The engine's thread hands each decode step's tokens to a call's ``Watch`` (``rlvr.engine.sample.watch``), which puts
them on the event loop: the route's generator awaits them without blocking the loop, and the batch goes on decoding.

Contract: each choice's ``ChoiceText`` hands out only text that can no longer change. A character split across tokens
waits until it is whole (trailing U+FFFD are held back); text that may start a stop string waits until decided, and
nothing from a stop string on is sent; the rest comes at the end from the finished sample's text, decoded whole, so a
choice's chunks concatenate to the non-streamed text (broken UTF-8 included). That holds for tokenizers whose text
of a token prefix is a prefix of the whole text (byte-level, SentencePiece); one that cleans up spaces is sent whole
at the end (``incremental=False``), as are tool calls and top logprobs. Leaving ``pieces`` early (the client went
away) cancels every call: a watched call's rows leave the engine's batch at its next step.

Not here: the chunks' shape and the routes (``openai.py``), the engine's side (``rlvr.engine.sample.watch``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi.responses import StreamingResponse
from tinker import types

from rlvr.engine.sample.watch import Drawn, Watch

__all__ = ["Calls", "ChoiceText", "Piece", "choice_text", "event_stream", "pieces"]

log = logging.getLogger("rlvr.server")

REPLACEMENT = "\ufffd"
"""What decoding writes for bytes that are not (yet) a whole UTF-8 character."""


def choice_text(tokenizer: Any, tokens: list[int], stops: Iterable[str]) -> str:
    """The text of ``tokens`` without special tokens, cut before the first stop string (OpenAI leaves it out)."""
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return text[:min(cuts)] if cuts else text


def undecided(text: str, stops: Sequence[str]) -> int:
    """Where ``text``'s possible stop strings begin: the first complete one's start, or the start of its longest
    ending that is a stop string's beginning; ``len(text)`` if none. Text before it is the final text's, whatever
    follows; text from it on may be cut."""
    limit = len(text)
    for stop in stops:
        found = text.find(stop)
        if found >= 0:
            limit = min(limit, found)
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                limit = min(limit, len(text) - k)
                break
    return limit


class ChoiceText:
    """One choice's text as its tokens come: ``add`` returns the text that became certain, ``finish`` the rest."""

    def __init__(self, tokenizer: Any, stops: Sequence[str], incremental: bool = True) -> None:
        self.tokenizer, self.stops, self.incremental = tokenizer, tuple(stops), incremental
        self.tokens: list[int] = []
        """Every token received so far."""
        self.sent = ""
        """The text handed out so far: a prefix of the final text."""

    def add(self, tokens: list[int]) -> str:
        """Take the next ``tokens``; the text that follows ``sent`` and can no longer change (maybe empty)."""
        self.tokens += tokens
        if not self.incremental:
            return ""
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True).rstrip(REPLACEMENT)
        text = text[:undecided(text, self.stops)]
        if not text.startswith(self.sent):  # a decoder that rewrites earlier text: the rest waits for the end
            log.warning("rlvr: the tokenizer's text of a token prefix is not a prefix of the longer text; this "
                        "choice's text is sent at the end")
            self.incremental = False
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta

    def finish(self, tokens: list[int]) -> str:
        """Take the finished sample's ``tokens`` (those received, then any not yet); the rest of its final text."""
        assert tokens[:len(self.tokens)] == self.tokens, "a watch handed out tokens the sample does not have"
        self.tokens = list(tokens)
        final = choice_text(self.tokenizer, self.tokens, self.stops)
        if not final.startswith(self.sent):  # ``add`` sends only text that is the final text's prefix
            log.error("rlvr: a streamed choice sent %r, which the final text %r does not start with", self.sent, final)
            return ""
        rest, self.sent = final[len(self.sent):], final
        return rest


class Calls:
    """A request's sampling calls, run as tasks on the event loop; their watches' tokens and their results are met,
    in the order they happen, through ``events``. Made on the loop that reads it."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[int, Drawn | asyncio.Task]] = asyncio.Queue()
        self._ahead: list[tuple[int, Drawn | asyncio.Task]] = []  # met by ``started``, not yet by ``events``
        self._watches: list[Watch] = []
        self._tasks: list[asyncio.Task] = []

    def watch(self) -> Watch:
        """The watch of the next call ``start``ed (ask before starting it)."""
        watch = Watch(functools.partial(self._drawn, len(self._watches)))
        self._watches.append(watch)
        return watch

    def _drawn(self, call: int, drawn: Drawn) -> None:  # on the engine's thread
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (call, drawn))  # a closed loop raises: cancelled

    def start(self, sampling: Awaitable[types.SampleResponse]) -> None:
        """Run the next call: ``sampling`` resolves to its response (calls are numbered in the order started)."""
        call = len(self._tasks)
        task = asyncio.ensure_future(sampling)
        task.add_done_callback(lambda done: self._queue.put_nowait((call, done)))
        self._tasks.append(task)

    async def started(self) -> None:
        """Wait until every call has drawn tokens or finished; raise the error of one that failed (a refused
        request then fails before its stream begins). On error every call is cancelled."""
        waiting = set(range(len(self._tasks)))
        try:
            while waiting:
                call, item = await self._queue.get()
                self._ahead.append((call, item))
                waiting.discard(call)
                if isinstance(item, asyncio.Task) and not item.cancelled() and item.exception() is not None:
                    raise item.exception()
        except BaseException:
            self.cancel()
            raise

    async def events(self) -> AsyncIterator[tuple[int, Drawn | types.SampleResponse]]:
        """``(call, tokens drawn)`` as they come and ``(call, response)`` once each call is done, until all are; a
        call's error is raised here. Leaving early cancels every call."""
        done: set[int] = set()
        try:
            while len(done) < len(self._tasks):
                call, item = self._ahead.pop(0) if self._ahead else await self._queue.get()
                if call in done:  # tokens put on the loop after the result: the result has them all
                    continue
                if isinstance(item, asyncio.Task):
                    done.add(call)
                    yield call, item.result()
                else:
                    yield call, item
        finally:
            self.cancel()

    def cancel(self) -> None:
        """Stop every call: watched ones leave the engine's batch at its next step; all are done with."""
        for watch in self._watches:
            watch.cancel()
        for task in self._tasks:
            task.cancel()


@dataclass
class Piece:
    """What one chunk of one choice carries."""

    call: int
    """The sampling call (the prompt, in completions)."""
    sample: int
    """The choice's index in its call."""
    text: str
    """Text that follows the choice's text so far (maybe empty)."""
    tokens: list[int]
    """Tokens drawn since the choice's last piece."""
    logprobs: list[float]
    """Their logprobs."""
    first: bool
    """Whether this is the choice's first piece."""
    done: types.SampledSequence | None = None
    """The finished sample, on the choice's last piece (then ``text`` and ``tokens`` are its rest); else None."""
    top: list | None = None
    """The top-k rows of ``tokens`` (on the last piece, when the sample has them)."""


async def pieces(calls: Calls, texts: list[list[ChoiceText]]) -> AsyncIterator[Piece]:
    """The pieces of every choice of ``calls`` (``texts[call][sample]`` decodes each), in the order the engine draws
    them; each choice ends with a piece that holds its finished sample."""
    async for call, item in calls.events():
        if isinstance(item, types.SampleResponse):
            for j, seq in enumerate(item.sequences):
                text = texts[call][j]
                start = len(text.tokens)
                rest = text.finish(seq.tokens)
                top = seq.topk_logprobs[start:] if seq.topk_logprobs else None
                yield Piece(call, j, rest, seq.tokens[start:], list(seq.logprobs or [])[start:], start == 0, seq, top)
            continue
        by_sample: dict[int, tuple[list[int], list[float]]] = {}
        for j, token, logprob in item:
            by_sample.setdefault(j, ([], []))
            by_sample[j][0].append(token)
            by_sample[j][1].append(logprob)
        for j, (tokens, logprobs) in sorted(by_sample.items()):
            first = not texts[call][j].tokens
            yield Piece(call, j, texts[call][j].add(tokens), tokens, logprobs, first)


def event_stream(chunks: AsyncIterator[dict[str, Any]], error: Any) -> StreamingResponse:
    """``chunks`` as server-sent events ending in ``data: [DONE]``; an error raised midway is sent as OpenAI's
    error event (``error(exc)`` shapes it) before the end."""
    async def events() -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield f"data: {json.dumps(chunk)}\n\n"
        except Exception as exc:  # the stream has begun: the error goes in it
            log.warning("rlvr: a streamed sampling request failed midway: %s", exc)
            yield f"data: {json.dumps(error(exc))}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
