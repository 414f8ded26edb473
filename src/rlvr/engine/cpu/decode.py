"""The decode step of Llama-family models, written for sampling many rows on a CPU.

Hugging Face's forward is general, and at one new token per row its generality is most of the cost. This module
runs the same arithmetic with the model's own weights (no copy), after the prompt is prefilled by the model's own
forward: projections fused and prepacked (``packed.py``, ``amx_linear``, ``fma_linear``), LoRA adapters unmerged (so
sampler snapshots share one base model), a prompt's keys and values held once per chunk of its rows, generated keys
and values in buffers sized once for the decode, attention in one call of the fused kernel per layer
(``fused_attention``) where it runs, finished rows dropped lazily. How each part works and what it buys:
``docs/performance.md`` ("The sampler's decode path").

Invariants:

- the logits equal the model's forward to rounding, with and without LoRA (``tests/engine/cpu/test_decode.py``);
- a row's logits depend on that row alone, bit for bit, not on the other rows, their number, the chunks or the
  prompts' padding (the sampler's seed guarantee, ``sample/sampler.py``): the base products run on packs whose rows
  come out alike at any row count (oneDNN's, the FMA and AMX kernels), so do the adapters' (``adapter_kind``), the
  fused kernel attends row by row, and norms, activations and the rotary embedding work row by row. A plain
  ``F.linear`` (MKL rounds 1 to 3 rows otherwise than 4 or more) and PyTorch's attention ops would not hold it.

Supported: ``LlamaForCausalLM`` (SmolLM2, Llama 2/3, the tiny test model), ``Qwen2ForCausalLM`` (biases on q, k and
v) and ``Qwen3ForCausalLM`` (an RMSNorm over each query and key head), optionally wrapped by peft with plain LoRA
adapters. Anything else (another architecture, DoRA, a LoRA bias, sliding-window layers) returns ``None`` from
``LlamaDecoder.build`` and the sampler decodes through Hugging Face's forward instead.

Not here: choosing tokens and stopping rows (``sampler.py``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlvr.engine.cpu import amx_linear, fma_linear, fused_attention
from rlvr.engine.cpu.packed import (
    AMX_KINDS,
    BFLOAT16_KINDS,
    fastest_kind,
    model_kind,
    pack,
    pack_kinds,
    packed_linear,
    packs_fit,
)
from rlvr.numerics import active

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")  # the Llama family this step runs
COMPACT_FRACTION = 0.25  # compact the buffers once this fraction of their rows has finished
TIMING_ROWS = 64  # the batch the decode kernel is chosen at (once per process): 8 prompts x 8 samples
MACHINE_BALANCE = 20.0  # FLOPs per byte of memory read at which a 2-core CPU's matmuls and memory take equal time
ROTARY_BLOCK = 256  # positions whose rotary embedding is computed together (``LlamaDecoder._rotary``)


@dataclass
class _Adapter:
    """One LoRA adapter on a group of projections sharing an input: ``a`` stacks their A matrices.

    With a ``kind``, A and each B are packs for that kernel (``adapter_kind``), whose products round each row
    alike whatever the row count; else they are the module weights, multiplied by ``F.linear``.
    """

    a: torch.Tensor  # (sum r, in)
    parts: list[tuple[slice, slice, torch.Tensor, float]]  # (output columns, rows of a, B (out, r), scale)
    kind: str = ""


@dataclass
class _Projections:
    """Linear maps that read the same input: base weights (and biases) and the LoRA adapters active on them.

    With ``packed`` set, the fused base weights run as one matmul on weights prepacked for this machine's fastest
    kernel (``pack_kind``: oneDNN's serves any row count, MKL's only batches of exactly ``pack_rows`` rows; other
    batch sizes use the module weights directly). The result is the same product either way, up to rounding; or,
    with ``pack_kind`` "bf16" or "bf16x1" (the model's frozen linears run in bfloat16, ``packed.base_precision``, on
    the trainer's kernel, ``packed.bfloat16_kind``), the same bfloat16 product as the trainer's.
    """

    weights: list[torch.Tensor]
    biases: list[torch.Tensor | None]
    adapters: list[_Adapter]
    packed: torch.Tensor | None = None
    pack_kind: str = ""
    pack_rows: int = 0
    pack_bias: torch.Tensor | None = None
    pack_shape: torch.Tensor | None = None  # (out, in), no storage: read by MKL only when the row count differs

    def __call__(self, x: torch.Tensor, norm: torch.nn.Module | None = None, gated: bool = False) -> torch.Tensor:
        """All outputs side by side, (R, sum of output sizes), in the order of the modules, for the input ``x``, or
        ``x`` through the RMSNorm ``norm``, or with ``gated`` SiLU of ``x``'s first half times its second half. On
        the AMX kernel the kernel computes that input itself (and hands it to the adapters)."""
        if self.pack_kind in AMX_KINDS:
            inputs = torch.empty(x.shape[0], self.pack_shape.shape[1]) if self.adapters else None
            out = amx_linear.linear(amx_linear.kernel(), x, self.packed, self.pack_shape.shape[0],
                                    None if norm is None else norm.weight,
                                    0.0 if norm is None else norm.variance_epsilon, gated, inputs)
            if self.pack_bias is not None:
                out.add_(self.pack_bias)
            return self._add_adapters(inputs, out)
        if norm is not None:
            x = _rms_norm(norm, x)
        if gated:
            x = F.silu(x[:, : x.shape[1] // 2]).mul_(x[:, x.shape[1] // 2 :])
        if self.packed is not None and (self.pack_kind != "mkl" or x.shape[0] == self.pack_rows):
            out = packed_linear(x, self.packed, self.pack_kind, self.pack_shape, self.pack_bias, self.pack_rows)
        elif len(self.weights) == 1:
            out = F.linear(x, self.weights[0], self.biases[0])
        else:
            out = torch.cat([F.linear(x, w, b) for w, b in zip(self.weights, self.biases, strict=True)], dim=-1)
        return self._add_adapters(x, out)

    def _add_adapters(self, x: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
        """``out`` plus each active adapter's product on the input ``x`` (None only when there are none), scaled as
        peft scales it: out + (x A^T B^T) * scale."""
        for adapter in self.adapters:
            if not adapter.kind:
                low = F.linear(x, adapter.a)  # (R, sum r)
                for columns, rows, b, scale in adapter.parts:
                    out[:, columns].addmm_(low[:, rows], b.t(), alpha=scale)
                continue
            low = _adapter_product(x.contiguous(), adapter.a, adapter.kind, adapter.parts[-1][1].stop)  # (R, sum r)
            single = len(adapter.parts) == 1
            for columns, rows, b, scale in adapter.parts:
                product = _adapter_product(low if single else low[:, rows].contiguous(), b, adapter.kind,
                                           columns.stop - columns.start)
                out[:, columns].add_(product.mul_(scale))  # a multiply, then an add: each rounds once, row by row
        return out


def adapter_kind() -> str:
    """The kernel LoRA adapters' products run on: rlvr's FMA kernel where it runs here, else oneDNN's packed matmul
    where torch has it, else "" (``F.linear`` on the module weights). Unlike MKL's ``F.linear``, which takes another
    path for 1 to 3 rows or an odd count, both round each row alike whatever the row count, so a sampled row does
    not depend on what else is in the batch. The FMA kernel's call costs a few microseconds where oneDNN's costs
    tens, and a decode step makes about eight such calls a layer: a LoRA on every projection of SmolLM2 took 40%
    of a one-row step on oneDNN's."""
    kinds = pack_kinds()
    if "fma" in kinds and fma_linear.kernel() is not None:
        return "fma"
    return "mkldnn" if "mkldnn" in kinds else ""


def _adapter_product(x: torch.Tensor, packed: torch.Tensor, kind: str, out_features: int) -> torch.Tensor:
    """``x`` (R, in) times the LoRA matrix ``packed`` holds for ``kind`` (``_adapter_pack``), (R, ``out_features``)."""
    if kind == "fma":
        return fma_linear.linear(fma_linear.kernel(), x, packed, out_features)
    return packed_linear(x, packed, "mkldnn", None, None, 0)


class _Unsupported(Exception):
    """The model holds something this decoder does not reproduce; the sampler falls back to Hugging Face."""


def _projections(modules: list[torch.nn.Module], kind: str) -> _Projections:
    """Read base weights and active plain-LoRA adapters from ``modules`` (nn.Linear or peft's LoRA Linear), the
    adapters packed for ``kind`` (``adapter_kind``; "": unpacked)."""
    weights, biases, by_name = [], [], {}
    for index, module in enumerate(modules):
        base = getattr(module, "base_layer", module)
        if not isinstance(base, torch.nn.Linear) or base.weight.dtype != torch.float32:
            raise _Unsupported(f"{type(base).__name__} projection")
        weights.append(base.weight)
        biases.append(base.bias)
        if base is module or module.disable_adapters or module.merged:  # merged adapters are in the base weight
            continue
        for name in module.active_adapters:
            if name not in module.lora_A:
                continue
            if name in getattr(module, "lora_variant", {}) or module.lora_B[name].bias is not None:
                raise _Unsupported("a LoRA variant or LoRA bias")
            by_name.setdefault(name, []).append((index, module.lora_A[name], module.lora_B[name],
                                                 float(module.scaling[name])))
    if any(b is None for b in biases) and any(b is not None for b in biases):
        raise _Unsupported("projections with and without bias sharing an input")
    columns = [0]  # where each module's outputs start in the side-by-side result
    for w in weights:
        columns.append(columns[-1] + w.shape[0])
    adapters = []
    for parts in by_name.values():
        offsets = [0]
        for _, a, _, _ in parts:
            offsets.append(offsets[-1] + a.weight.shape[0])
        a_modules = [a for _, a, _, _ in parts]
        if kind and len(parts) > 1 and len({scale for *_, scale in parts}) == 1:
            # One product for the whole group: B of each part in its own block (its output columns, its rows of
            # A's result), zeros elsewhere. A zero term adds nothing, so each output is the sum its part's own
            # product gives, at one call per group instead of one per projection.
            blocks = [(slice(columns[index], columns[index + 1]), slice(offsets[i], offsets[i + 1]))
                      for i, (index, *_) in enumerate(parts)]
            b_all = _adapter_pack([b for _, _, b, _ in parts], kind, (columns[-1], offsets[-1]), blocks)
            adapters.append(_Adapter(_adapter_pack(a_modules, kind),
                                     [(slice(0, columns[-1]), slice(0, offsets[-1]), b_all, parts[0][3])], kind))
            continue
        adapters.append(_Adapter(
            _adapter_pack(a_modules, kind) if kind
            else torch.cat([a.weight for a in a_modules]) if len(a_modules) > 1 else a_modules[0].weight,
            [(slice(columns[index], columns[index + 1]), slice(offsets[i], offsets[i + 1]),
              _adapter_pack([b], kind) if kind else b.weight, scale)
             for i, (index, _, b, scale) in enumerate(parts)], kind))
    return _Projections(weights, biases, adapters)


# Packs of LoRA weights (``adapter_kind``), by the first LoRA module packed (weakly held, so a pack goes with its
# adapter): (stamp, pack). A decoder is built for every sampling batch, and packing every adapter of SmolLM2 took
# ~90 ms of a 400 ms request. LoRA weights change in place (an optimizer step, a state load: their version counter
# moves) or are replaced (another tensor, another address): either changes the stamp.
_ADAPTER_PACKS: weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple, torch.Tensor]] = weakref.WeakKeyDictionary()


