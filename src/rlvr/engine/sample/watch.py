"""A sampling request watched while it decodes: its tokens handed out as they are drawn, and a way to stop it.

    watch = Watch(lambda drawn: print(drawn))          # [(sample index, token id, logprob), ...] per step
    future = sampling_client.sample(prompt, 2, params, watch=watch)
    watch.cancel()                                     # from any thread: the request's rows stop decoding

The engine's thread calls ``step`` with the tokens the request's rows drew since the last call: after every decode
step on the CPU sampler (``sampler.py``), at every look from the host on the GPU paths' (``gpu/device_sampler.py``),
while the batch goes on decoding. ``cancel`` ends the request's rows at the sampler's next step (they leave the
batch, so the compute goes to the requests beside them); a request cancelled before its decode began does not
decode at all, and its future is cancelled. A cancelled request that was decoding settles with the tokens drawn so
far, its stop reason ``"length"``.

Invariants: watching changes nothing that is sampled (a watched request is batched as any other, and draws the same
tokens and logprobs); each sample's tokens handed out, in order, are a prefix of the tokens its response returns,
all of them unless it was cancelled. A callback that raises cancels its own request (logged) and never fails the batch.

Not here: reading the tokens on an event loop and turning them into text (``rlvr.server.openai_stream``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["Drawn", "Watch"]

log = logging.getLogger(__name__)

Drawn = list[tuple[int, int, float]]
"""Tokens drawn in one step (or between two looks): (sample index in the request, token id, its logprob), by sample
and in the order drawn."""


class Watch:
    """Hands a sampling request's tokens to ``on_tokens`` as they are drawn, on the engine's thread; ``cancel`` stops
    the request. One watch per request."""

    def __init__(self, on_tokens: Callable[[Drawn], None]) -> None:
        self._on_tokens = on_tokens
        self._cancelled = threading.Event()

    def step(self, drawn: Drawn) -> None:
        """Called by the sampler with the tokens drawn since the last call; a callback that raises cancels."""
        if not drawn or self.cancelled:
            return
        try:
            self._on_tokens(drawn)
        except Exception:
            log.exception("rlvr: a sampling request's token callback failed; the request is cancelled")
            self.cancel()

    def cancel(self) -> None:
        """Stop the request: its rows leave the batch at the sampler's next step. Any thread; idempotent."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()
