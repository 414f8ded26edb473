"""The GPU's own decode step for Llama-family models: one new token per row through the model's weights, on the
kernels of ``kernels.py`` (Triton's, or the plain-torch references), instead of Hugging Face's forward.

The structure follows the CPU's decode step (``engine/cpu/decode.py``), with what suits a GPU:

- each projection is one matmul on the model's own frozen weight, plus per active LoRA adapter ``(x A^T) B^T *
  scale`` beside it (unmerged, read from their modules at every step, so an optimizer step is seen by the next one);
- the residual add is fused into the next RMSNorm, SiLU(gate) * up is one kernel, the rotary embedding is applied in
  place (after Qwen3's q/k RMSNorm);
- keys and values live in per-layer buffers (R, G, capacity, D) reserved at ``start``, each row's columns packed from
  column 0, so one length per row says what attention reads (``decode_attention``: grouped-query, split over columns);
- ``step`` runs on fixed buffers with no host synchronisation, so it can be captured as a CUDA graph per batch size.

Prompts are prefilled by the model's own forward (``sampler.prefill``); ``start`` takes its cache. Invariant: a row's
logits equal the model's forward with a cache up to the rounding of its dtype (float32 ~1e-5; bfloat16: the kernels
round where the modules round), checked for Llama, Qwen2 and Qwen3 with and without LoRA
(``tests/engine/gpu/test_gpu_decode.py``).

Supported: ``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM`` with SiLU MLPs, full attention, a rotary
table independent of the sequence length and heads the kernels take (``Kernels.supports``), optionally with plain
peft LoRA adapters. Anything else returns ``None`` from ``GpuDecoder.build``.

Not here: choosing tokens (``device_sampler.py``), the kernels (``kernels.py``, ``triton_kernels.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlvr.engine.gpu.kernels import Kernels

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


class _Unsupported(Exception):
    """The model holds something this decode step does not reproduce."""


@dataclass
class _Linear:
    """A projection: the frozen base weight (and bias) and the active LoRA adapters beside it, (A, B, scale) each."""

    weight: torch.Tensor  # (out, in)
    bias: torch.Tensor | None
    adapters: list[tuple[torch.Tensor, torch.Tensor, float]]  # A (r, in), B (out, r), scale

    @classmethod
    def of(cls, module: torch.nn.Module) -> _Linear:
        """Read ``module`` (an ``nn.Linear`` or peft's LoRA ``Linear``): its weights, not copies."""
        base = getattr(module, "base_layer", module)
        if not isinstance(base, torch.nn.Linear):
            raise _Unsupported(f"{type(base).__name__} projection")
        adapters = []
        if base is not module and not module.disable_adapters and not module.merged:
            for name in module.active_adapters:
                if name not in module.lora_A:
                    continue
                if name in getattr(module, "lora_variant", {}) or module.lora_B[name].bias is not None:
                    raise _Unsupported("a LoRA variant or LoRA bias")
                adapters.append((module.lora_A[name].weight, module.lora_B[name].weight, float(module.scaling[name])))
        return cls(base.weight, base.bias, adapters)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)  # (R, out)
        for a, b, scale in self.adapters:
            out = out + F.linear(F.linear(x, a), b) * scale  # peft's order: B(A(x)) * scale, then the add
        return out


@dataclass
class _Layer:
    attn_norm: torch.nn.Module
    q: _Linear
    k: _Linear
    v: _Linear
    o: _Linear
    mlp_norm: torch.nn.Module
    gate: _Linear
    up: _Linear
    down: _Linear
    q_norm: torch.nn.Module | None  # Qwen3's RMSNorm over each query head (None elsewhere)
    k_norm: torch.nn.Module | None