def _adapter_pack(modules: list[torch.nn.Module], kind: str, shape: tuple[int, int] | None = None,
                  blocks: list[tuple[slice, slice]] | None = None) -> torch.Tensor:
    """The ``kind`` pack of the weights of ``modules`` (LoRA A or B layers) stacked by rows, or, with ``shape``,
    each placed in its block of ``blocks`` (rows, columns) of a zero matrix; reused while none of them has
    changed."""
    weights = [m.weight for m in modules]
    stamp = (kind, *((id(m), id(w), w.data_ptr(), w._version) for m, w in zip(modules, weights, strict=True)))
    kept = _ADAPTER_PACKS.get(modules[0])
    if kept is not None and kept[0] == stamp:
        return kept[1]
    if shape is None:
        whole = torch.cat(weights) if len(weights) > 1 else weights[0]
    else:
        whole = torch.zeros(shape, dtype=weights[0].dtype)
        for weight, (rows, columns) in zip(weights, blocks, strict=True):
            whole[rows, columns] = weight.detach()
    packed = pack(whole.detach(), kind, TIMING_ROWS)
    _ADAPTER_PACKS[modules[0]] = (stamp, packed)
    return packed


# Packed weights per base model (weakly held, so they go with the model): (kind, row count, packed per projection).
_PACKS: weakref.WeakKeyDictionary[torch.nn.Module, tuple[str, int, list[torch.Tensor]]] = weakref.WeakKeyDictionary()


