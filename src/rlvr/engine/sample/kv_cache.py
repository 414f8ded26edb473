"""A KV cache that grows in place: keys and values live in buffers with spare capacity (doubled when full), and
each decoded token is written into them, instead of Hugging Face's ``DynamicCache`` concatenating a new tensor
at every step (which copies the whole cache per token and was a quarter of a CPU decode step).

It plugs into any transformers causal LM as ``**cache_kwargs(GrowingCache())``; ``GrowingCache(capacity)`` reserves
that many columns at the first write, so a decode whose length is known never reallocates. Not here: paging, sliding
windows or quantized caches; layers of those kinds are not supported.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

MIN_CAPACITY = 64  # tokens of room a buffer starts with beyond its first write

CACHE_ARGUMENT = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
"""The name a transformers forward takes its cache under and returns it as. Recent 5.x releases (5.24 here) renamed
``past_key_values`` to ``cache``, and warn that the old name goes in 5.40; older ones do not know ``cache``, and a
forward would take it as one more ignored keyword, so the name is read from the installed version."""


def cache_kwargs(cache: Cache) -> dict[str, Any]:
    """Keyword arguments that make a transformers forward read and extend ``cache``."""
    return {CACHE_ARGUMENT: cache, "use_cache": True}


def returned_cache(output: Any) -> Cache:
    """The cache a transformers forward returned in ``output``."""
    return getattr(output, CACHE_ARGUMENT)


class GrowingLayer(DynamicLayer):
    """One layer's keys and values, (B, H, T, D) views into (B, H, capacity, D) buffers."""

    def __init__(self, capacity: int = 0) -> None:
        super().__init__()
        self.initial_capacity = capacity  # columns the first write reserves at least

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self._keys_buffer: torch.Tensor | None = None
        self._values_buffer: torch.Tensor | None = None
        self._length = 0
        self.is_initialized = True

    def _refresh_views(self) -> None:
        self.keys = self._keys_buffer[:, :, : self._length]
        self.values = self._values_buffer[:, :, : self._length]

    def _reserve(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        capacity = 0 if self._keys_buffer is None else self._keys_buffer.shape[2]
        if needed <= capacity:
            return
        new_capacity = max(needed + MIN_CAPACITY, 2 * capacity, self.initial_capacity)
        keys = key_states.new_empty((*key_states.shape[:2], new_capacity, key_states.shape[3]))
        values = value_states.new_empty((*value_states.shape[:2], new_capacity, value_states.shape[3]))
        if self._length:
            keys[:, :, : self._length] = self._keys_buffer[:, :, : self._length]
            values[:, :, : self._length] = self._values_buffer[:, :, : self._length]
        self._keys_buffer, self._values_buffer = keys, values

    def fix(self, column: torch.Tensor, columns: int) -> None:
        """From now on, write each update at ``column`` (a (1,) tensor, read when the update runs: a CUDA graph's
        replay writes wherever it points) and return the first ``columns`` columns of the buffers, all of them,
        written or not (the caller masks out the rest). ``get_seq_length`` no longer moves."""
        if self._keys_buffer is None or self._keys_buffer.shape[2] < columns:
            raise ValueError(f"a fixed cache layer needs {columns} reserved columns; reserve them at the first write")
        if not getattr(self, "_fixed", False):  # once: after a row selection the columns past the prompt hold steps
            self._keys_buffer[:, :, self._length : columns].zero_()  # reserved memory is uninitialised: a NaN there,
            self._values_buffer[:, :, self._length : columns].zero_()  # masked out or not, reaches the output (0*NaN)
            self._fixed = True
        self._column, self._columns = column, columns

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if getattr(self, "_column", None) is not None:
            self._keys_buffer.index_copy_(2, self._column, key_states)
            self._values_buffer.index_copy_(2, self._column, value_states)
            return self._keys_buffer[:, :, : self._columns], self._values_buffer[:, :, : self._columns]
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        self._reserve(key_states, value_states, self._length + new)
        self._keys_buffer[:, :, self._length : self._length + new] = key_states
        self._values_buffer[:, :, self._length : self._length + new] = value_states
        self._length += new
        self._refresh_views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._length if self.is_initialized else 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows ``indices`` (repeats allowed: a prompt's row copied for each of its samples)."""
        if self.get_seq_length() > 0:
            self._keys_buffer = self._keys_buffer[indices]
            self._values_buffer = self._values_buffer[indices]
            self._refresh_views()
            self._column = None  # the new buffers are for a new fixed step to claim

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.get_seq_length() > 0:
            self._keys_buffer = self._keys_buffer.repeat_interleave(repeats, dim=0)
            self._values_buffer = self._values_buffer.repeat_interleave(repeats, dim=0)
            self._refresh_views()

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("GrowingLayer does not crop; rlvr's sampler never needs it")

    def reset(self) -> None:
        self.keys = self.values = None
        self._keys_buffer = self._values_buffer = None
        self._column, self._fixed = None, False
        self._length = 0
        self.is_initialized = False


class GrowingCache(Cache):
    """A cache of ``GrowingLayer``s, one per decoder layer, created as the model first writes to them; ``capacity``:
    columns each reserves at its first write (0: just what that write needs, plus ``MIN_CAPACITY``)."""

    def __init__(self, capacity: int = 0) -> None:
        super().__init__(layer_class_to_replicate=functools.partial(GrowingLayer, capacity))  # type: ignore[arg-type]
