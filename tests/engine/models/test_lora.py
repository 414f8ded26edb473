"""``rlvr.engine.models.lora``: an adapter starts as a no-op, trains only its own LoRA weights, scales its update by
alpha / rank (checked by hand on a one-layer model), and adapters on one base model stay independent: switching
changes outputs, snapshots are copies, retired snapshots are reused or deleted."""

from __future__ import annotations

import functools

import pytest
import torch
from peft.tuners.lora import Linear as LoraLinear

from rlvr.engine.models.load import LoadedModel, load_base_model
from rlvr.engine.models.lora import LORA_ALPHA, MAX_RETIRED, AdapterHost, LoraSpec, fused_lora_forward
from rlvr.errors import ConfigurationError

IDS = torch.tensor([[1, 2, 3, 4, 5, 6]])
LAYERS = 3  # the tiny model's decoder layers


class OneLayer(torch.nn.Module):
    """A model that is one linear layer named as attention's query projection: y = W x + b."""

    def __init__(self, n_in: int = 5, n_out: int = 3) -> None:
        super().__init__()
        self.q_proj = torch.nn.Linear(n_in, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q_proj(x)


@pytest.fixture(scope="module")
def host() -> AdapterHost:
    return AdapterHost(load_base_model("tiny"))


def logits(host: AdapterHost, name: str | None) -> torch.Tensor:
    with host.active(name) as model, torch.no_grad():
        return model(input_ids=IDS).logits


def perturb(host: AdapterHost, name: str, seed: int) -> None:
    """Give adapter ``name`` non-zero B matrices, as training would."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key, p in host.parameters(name).items():
            if "lora_B" in key:
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))


def values(host: AdapterHost, name: str) -> dict[str, torch.Tensor]:
    """Adapter ``name``'s weights by name with the adapter name taken out, cloned."""
    return {k.replace(f".{name}.", "."): p.detach().clone() for k, p in host.parameters(name).items()}


# -- LoraSpec ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [0, -4, 1.5, "8", None])
def test_spec_rank_must_be_a_positive_integer(rank):
    with pytest.raises(ConfigurationError, match=f"rank must be a positive integer, got {rank!r}"):
        LoraSpec(rank=rank)


def test_spec_that_trains_nothing_is_refused():
    with pytest.raises(ConfigurationError, match="nothing would train; set at least one to True"):
        LoraSpec(train_mlp=False, train_attn=False, train_unembed=False)


def test_spec_round_trips_through_its_dict_and_defaults_to_alpha_32():
    spec = LoraSpec(rank=3, train_mlp=False, alpha=6)
    assert LoraSpec(**spec.to_dict()) == spec
    assert LoraSpec().alpha == LORA_ALPHA == 32


# -- the LoRA formula, by hand ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("rank", "alpha"), [(2, 6), (3, 6), (4, LORA_ALPHA)])
def test_adapted_linear_is_wx_plus_b_plus_alpha_over_rank_times_bax(rank, alpha):
    model = OneLayer().requires_grad_(False)
    weight, bias = model.q_proj.weight.clone(), model.q_proj.bias.clone()
    host = AdapterHost(LoadedModel("one-layer", model, None))
    host.add("train_0", LoraSpec(rank=rank, alpha=alpha, train_mlp=False, train_unembed=False), seed=0)
    params = host.parameters("train_0")
    a = next(p for k, p in params.items() if "lora_A" in k)
    b = next(p for k, p in params.items() if "lora_B" in k)
    assert a.shape == (rank, 5) and b.shape == (3, rank)  # A: (r, in), B: (out, r)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        b.copy_(torch.randn(b.shape, generator=gen))
    x = torch.randn(4, 5, generator=gen)
    expected = x @ weight.T + bias + (alpha / rank) * (x @ a.detach().T @ b.detach().T)  # (4, 3)
    with host.active("train_0") as adapted, torch.no_grad():
        torch.testing.assert_close(adapted(x), expected, atol=1e-5, rtol=1e-5)
    with host.active(None) as bare, torch.no_grad():
        torch.testing.assert_close(bare(x), x @ weight.T + bias, atol=1e-5, rtol=1e-5)


def test_fused_forward_and_its_gradients_are_the_lora_formulas_by_hand():
    """One addmm does the scale and the add (``fused_lora_forward``): its output and the gradients of x, A and B
    against y = W x + b + s B A x by hand, on batched (2, 4, in) inputs, and equal to peft's own forward."""
    model = OneLayer().requires_grad_(False)
    weight, bias = model.q_proj.weight.clone(), model.q_proj.bias.clone()
    host = AdapterHost(LoadedModel("one-layer", model, None))
    host.add("train_0", LoraSpec(rank=2, alpha=6, train_mlp=False, train_unembed=False), seed=0)
    layer = host.peft.base_model.model.q_proj
    assert isinstance(layer.forward, functools.partial) and layer.forward.func is fused_lora_forward
    params = host.parameters("train_0")
    a = next(p for k, p in params.items() if "lora_A" in k)
    b = next(p for k, p in params.items() if "lora_B" in k)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        b.copy_(torch.randn(b.shape, generator=gen))
    x = torch.randn(2, 4, 5, generator=gen, requires_grad=True)
    g = torch.randn(2, 4, 3, generator=gen)  # d loss / d y
    s = 6 / 2
    with host.active("train_0") as adapted:
        y = adapted(x)
        (y * g).sum().backward()
    ad, bd, xd = a.detach(), b.detach(), x.detach()
    torch.testing.assert_close(y.detach(), xd @ weight.T + bias + s * (xd @ ad.T @ bd.T), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x.grad, g @ weight + s * (g @ bd @ ad), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.grad, s * (g.reshape(-1, 3).T @ (xd.reshape(-1, 5) @ ad.T)), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.grad, s * ((g @ bd).reshape(-1, 2).T @ xd.reshape(-1, 5)), atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(y.detach(), LoraLinear.forward(layer, xd), atol=1e-6, rtol=1e-6)


def test_a_model_without_the_adapted_modules_is_refused_by_name():
    host = AdapterHost(LoadedModel("one-layer", OneLayer().requires_grad_(False), None))
    message = r"'one-layer' has none of the modules \['mlp'\] adapts \(\['gate_proj'"
    with pytest.raises(ConfigurationError, match=message):
        host.add("train_0", LoraSpec(train_attn=False, train_unembed=False), seed=0)


# -- one adapter on the tiny model ------------------------------------------------------------------------------------


def test_a_new_adapter_starts_as_a_no_op(host):
    host.add("train_noop", LoraSpec(rank=4), seed=3)
    params = host.parameters("train_noop")
    assert all(not p.any() for k, p in params.items() if "lora_B" in k)  # B = 0 ...
    assert all(p.abs().sum() > 0 for k, p in params.items() if "lora_A" in k)  # ... A random, so B gets gradient
    assert torch.equal(logits(host, "train_noop"), logits(host, None))
    pristine = load_base_model("tiny").model.eval()  # the same weights, never wrapped or packed
    with torch.no_grad():
        torch.testing.assert_close(logits(host, "train_noop"), pristine(input_ids=IDS).logits, atol=1e-4, rtol=0)


def test_a_matrices_are_drawn_from_the_seed_without_touching_the_global_generator(host):
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    host.add("train_seed_a", LoraSpec(rank=4), seed=7)
    host.add("train_seed_b", LoraSpec(rank=4), seed=7)
    host.add("train_seed_c", LoraSpec(rank=4), seed=8)
    assert torch.equal(torch.rand(3), expected_next)
    a, b, c = (values(host, n) for n in ("train_seed_a", "train_seed_b", "train_seed_c"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not any(torch.equal(a[k], c[k]) for k in a if "lora_A" in k)


@pytest.mark.parametrize(
    ("spec", "modules"),
    [
        # As LoraSpec's fields say: attention projections (q, k, v, o), MLP projections (gate, up, down), lm_head.
        (LoraSpec(rank=2, train_mlp=False, train_unembed=False), ("q_proj", "k_proj", "v_proj", "o_proj")),
        (LoraSpec(rank=2, train_attn=False, train_unembed=False), ("gate_proj", "up_proj", "down_proj")),
        (LoraSpec(rank=2, train_attn=False, train_mlp=False), ("lm_head",)),
    ],
    ids=["attn", "mlp", "unembed"],
)
def test_parameters_are_an_a_and_b_for_each_adapted_module_in_sorted_order(host, spec, modules):
    name = "train_targets_" + "_".join(modules)
    host.add(name, spec, seed=0)
    params = host.parameters(name)
    assert list(params) == sorted(params)
    per_layer = 1 if modules == ("lm_head",) else LAYERS
    assert len(params) == 2 * len(modules) * per_layer
    assert {k.split(".lora_")[0].rsplit(".", 1)[-1] for k in params} == set(modules)
    base = dict(host.base.model.named_modules())
    for key, p in params.items():
        layer = base[key.split(".lora_")[0].removeprefix("base_model.model.")].base_layer
        if ".lora_A." in key:
            assert p.shape == (2, layer.in_features)
        else:
            assert p.shape == (layer.out_features, 2)


# -- several adapters on one base -------------------------------------------------------------------------------------


def test_only_the_active_adapters_lora_weights_train(host):
    host.add("train_grad_a", LoraSpec(rank=4), seed=1)
    host.add("train_grad_b", LoraSpec(rank=4), seed=2)
    for active, idle in (("train_grad_a", "train_grad_b"), ("train_grad_b", "train_grad_a")):
        for p in host.peft.parameters():
            p.grad = None
        with host.active(active) as model:
            trainable = {id(p) for p in model.parameters() if p.requires_grad}
            assert trainable == {id(p) for p in host.parameters(active).values()}
            model(input_ids=IDS).logits.logsumexp(-1).sum().backward()
        assert all(p.grad is not None for p in host.parameters(active).values())
        assert all(p.grad is None for p in host.parameters(idle).values())
        base = [p for k, p in host.peft.named_parameters() if "lora_" not in k]
        assert base and all(not p.requires_grad and p.grad is None for p in base)  # the base never trains


def test_switching_adapters_switches_outputs_and_leaves_the_others_alone(host):
    host.add("train_sw_a", LoraSpec(rank=4), seed=1)
    host.add("train_sw_b", LoraSpec(rank=4), seed=2)
    base = logits(host, None)
    perturb(host, "train_sw_a", seed=0)
    out_a = logits(host, "train_sw_a")
    assert (out_a - base).abs().max() > 1e-3
    assert torch.equal(logits(host, "train_sw_b"), base)  # b still a no-op: a's weights are a's alone
    perturb(host, "train_sw_b", seed=1)
    out_b = logits(host, "train_sw_b")
    assert (out_b - out_a).abs().max() > 1e-3
    assert torch.equal(logits(host, "train_sw_a"), out_a)  # back to a: exactly a's outputs again
    assert torch.equal(logits(host, None), base)


def adapter_state(host: AdapterHost) -> tuple:
    """Which parameters train and which adapter each adapted layer (and the wrappers) call active."""
    grads = {name: p.requires_grad for name, p in host.peft.named_parameters()}
    active = {name: list(m.active_adapters) for name, m in host.peft.named_modules() if hasattr(m, "lora_A")}
    return grads, active, host.peft.active_adapter, host.peft.base_model.active_adapter


def test_every_switch_leaves_what_pefts_own_set_adapter_leaves(host):
    """The host switches adapters without peft's walk of every module; after each switch (the first after an
    adapter is added, and the quick ones after it, among five adapters and a deletion), the trainable parameters and
    each layer's active adapter are what peft's ``set_adapter`` to the same adapter then leaves."""
    names = [f"train_walk_{i}" for i in range(4)]
    for i, name in enumerate(names):
        host.add(name, LoraSpec(rank=2 + i % 2), seed=i)
    snapshot = host.copy(names[0], "sampler_walk")
    order = [names[1], names[2], snapshot, names[0], names[3], names[1], snapshot, names[2]]
    for step, name in enumerate(order):
        if step == 5:
            host.delete(names[3])
        logits(host, name)
        switched = adapter_state(host)
        assert switched[2] == name
        host.peft.set_adapter(name)
        assert adapter_state(host) == switched, (step, name)


def test_a_snapshot_copies_the_weights_and_stays_put_when_the_source_trains(host):
    host.add("train_src", LoraSpec(rank=4), seed=4)
    perturb(host, "train_src", seed=2)
    before = logits(host, "train_src")
    snap = host.copy("train_src", "sampler_snap")
    assert snap == "sampler_snap" and host.specs[snap] == host.specs["train_src"]
    assert values(host, snap).keys() == values(host, "train_src").keys()
    assert all(torch.equal(v, values(host, "train_src")[k]) for k, v in values(host, snap).items())
    perturb(host, "train_src", seed=3)  # the source trains on
    assert not torch.equal(logits(host, "train_src"), before)
    assert torch.equal(logits(host, snap), before)


def test_retired_snapshots_are_reused_by_copy_with_fresh_values_then_deleted_past_the_limit(host):
    host.add("train_ret", LoraSpec(rank=2), seed=5)
    host.add("train_other_spec", LoraSpec(rank=3), seed=5)
    snaps = [host.copy("train_ret", f"sampler_ret_{i}") for i in range(MAX_RETIRED + 1)]
    other = host.copy("train_other_spec", "sampler_ret_other")
    for name in [other, *snaps]:
        host.retire(name)
    kept = [n for n in [other, *snaps] if n in host.specs]
    assert len(kept) == MAX_RETIRED  # the rest are gone from the model
    gone = [n for n in [other, *snaps] if n not in kept]
    assert all(not any(f".{n}." in k for k, _ in host.peft.named_parameters()) for n in gone)
    perturb(host, "train_ret", seed=4)
    reusable = [n for n in kept if host.specs[n] == host.specs["train_ret"]]
    reused = host.copy("train_ret", "sampler_ret_new")
    if reusable:  # a retired snapshot of the same spec is taken, and overwritten with the current weights
        assert reused in reusable
    assert all(torch.equal(v, values(host, "train_ret")[k]) for k, v in values(host, reused).items())
    assert torch.equal(logits(host, reused), logits(host, "train_ret"))


def test_deleting_the_active_adapter_moves_off_it(host):
    host.add("train_del", LoraSpec(rank=2), seed=6)
    logits(host, "train_del")  # make it the active one
    host.delete("train_del")
    assert "train_del" not in host.specs and host.peft.active_adapter != "train_del"
    assert torch.equal(logits(host, None), logits(host, None))  # still runs


def test_state_dict_is_a_clone_keyed_without_the_adapter_name_and_loads_into_another(host):
    host.add("train_sd_src", LoraSpec(rank=2), seed=7)
    host.add("train_sd_dst", LoraSpec(rank=2), seed=8)
    perturb(host, "train_sd_src", seed=5)
    state = host.state_dict("train_sd_src")
    assert state and not any("train_sd_src" in k for k in state)
    src = values(host, "train_sd_src")
    next(iter(state.values())).add_(1.0)  # changing the copy changes nothing in the model
    assert all(torch.equal(v, values(host, "train_sd_src")[k]) for k, v in src.items())
    host.load_state_dict("train_sd_dst", host.state_dict("train_sd_src"))
    assert torch.equal(logits(host, "train_sd_dst"), logits(host, "train_sd_src"))
    with pytest.raises(ConfigurationError, match=r"adapter weights have keys this model lacks, e.g. \['nope"):
        host.load_state_dict("train_sd_dst", {"nope.lora_A.weight": torch.zeros(2, 2)})


def test_model_is_the_bare_base_until_an_adapter_exists():
    host = AdapterHost(LoadedModel("one-layer", OneLayer().requires_grad_(False), None))
    assert host.model is host.base.model and host.peft is None
    with host.active(None) as model:
        assert model is host.base.model
    host.add("train_0", LoraSpec(rank=1, train_mlp=False, train_unembed=False), seed=0)
    assert host.model is host.peft