def _attach_packs(causal_lm: torch.nn.Module, projections: list[_Projections], rows: int) -> None:
    """Give ``projections`` their base weights fused and prepacked for this machine's fastest matmul (the AMX kernel
    where it runs, else chosen by timing at ``TIMING_ROWS`` rows on the first batch; about 0.5 s and one more copy
    of the weights for SmolLM2; in bfloat16, the trainer's kernel, ``packed.bfloat16_kind``).
    oneDNN's and the AMX kernel's packs serve every batch; MKL's are for one row count and are rebuilt when a batch
    of another size starts."""
    size = sum(w.numel() * w.element_size() for p in projections for w in p.weights)
    bf16 = model_kind(causal_lm) in BFLOAT16_KINDS  # the trainer multiplies in bfloat16: the sampler on its kernel
    if not bf16 and (not pack_kinds() or not packs_fit(size)):
        return
    kind, packed_rows, packs = _PACKS.get(causal_lm, (None, 0, []))
    if kind is None:
        kind = model_kind(causal_lm) if bf16 else fastest_kind("decode", torch.cat(projections[0].weights),
                                                                TIMING_ROWS)
    if kind and (not packs or (kind == "mkl" and packed_rows != rows)):
        packs.clear()  # free the old packs before building new ones
        packs = [pack(torch.cat(p.weights), kind, rows) for p in projections]
        packed_rows = rows
    _PACKS[causal_lm] = (kind, packed_rows, packs)
    if not kind:
        return
    for projection, packed in zip(projections, packs, strict=True):
        projection.packed, projection.pack_kind, projection.pack_rows = packed, kind, packed_rows
        out = sum(w.shape[0] for w in projection.weights)
        projection.pack_shape = torch.zeros(1, 1).expand(out, projection.weights[0].shape[1])
        if projection.biases[0] is not None:
            projection.pack_bias = torch.cat(projection.biases)


