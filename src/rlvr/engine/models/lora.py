"""LoRA adapters over one shared base model, through peft.

One ``AdapterHost`` wraps a loaded base model in a ``PeftModel`` and holds any number of named adapters on it:
one per training client, plus frozen snapshots for samplers. Only the active adapter computes, so a sampler
snapshot costs its LoRA tensors (a few MB), never a copy of the base weights. The engine activates the adapter a
request needs before running it; requests run one at a time, so activation never races.

Each adapted linear layer computes ``base(x) + scaling * B(A(x))`` as one ``addmm`` (``fused_lora_forward``): peft's
own forward scales and adds on full-size outputs, three passes over each of them (two forward, one backward) that
the matrix product's own accumulate does for free. Anything that forward does not handle (dropout, LoRA variants,
merged or disabled adapters, mixed dtypes, per-row adapter names) goes to peft's.

Not here: optimizers (``optim.py``), checkpoint files (``checkpoint.py``).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from peft.tuners.lora import Linear as LoraLinear
from peft.tuners.tuners_utils import BaseTunerLayer

from rlvr.engine.device import GpuPaths, model_device
from rlvr.engine.models.load import LoadedModel
from rlvr.errors import ConfigurationError

# Module names per trainable group, for Llama-style models (SmolLM2, tiny, Llama, Qwen, Mistral ...).
TARGET_GROUPS = {
    "attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
    "unembed": ("lm_head",),
}
LORA_ALPHA = 32  # Scaling is alpha / rank.
MAX_RETIRED = 2  # released sampler snapshots kept for reuse (building an adapter's modules costs ~0.5 s on SmolLM2)


def fused_lora_forward(layer: LoraLinear, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """``layer``'s output, ``base(x) + sum over active adapters of scaling * B(A(x))``, with each adapter's scale
    and add done by the accumulating matrix product (``addmm``'s alpha and beta); peft's forward where it is not
    plain LoRA on one dtype."""
    active = plain_adapters(layer, x.dtype)
    if args or kwargs or active is None:
        return LoraLinear.forward(layer, x, *args, **kwargs)
    result = layer.base_layer(x)
    for name in active:
        up, scaling = layer.lora_B[name].weight, layer.scaling[name]
        down = F.linear(x, layer.lora_A[name].weight)
        if result.dtype != up.dtype:  # a bfloat16 base: peft's sum, in the base's dtype
            result = result + (F.linear(down, up) * scaling).to(result.dtype)
            continue
        flat = torch.addmm(result.reshape(-1, result.shape[-1]), down.reshape(-1, down.shape[-1]), up.t(),
                           alpha=scaling)
        result = flat.view(result.shape)
    return result


def plain_adapters(layer: LoraLinear, dtype: torch.dtype) -> list[str] | None:
    """The names of ``layer``'s active adapters when each is plain LoRA (no dropout, variant or bias) with weights in
    ``dtype`` and the layer is neither merged nor disabled, so that its output is ``base(x) + sum of scaling *
    B(A(x))``; None otherwise."""
    active = [name for name in layer.active_adapters if name in layer.lora_A]
    plain = not (layer.disable_adapters or layer.merged) and all(
        name not in layer.lora_variant and isinstance(layer.lora_dropout[name], torch.nn.Identity)
        and layer.lora_A[name].weight.dtype == dtype and layer.lora_B[name].bias is None for name in active)
    return active if plain else None


def _fuse_forwards(model: torch.nn.Module) -> None:
    """Give every adapted linear layer of ``model`` ``fused_lora_forward`` (an instance attribute: peft's class and
    other models are untouched)."""
    for module in model.modules():
        if type(module) is LoraLinear and "forward" not in vars(module):
            module.forward = functools.partial(fused_lora_forward, module)


@dataclass(frozen=True)
class LoraSpec:
    """What a training client adapts; recorded in checkpoints."""

    rank: int = 32
    """LoRA rank r of every adapted matrix."""
    train_mlp: bool = True
    """Adapt the MLP projections (gate, up, down)."""
    train_attn: bool = True
    """Adapt the attention projections (q, k, v, o)."""
    train_unembed: bool = True
    """Adapt the output head (lm_head)."""
    alpha: int = LORA_ALPHA
    """LoRA alpha; the update is scaled by alpha / rank."""

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or self.rank < 1:
            raise ConfigurationError(f"rank must be a positive integer, got {self.rank!r}")
        if not (self.train_mlp or self.train_attn or self.train_unembed):
            raise ConfigurationError("train_mlp, train_attn and train_unembed are all False: nothing would train; "
                                     "set at least one to True")

    def to_dict(self) -> dict:
        return asdict(self)


class AdapterHost:
    """A base model with named LoRA adapters, one active at a time."""

    def __init__(self, base: LoadedModel, precision: str = "float32", paths: GpuPaths | None = None) -> None:
        """``paths``: the GPU paths the engine runs this model on (``device.GpuPaths``), None for the CPU paths."""
        self.base = base
        self.device = model_device(base.model)
        if paths is None:
            from rlvr.engine.cpu.packed import pack_frozen_linears  # the CPU kernels load on the CPU path only

            # Base weights never train here: prepacked matmuls, in bfloat16 if asked (packed.base_precision).
            pack_frozen_linears(base.model, precision)
        self.peft: PeftModel | None = None
        self.specs: dict[str, LoraSpec] = {}
        self._retired: list[str] = []  # snapshot adapters no sampler uses, kept for ``copy`` to reuse
        self._parameters: dict[str, dict[str, torch.nn.Parameter]] = {}  # by adapter; cleared when adapters change
        self._layers: list[BaseTunerLayer] | None = None  # the adapted layers, for ``_activate``; None after a change

    @property
    def model(self) -> torch.nn.Module:
        """The module to run: the peft wrapper once an adapter exists, else the bare base model."""
        return self.peft if self.peft is not None else self.base.model

    def _config(self, spec: LoraSpec) -> LoraConfig:
        names = {name.rsplit(".", 1)[-1] for name, _ in self.base.model.named_modules()}
        wanted = [group for group, on in (("attn", spec.train_attn), ("mlp", spec.train_mlp),
                                          ("unembed", spec.train_unembed)) if on]
        targets = sorted(m for group in wanted for m in TARGET_GROUPS[group] if m in names)
        if not targets:
            raise ConfigurationError(f"base model {self.base.name!r} has none of the modules {wanted} adapts "
                                     f"({[m for g in wanted for m in TARGET_GROUPS[g]]}); LoRA cannot attach")
        return LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=0.0, bias="none", target_modules=targets)

    def add(self, name: str, spec: LoraSpec, seed: int) -> None:
        """Create adapter ``name``; its A matrices are drawn from ``seed`` (B starts at zero, as LoRA does)."""
        config = self._config(spec)
        # peft draws the A matrices on the CPU, then moves them to the base layer's device (and dtype, then back to
        # float32: on a bfloat16 base they are rounded to bfloat16 once); manual_seed also reseeds CUDA, so fork it.
        cuda = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda), warnings.catch_warnings():
            # LoRA on a tied lm_head leaves the shared base matrix untouched, which is what we want.
            warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
            # peft probes a property transformers 5 deprecated; nothing we can act on.
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            torch.manual_seed(seed)
            self._parameters.clear()
            self._layers = None
            if self.peft is None:
                self.peft = get_peft_model(self.base.model, config, adapter_name=name)
            else:
                self.peft.add_adapter(name, config)
        _fuse_forwards(self.peft)
        self.specs[name] = spec

    def copy(self, source: str, name: str) -> str:
        """A frozen snapshot of adapter ``source``'s current weights; returns its name: ``name``, or that of a retired
        snapshot of the same spec whose modules are reused (the values are overwritten all the same)."""
        spec = self.specs[source]
        reused = next((n for n in self._retired if self.specs[n] == spec), None)
        if reused is None:
            self.add(name, spec, seed=0)
        else:
            self._retired.remove(reused)
            name = reused
        targets = self.parameters(name)
        with torch.no_grad():
            for key, value in self.parameters(source).items():
                targets[key.replace(f".{source}.", f".{name}.")].copy_(value)
        return name

    def retire(self, name: str) -> None:
        """Adapter ``name`` is no longer used: keep it for ``copy`` to reuse, or delete it when enough are kept."""
        if len(self._retired) < MAX_RETIRED:
            self._retired.append(name)
        else:
            self.delete(name)

    def delete(self, name: str) -> None:
        if name in self._retired:
            self._retired.remove(name)
        if self.peft is not None and name in self.specs and len(self.specs) > 1:
            if name in self.peft.active_adapters:  # peft warns when deleting the active adapter; move off it first
                self.peft.set_adapter(next(other for other in self.specs if other != name))
            self.peft.delete_adapter(name)
            del self.specs[name]
            self._parameters.clear()
            self._layers = None

    def parameters(self, name: str) -> dict[str, torch.nn.Parameter]:
        """Adapter ``name``'s LoRA parameters by full name, in a fixed (sorted) order (walking the model for them
        takes ~10 ms on SmolLM2, so the answer is kept until an adapter is added or deleted; do not modify it)."""
        assert self.peft is not None and name in self.specs, f"no adapter {name!r}"
        if name not in self._parameters:
            marker = f".{name}."
            params = {n: p for n, p in self.peft.named_parameters() if "lora_" in n and marker in n}
            self._parameters[name] = dict(sorted(params.items()))
        return self._parameters[name]

    def state_dict(self, name: str) -> dict[str, torch.Tensor]:
        """Adapter weights keyed as peft saves them (adapter name removed), copied to the CPU (checkpoints hold CPU
        tensors, so a state saved on a GPU loads on a CPU and back)."""
        # save_embedding_layers=False: peft would otherwise copy the full (tied) embedding matrix into every snapshot.
        state = get_peft_model_state_dict(self.peft, adapter_name=name, save_embedding_layers=False)
        return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state.items()}

    def load_state_dict(self, name: str, state: dict[str, torch.Tensor]) -> None:
        result = set_peft_model_state_dict(self.peft, state, adapter_name=name)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise ConfigurationError(f"adapter weights have keys this model lacks, e.g. {unexpected[:3]}")

    def peft_config(self, name: str) -> LoraConfig:
        return self.peft.peft_config[name]

    @contextlib.contextmanager
    def active(self, name: str | None) -> Iterator[torch.nn.Module]:
        """Run the model with adapter ``name`` (None: the bare base model)."""
        if name is None:
            if self.peft is None:
                yield self.base.model
            else:
                with self.peft.disable_adapter():
                    yield self.peft
            return
        if self.peft.active_adapter != name:
            self._activate(name)
        yield self.peft

    def _activate(self, name: str) -> None:
        """Make adapter ``name`` the active one, leaving every layer as peft's ``set_adapter`` leaves it: ``name``
        active, its parameters trainable, every other adapter's frozen. peft's switch walks every module of the model,
        the adapters' own included, and sets every adapter's parameters, so its cost grows with the number of
        adapters the host holds (a server's clients and snapshots). After the first switch since adapters were added
        or deleted (peft's own, which leaves every adapter right), only the adapter leaving and the one arriving
        change, on a list of the adapted layers kept until the next addition or deletion."""
        if self._layers is None:
            self.peft.set_adapter(name)
            self._layers = [m for m in self.peft.modules() if isinstance(m, BaseTunerLayer)]
            return
        leaving = self.peft.active_adapter
        for layer in self._layers:
            for attribute in layer.adapter_layer_names:
                adapters = getattr(layer, attribute)
                if leaving in adapters:
                    adapters[leaving].requires_grad_(False)
                if name in adapters:
                    adapters[name].requires_grad_(True)
            layer._active_adapter = [name]
        self.peft.base_model.active_adapter = name
        self.peft.active_adapter = name