class GpuDecoder:
    """Decodes rows one token at a time from a prefilled cache on ``kernels``; see the module docstring."""

    def __init__(self, causal_lm: torch.nn.Module, layers: list[_Layer], head: _Linear, kernels: Kernels) -> None:
        config = causal_lm.config
        self.model = causal_lm.model
        self.layers = layers
        self.head = head
        self.kernels = kernels
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.scale = self.head_dim**-0.5
        self.keys: list[torch.Tensor] = []  # per layer (R, G, capacity, D)
        self.values: list[torch.Tensor] = []
        self.lengths = torch.empty(0, dtype=torch.int32)  # (R,) columns each row holds
        self.cos = torch.empty(0)  # (capacity, D): the rotary embedding of each position, in the model's dtype
        self.sin = torch.empty(0)

    @classmethod
    def build(cls, model: torch.nn.Module, kernels: Kernels) -> GpuDecoder | None:
        """A decoder over ``model`` (a Llama-family causal LM, peft-wrapped or not, with its active adapters) on
        ``kernels`` (``kernels.REFERENCE`` or ``kernels.triton_kernels()``), or None where it is unsupported."""
        causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = getattr(causal_lm, "config", None)
        if type(causal_lm).__name__ not in ARCHITECTURES or getattr(config, "hidden_act", None) != "silu":
            return None
        if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or []):
            return None  # sliding-window layers
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        if not kernels.supports(head_dim):
            return None
        rope_type = str(getattr(causal_lm.model.rotary_emb, "rope_type", ""))
        if "dynamic" in rope_type or rope_type == "longrope":
            return None  # a table that rescales with the sequence's length
        try:
            layers = [_Layer(layer.input_layernorm, _Linear.of(layer.self_attn.q_proj),
                             _Linear.of(layer.self_attn.k_proj), _Linear.of(layer.self_attn.v_proj),
                             _Linear.of(layer.self_attn.o_proj), layer.post_attention_layernorm,
                             _Linear.of(layer.mlp.gate_proj), _Linear.of(layer.mlp.up_proj),
                             _Linear.of(layer.mlp.down_proj), getattr(layer.self_attn, "q_norm", None),
                             getattr(layer.self_attn, "k_norm", None))
                      for layer in causal_lm.model.layers]
            head = _Linear.of(causal_lm.lm_head)
        except _Unsupported:
            return None
        return cls(causal_lm, layers, head, kernels)

    @torch.inference_mode()
    def start(self, cache: list[tuple[torch.Tensor, torch.Tensor]], attention_mask: torch.Tensor, capacity: int
              ) -> None:
        """Take over prefilled rows: ``cache`` holds each layer's keys and values, (R, G, P, D) each, left-padded
        where ``attention_mask`` (R, P) is 0; ``capacity``: columns to reserve (the longest prompt + the most tokens
        any row may add)."""
        rows, width = attention_mask.shape
        if capacity < width:
            raise ValueError(f"capacity={capacity} is below the prompts' width {width}: reserve prompt + new tokens")
        lengths = attention_mask.sum(-1)  # (R,)
        # column j of row r comes from prompt column (P - length) + j: its tokens packed from column 0
        source = (width - lengths)[:, None] + torch.arange(width, device=lengths.device)  # (R, P)
        source = source.clamp(max=width - 1)[:, None, :, None]
        self.keys, self.values = [], []
        for keys, values in cache:
            shape = (rows, self.num_kv_heads, capacity, self.head_dim)
            index = source.expand(rows, self.num_kv_heads, width, self.head_dim)
            for store, prompt in ((self.keys, keys), (self.values, values)):
                buffer = prompt.new_zeros(shape)
                buffer[:, :, :width] = prompt.gather(2, index)
                store.append(buffer)
        self.lengths = lengths.to(torch.int32)
        dtype = self.layers[0].q.weight.dtype
        positions = torch.arange(capacity, device=lengths.device)[None]
        cos, sin = self.model.rotary_emb(torch.empty(0, dtype=dtype, device=lengths.device), positions)
        self.cos, self.sin = cos[0], sin[0]  # (capacity, D)

    def keep(self, rows: torch.Tensor) -> None:
        """Only these rows (indices into the current rows) continue."""
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
        self.lengths = self.lengths[rows]

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (``tokens``, ``positions``: (R,)); returns the next-token logits (R, V) float32.
        Writes each row's new key and value at column ``lengths[r]``, then advances ``lengths`` in place."""
        kernels = self.kernels
        R, H, G, D = len(tokens), self.num_heads, self.num_kv_heads, self.head_dim
        rows = torch.arange(R, device=tokens.device)
        columns = self.lengths.long()
        seen = self.lengths + 1  # (R,) columns attended, the new one included
        cos, sin = self.cos[positions], self.sin[positions]  # (R, D)
        hidden = self.model.embed_tokens(tokens)  # (R, hidden): the residual stream
        delta = None  # the last block's output, not yet added to the stream (the add is fused into the next norm)
        for layer, keys, values in zip(self.layers, self.keys, self.values, strict=True):
            x = self._norm(layer.attn_norm, delta, hidden)
            q = layer.q(x).view(R, H, D)
            k = layer.k(x).view(R, G, D)
            if layer.q_norm is not None:
                q = kernels.rms_norm(q.reshape(R * H, D), layer.q_norm.weight, layer.q_norm.variance_epsilon
                                     ).view(R, H, D)
                k = kernels.rms_norm(k.reshape(R * G, D), layer.k_norm.weight, layer.k_norm.variance_epsilon
                                     ).view(R, G, D)
            kernels.rotary_(q, k, cos, sin)
            keys[rows, :, columns] = k
            values[rows, :, columns] = layer.v(x).view(R, G, D)
            attended = kernels.decode_attention(q, keys, values, seen, self.scale)  # (R, H, D)
            x = self._norm(layer.mlp_norm, layer.o(attended.view(R, H * D)), hidden)
            delta = layer.down(kernels.swiglu(layer.gate(x), layer.up(x)))
        self.lengths.copy_(seen)
        return self.head(self._norm(self.model.norm, delta, hidden)).float()

    def _norm(self, norm: torch.nn.Module, delta: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor:
        """``norm`` of the residual stream ``hidden`` after adding ``delta`` to it in place (None: nothing yet)."""
        return self.kernels.rms_norm(hidden if delta is None else delta, norm.weight, norm.variance_epsilon,
                                     None if delta is None else hidden)