@dataclass
class _Layer:
    attn_norm: torch.nn.Module
    qkv: _Projections
    o: _Projections
    mlp_norm: torch.nn.Module
    gate_up: _Projections
    down: _Projections
    q_norm: torch.nn.Module | None = None  # Qwen3: an RMSNorm over each query head, and one over each key head
    k_norm: torch.nn.Module | None = None


def _rms_norm(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` (R, heads, D): x * cos + rotate_half(x) * sin, with rotate_half(x) = (-x2, x1)
    done as the halves swapped (a flip) times ``signed_sin`` = (-sin1, sin2)."""
    rows, heads, dim = x.shape
    swapped = x.view(rows, heads, 2, dim // 2).flip(2).view(rows, heads, dim)
    return torch.addcmul(x * cos, swapped, signed_sin)


def chunk_size(counts: list[int], slot_cost: float, generated: int, prompt_width: int) -> int:
    """How many slots a chunk gets, for prompts continued by ``counts`` live rows each: the size whose step costs
    least, a slot costing ``slot_cost`` (its matmuls) plus its ``generated`` columns of keys and values read, and a
    chunk its ``prompt_width`` prompt columns, read once for all its slots. Idle slots (a prompt's rows not filling
    its last chunk) cost as much as busy ones; ties go to the larger size."""
    def cost(size: int) -> float:
        chunks = sum(-(-n // size) for n in counts)
        return chunks * size * (slot_cost + generated) + chunks * prompt_width
    return min(range(max(counts), 0, -1), key=cost)


class LlamaDecoder:
    """Decodes rows one token at a time from a prefilled cache; see the module docstring."""

    def __init__(self, causal_lm: torch.nn.Module, layers: list[_Layer], head: _Projections) -> None:
        config = causal_lm.config
        self.causal_lm = causal_lm
        self.model = causal_lm.model
        self.layers = layers
        self.head = head
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.scale = self.head_dim**-0.5
        # Every projection of a step, the head last (fused and packed together by ``_attach_packs``).
        self.projections = [*(p for layer in layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down)), head]
        # A slot's matmuls per step, in the time of reading one column of keys and values of every layer.
        linear = sum(w.numel() for p in self.projections for w in p.weights)
        column_bytes = 2 * len(layers) * self.num_kv_heads * self.head_dim * 4
        self.slot_cost = 2 * linear / (MACHINE_BALANCE * column_bytes)
        # Slots come in chunks of ``chunk`` consecutive slots that continue the same prompt. Per layer: the prompt's
        # keys and values once per chunk, (C, G, P, D), and each slot's generated ones, (S, G, capacity - P, D),
        # with S = C * chunk slots and G key/value heads. (Keys stored transposed make the scores a quarter faster,
        # but writing one strided column per step costs as much again.)
        self.prompts: list[tuple[torch.Tensor, torch.Tensor]] = []  # distinct prompts' cache per layer (U, G, P, D)
        self.prompt_mask = torch.empty(0)  # (U, P): 1 on prompt tokens, 0 on left padding
        self.prompt_keys: list[torch.Tensor] = []
        self.prompt_values: list[torch.Tensor] = []
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.chunk = 1
        self.slot_prompt = torch.empty(0, dtype=torch.long)  # (S,) the prompt each slot continues
        self.bias = torch.empty(0)  # (C, 1, 1, P): 0 where a chunk's prompt attends, -inf on its left padding
        self.padded = False  # whether any prompt is left-padded (else the bias is all zeros and skipped)
        self.generated = 0  # generated columns written
        self.slots = torch.empty(0, dtype=torch.long)  # (R,) the buffer slot of each live row
        # The fused attention kernel where it runs here (``fused_attention``; None: PyTorch's ops). With it, keys
        # (prompt and generated) are stored in its blocked layout, (..., ceil(columns / 16), D, 16).
        policy = active()  # the engine's numerics: its attention setting
        self.fused = (fused_attention.kernel(policy.attention, policy.source("attention"))
                      if fused_attention.supports(self.num_heads // self.num_kv_heads, self.head_dim) else None)
        self.scratch = torch.empty(0)  # the kernel's attention weights, S * H * (P + capacity) floats
        self.cos: torch.Tensor | None = None  # (positions, D): the rotary embedding of each position (``_rotary``)
        self.signed_sin: torch.Tensor | None = None

    @classmethod
    def build(cls, model: torch.nn.Module) -> LlamaDecoder | None:
        """A decoder over ``model`` (a Llama causal LM, peft-wrapped or not) with its active adapters, or None."""
        causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = getattr(causal_lm, "config", None)
        if type(causal_lm).__name__ not in ARCHITECTURES or getattr(config, "hidden_act", None) != "silu":
            return None
        if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or []):
            return None  # sliding-window layers (a Qwen2 with use_sliding_window)
        kind = adapter_kind()  # once per decoder: it looks for a compiler and the machine's kernels
        try:
            layers = [
                _Layer(layer.input_layernorm,
                       _projections([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj], kind),
                       _projections([layer.self_attn.o_proj], kind), layer.post_attention_layernorm,
                       _projections([layer.mlp.gate_proj, layer.mlp.up_proj], kind),
                       _projections([layer.mlp.down_proj], kind),
                       getattr(layer.self_attn, "q_norm", None), getattr(layer.self_attn, "k_norm", None))
                for layer in causal_lm.model.layers
            ]
            head = _projections([causal_lm.lm_head], kind)
        except _Unsupported:
            return None
        return cls(causal_lm, layers, head)

    def start(self, prompts: list[tuple[torch.Tensor, torch.Tensor]], attention_mask: torch.Tensor, rows: torch.Tensor,
              capacity: int) -> None:
        """Take over prefilled prompts: ``prompts`` holds each layer's keys and values of the distinct prompts,
        (U, G, P, D) each (``sampler.prefill_each``), with ``attention_mask`` (U, P) marking their left padding; row
        r continues prompt ``rows[r]``. ``capacity``: columns to reserve (prompt width + the most tokens any row may
        add)."""
        width = attention_mask.shape[1]
        _attach_packs(self.causal_lm, self.projections, len(rows))
        self.prompts = list(prompts)
        self.cos, self.signed_sin = self._rotary(capacity)
        self.prompt_mask = attention_mask
        self.padded = bool((attention_mask == 0).any())
        self.generated = 0
        own = capacity - width
        self.values = [torch.empty(0, self.num_kv_heads, own, self.head_dim)] * len(self.prompts)
        self.keys = list(self.values)
        if self.fused:
            self.prompts = [(fused_attention.to_blocks(k), v.contiguous()) for k, v in self.prompts]
            blocks = fused_attention.key_blocks(own)
            self.keys = [torch.empty(0, self.num_kv_heads, blocks, self.head_dim, fused_attention.BLOCK)] * len(
                self.prompts)
        self._layout(rows, torch.empty(0, dtype=torch.long))

    def _rotary(self, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary embedding's cos and signed sin (see ``_rotate``) of positions 0 .. ``positions`` - 1,
        (positions, D) each, computed by the model's own rotary module in blocks of ``ROTARY_BLOCK`` positions: a
        position's values then never depend on which others a step holds (an elementwise cos may round a vector's
        tail otherwise than its body). A rotary embedding that rescales with the length it is asked for (dynamic,
        longrope) is computed per step instead (``cos`` None)."""
        rotary = self.model.rotary_emb
        rope_type = str(getattr(rotary, "rope_type", ""))
        if "dynamic" in rope_type or rope_type == "longrope":
            return None, None
        blocks = -(-positions // ROTARY_BLOCK)
        cos, sin = rotary(torch.empty(0), torch.arange(blocks * ROTARY_BLOCK).view(blocks, ROTARY_BLOCK))
        cos, sin = cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1])
        half = sin.shape[-1] // 2
        return cos, torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)

    def _layout(self, row_prompt: torch.Tensor, row_slot: torch.Tensor) -> None:
        """Lay the live rows (row r continues prompt ``row_prompt[r]``; its generated columns so far are in slot
        ``row_slot[r]`` of the current buffers) out in chunks of ``chunk_size`` slots: rows of one prompt fill its
        chunks, the last chunk of a prompt may have idle slots. The prompt's keys and values are copied once per
        chunk, the generated ones once per row."""
        prompts, counts = torch.unique(row_prompt, return_counts=True)
        size = chunk_size(counts.tolist(), self.slot_cost, self.generated, self.prompt_mask.shape[1])
        chunk_prompt, slots = [], torch.empty(len(row_prompt), dtype=torch.long)
        for prompt, count in zip(prompts.tolist(), counts.tolist(), strict=True):
            members = (row_prompt == prompt).nonzero().squeeze(-1)
            first = len(chunk_prompt) * size
            slots[members] = torch.arange(first, first + count)
            chunk_prompt += [prompt] * ((count + size - 1) // size)
        chunk_prompt = torch.tensor(chunk_prompt)
        total, n = len(chunk_prompt) * size, self.generated
        key_columns = fused_attention.key_blocks(n) if self.fused else n
        for store, columns in ((self.keys, key_columns), (self.values, n)):
            for i, buffer in enumerate(store):
                store[i] = buffer.new_zeros((total, *buffer.shape[1:]))
                if n:
                    store[i][slots, :, :columns] = buffer[row_slot, :, :columns]
        if self.fused:
            width = self.prompt_mask.shape[1]
            self.scratch = torch.empty(total * self.num_heads * (width + self.values[0].shape[2]))
        self.prompt_keys = [keys[chunk_prompt] for keys, _ in self.prompts]
        self.prompt_values = [values[chunk_prompt] for _, values in self.prompts]
        self.bias = torch.zeros((len(chunk_prompt), 1, 1, self.prompt_mask.shape[1]))
        self.bias[:, 0, 0].masked_fill_(self.prompt_mask[chunk_prompt] == 0, float("-inf"))
        self.chunk = size
        self.slot_prompt = chunk_prompt.repeat_interleave(size)
        self.slots = slots

    def keep(self, rows: torch.Tensor) -> None:
        """Only these live rows (indices into the current live rows) continue."""
        self.slots = self.slots[rows]
        if len(self.slots) <= (1 - COMPACT_FRACTION) * self.keys[0].shape[0]:
            self._layout(self.slot_prompt[self.slots], self.slots)

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed one token per live row (``tokens``, ``positions``: (R,)); returns next-token logits (R, V) float32."""
        slots_total = self.keys[0].shape[0]
        # Row r sits in slot r only when every slot is live and the rows came sorted by prompt; otherwise (finished
        # rows keep their slots until compaction, and rows of one prompt queued apart are laid out side by side)
        # tokens go to their rows' slots, idle slots are fed anything and their outputs ignored.
        full = len(self.slots) == slots_total and bool((self.slots == torch.arange(slots_total)).all())
        if not full:
            tokens = tokens.new_zeros(slots_total).index_copy_(0, self.slots, tokens)
            positions = positions.new_zeros(slots_total).index_copy_(0, self.slots, positions)
        x = self.model.embed_tokens(tokens)  # (S, hidden)
        if self.cos is not None:
            cos, signed_sin = self.cos[positions, None], self.signed_sin[positions, None]  # (S, 1, D)
        else:
            cos, sin = self.model.rotary_emb(x, positions[:, None])  # (S, 1, D)
            half = sin.shape[-1] // 2
            signed_sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        column, self.generated = self.generated, self.generated + 1
        S, H, G, D = slots_total, self.num_heads, self.num_kv_heads, self.head_dim
        out = torch.empty(S, H * D) if self.fused else None  # the kernel's output, read by o before the next layer
        for layer, keys, values, prompt_keys, prompt_values in zip(
                self.layers, self.keys, self.values, self.prompt_keys, self.prompt_values, strict=True):
            qkv = layer.qkv(x, norm=layer.attn_norm)  # (S, (H + 2G) D)
            qk = qkv[:, : (H + G) * D].view(S, H + G, D)  # queries and the new keys
            if layer.q_norm is not None:
                qk[:, :H] = _rms_norm(layer.q_norm, qk[:, :H])
                qk[:, H:] = _rms_norm(layer.k_norm, qk[:, H:])
            qk = _rotate(qk, cos, signed_sin)
            attended = self._attend(qk, qkv[:, (H + G) * D :], keys, values, prompt_keys, prompt_values, column, out)
            x = x.add_(layer.o(attended))
            x = x.add_(layer.down(layer.gate_up(x, norm=layer.mlp_norm), gated=True))
        if not full:
            x = x[self.slots]
        return self.head(x, norm=self.model.norm).float()

    def _attend(self, qk: torch.Tensor, new_values: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                prompt_keys: torch.Tensor, prompt_values: torch.Tensor, column: int, out: torch.Tensor | None
                ) -> torch.Tensor:
        """One layer's attention, (S, H * D): each slot's queries (``qk[:, :H]``, rotated) over its chunk's prompt and
        its own generated columns, after writing its new key (``qk[:, H:]``) and value (``new_values``, (S, G * D))
        to generated column ``column``. By the fused kernel into ``out`` where it runs, else by batched matmuls."""
        S, H, G, D = qk.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        C, c, Q, P = S // self.chunk, self.chunk, H // G, self.bias.shape[-1]
        if self.fused:
            rotated = qk.view(S, (H + G) * D)
            fused_attention.attend(self.fused, rotated[:, : H * D], rotated[:, H * D :], new_values, prompt_keys,
                                   prompt_values, self.bias.view(C, P) if self.padded else None, keys, values, out,
                                   self.scratch, c, self.generated, self.scale)
            return out
        keys[:, :, column] = qk[:, H:]
        values[:, :, column] = new_values.view(S, G, D)
        q = qk[:, :H].view(S, G, Q, D)  # query heads grouped by the key/value head they share
        # The prompt part: a chunk's queries side by side against its prompt's keys, read once per chunk.
        by_chunk = q.view(C, c, G, Q, D).transpose(1, 2).reshape(C, G, c * Q, D)
        prompt_scores = torch.matmul(by_chunk, prompt_keys.transpose(-1, -2))  # (C, G, c Q, P)
        if self.padded:
            prompt_scores.add_(self.bias)
        prompt_scores = prompt_scores.view(C, G, c, Q, P).transpose(1, 2).reshape(S, G, Q, P)
        own_scores = torch.matmul(q, keys[:, :, : self.generated].transpose(-1, -2))  # (S, G, Q, n)
        weights = torch.cat((prompt_scores, own_scores), dim=-1).mul_(self.scale).softmax(dim=-1)
        to_prompt = weights[..., :P].reshape(C, c, G, Q, P).transpose(1, 2).reshape(C, G, c * Q, P)
        attended = torch.matmul(weights[..., P:], values[:, :, : self.generated])  # (S, G, Q, D)
        from_prompt = torch.matmul(to_prompt, prompt_values)  # (C, G, c Q, D)
        attended.view(C, c, G, Q, D).add_(from_prompt.view(C, G, c, Q, D).transpose(1, 2))
        return attended.view(S, H * D)
