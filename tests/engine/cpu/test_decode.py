"""LlamaDecoder: its decode steps give the model's own logits (plain forward over the whole sequence, no cache),
for Llama, Qwen2 (q/k/v biases) and Qwen3 (q/k norms), with and without LoRA, packed or not, through lazy row
dropping, with PyTorch's attention ops and with the fused kernel; unsupported models fall back; draw() samples the
distribution it is given."""

import copy
import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlvr import types
from rlvr.engine.cpu import decode, fma_linear, fused_attention
from rlvr.engine.cpu.decode import LlamaDecoder
from rlvr.engine.models.load import LoadedModel, load_base_model
from rlvr.engine.models.lora import AdapterHost, LoraSpec
from rlvr.engine.models.random_models import small_config
from rlvr.engine.sample.sampler import SampleJob, draw, prefill_each, resolve_params, sample_batch


def tiny_with_head_size_16():
    """tiny with 6 query heads of 16 over 2 key/value heads (tiny's own heads are 24 wide, which the fused attention
    kernel does not take): the shape of SmolLM2's attention, 3 query heads per key/value head."""
    tiny = load_base_model("tiny")
    config = copy.deepcopy(tiny.model.config)
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 6, 2, 16
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = type(tiny.model)(config).eval().requires_grad_(False)
    return dataclasses.replace(tiny, model=model)


def small(architecture: str) -> LoadedModel:
    """A two-layer random model of ``architecture`` (heads of 16, two query heads per key/value head) in tiny's
    place: tiny's tokenizer, the same vocabulary."""
    tiny = load_base_model("tiny")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        config = small_config(architecture)
        model = AutoModelForCausalLM.from_config(config).eval().requires_grad_(False)
    return dataclasses.replace(tiny, model=model)


def tuned_host(model: LoadedModel) -> AdapterHost:
    """``model`` with a LoRA adapter "tuned" whose B matrices are not zero, so the adapter changes every projection."""
    host = AdapterHost(model)
    host.add("tuned", LoraSpec(rank=4), seed=0)
    with torch.no_grad():
        for name, param in host.parameters("tuned").items():
            if "lora_B" in name:
                param.normal_(0, 0.05, generator=torch.Generator().manual_seed(hash(name) % 2**31))
    return host


@pytest.fixture(autouse=True)
def attention_path(request, monkeypatch):
    """With the "tiny" host, the decoder attends with PyTorch's ops (the fused kernel would take tiny's heads too),
    so that both attention paths are tested."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("host") == "tiny":
        monkeypatch.setattr(fused_attention, "supports", lambda *args: False)


@pytest.fixture(scope="module", params=["tiny", "fused"])
def host(request):
    """tiny with a LoRA adapter whose B matrices are not zero, decoded with PyTorch's attention ops
    (``attention_path``); "fused": the same on heads of 16, where the decoder attends with the fused kernel (skipped
    where it cannot run)."""
    if request.param == "fused":
        if not fused_attention.buildable():
            pytest.skip("the fused attention kernel cannot run here (no AVX-512 or AVX2, or no C compiler)")
        assert fused_attention.kernel() is not None  # built, and it agreed with PyTorch on its self-check
    return tuned_host(load_base_model("tiny") if request.param == "tiny" else tiny_with_head_size_16())


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def qwen_host(request):
    """Small random Qwen2 (q/k/v biases) and Qwen3 (q/k norms) models with a tuned adapter: the decode step's
    architecture-specific parts (the layout logic is the same for all and checked on tiny)."""
    model = small(request.param)
    assert type(model.model).__name__ == {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[request.param]
    return tuned_host(model)

def reference_logits(model, sequence: list[int]) -> torch.Tensor:
    """The model's next-token logits after ``sequence``: one forward over all of it, no cache, no padding."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([sequence])).logits[0, -1].float()


def decode_against_the_model(model, decoder, prompts, rows, keeps: dict[int, list[int]], seed: int) -> None:
    """Six decode steps of random tokens, each step's logits checked against a plain forward over every live row's
    sequence; after step ``i`` in ``keeps`` only those rows go on."""
    # float32 rounding; the AMX kernel's products round ~15x more (a wrong product would be off by ~0.1)
    atol = 3e-4 if decoder.head.pack_kind == "bf16x3" else 2e-5
    sequences = [list(prompts[r]) for r in rows.tolist()]
    live = list(range(len(sequences)))
    gen = torch.Generator().manual_seed(seed)
    for step in range(6):
        tokens = torch.randint(1, 200, (len(live),), generator=gen)
        positions = torch.tensor([len(sequences[r]) for r in live])
        for r, t in zip(live, tokens.tolist(), strict=True):
            sequences[r].append(t)
        logits = decoder.step(tokens, positions)
        expected = torch.stack([reference_logits(model, sequences[r]) for r in live])
        torch.testing.assert_close(logits, expected, atol=atol, rtol=1e-4)
        if step in keeps:
            decoder.keep(torch.tensor(keeps[step]))
            live = [live[i] for i in keeps[step]]


@pytest.mark.parametrize("adapter", [None, "tuned"])
@pytest.mark.parametrize("packed", ["", "mkldnn", "fma", "bf16x3"])
def test_qwen_steps_give_the_models_logits(qwen_host, adapter, packed, monkeypatch):
    test_steps_give_the_models_logits(qwen_host, adapter, packed, monkeypatch)


@pytest.mark.parametrize("adapter", [None, "tuned"])
@pytest.mark.parametrize("packed", ["", "mkldnn", "mkl", "fma", "bf16x3"])
def test_steps_give_the_models_logits(host, adapter, packed, monkeypatch):
    if packed and packed not in decode.pack_kinds():
        pytest.skip(f"this torch has no {packed} packed matmul")
    monkeypatch.setattr(decode, "fastest_kind", lambda use, weight, rows: packed)  # each kernel, whatever is fastest
    monkeypatch.setattr(decode, "_PACKS", decode.weakref.WeakKeyDictionary())
    prompts = [[5, 6, 7, 8, 9], [20, 21], [30, 31, 32]]
    rows = torch.tensor([0, 0, 1, 2, 2, 2])  # prompts repeated per sample, as the sampler lays them out
    with host.active(adapter) as model:
        decoder = LlamaDecoder.build(model)
        assert decoder is not None
        assert (decoder.fused is not None) == (model.config.head_dim == 16 and fused_attention.buildable())
        cache, mask, _ = prefill_each(model, prompts)
        decoder.start(cache, mask, rows, capacity=mask.shape[1] + 6)
        assert (decoder.head.packed is not None) == bool(packed)
        # rows finish: first lazily (slots kept), then enough of them to compact
        decode_against_the_model(model, decoder, prompts, rows, {1: [0, 2, 4], 3: [1, 2]}, seed=0)
        assert decoder.keys[0].shape[0] == 2  # compacted to the two live rows (oneDNN's pack still serves them)


PROMPTS = [[5, 6, 7, 8, 9], [20, 21], [30, 31, 32]]


def started_decoder(model, rows: torch.Tensor) -> LlamaDecoder:
    """A decoder over ``model`` started on ``PROMPTS`` prefilled, ``rows`` naming each row's prompt, with room for
    6 new tokens."""
    decoder = LlamaDecoder.build(model)
    cache, mask, _ = prefill_each(model, PROMPTS[: int(rows.max()) + 1])
    decoder.start(cache, mask, rows, capacity=mask.shape[1] + 6)
    return decoder


@pytest.mark.parametrize(("rows", "sizes", "keeps"), [
    ([0, 0, 0, 1, 1, 1], [3, 2, 1], [[0, 1, 3, 4], [0, 2, 3]]),  # equal groups; rows of both prompts finish
    ([0, 0, 0, 0, 1, 1, 1, 1, 2, 2], [2, 1], [[0, 1, 2, 4, 5, 6, 7]]),  # groups of 4, 4, 2 in chunks of 2
    ([0, 0, 0, 0, 0, 1, 1, 1], [3, 2, 3], [[0, 1, 2, 3, 5, 6], [0, 1, 2, 5]]),  # 5 + 3 rows: idle slots
])
def test_chunked_prompts_give_the_models_logits(host, rows, sizes, keeps, monkeypatch):
    # Rows of one prompt share its keys and values in chunks; every layout (chunk sizes forced: one per layout,
    # at the start and at each compaction) must give each row the logits of a plain forward over its sequence,
    # also after rows finish and their generated columns move to new slots.
    chosen = iter(sizes)
    monkeypatch.setattr(decode, "chunk_size", lambda counts, *_: min(next(chosen), max(counts)))
    rows = torch.tensor(rows)
    with host.active("tuned") as model:
        decoder = started_decoder(model, rows)
        assert decoder.chunk == sizes[0] > 1
        assert len(decoder.prompt_keys[0]) == decoder.keys[0].shape[0] // sizes[0]  # the prompt once per chunk
        decode_against_the_model(model, decoder, PROMPTS, rows, dict(enumerate(keeps)), seed=1)
        assert next(chosen, None) is None  # every layout was used: each keep compacted


def test_chunk_size_minimises_the_step_cost():
    # cost(size) = chunks * size * (slot_cost + generated) + chunks * prompt_width, by hand:
    assert decode.chunk_size([8, 8], slot_cost=300, generated=0, prompt_width=50) == 8  # no idle slot: share all
    # [5, 3]: size 5 -> 2 chunks, 10 slots: 10 * 300 + 2 * 50 = 3100; 4 -> 3 chunks, 12 slots: 3750; 3 -> 3 chunks,
    # 9 slots: 2850; 2 -> 5 chunks, 10 slots: 3250; 1 -> 8 chunks, 8 slots: 2400 + 400 = 2800, the cheapest
    assert decode.chunk_size([5, 3], slot_cost=300, generated=0, prompt_width=50) == 1
    # a long prompt pays for an idle slot: size 5 -> 10 * 300 + 2 * 2000 = 7000, size 4 -> 12 * 300 + 3 * 2000
    # = 9600, size 3 -> 9 * 300 + 3 * 2000 = 8700, size 2 -> 8 * 300 + 4 * 2000 = 10400, size 1 -> 18400
    assert decode.chunk_size([5, 3], slot_cost=300, generated=0, prompt_width=2000) == 5
    assert decode.chunk_size([1, 1, 1], slot_cost=300, generated=10, prompt_width=50) == 1


def test_adapter_changes_the_logits(host):
    # Guards the test above: with a zero or ignored adapter both parametrizations would pass on the same numbers.
    prompts = [[5, 6, 7]]
    out = []
    for adapter in (None, "tuned"):
        with host.active(adapter) as model:
            decoder = LlamaDecoder.build(model)
            cache, mask, _ = prefill_each(model, prompts)
            decoder.start(cache, mask, torch.tensor([0]), capacity=8)
            out.append(decoder.step(torch.tensor([9]), torch.tensor([3])))
    assert (out[0] - out[1]).abs().max() > 1e-3


@pytest.mark.parametrize("kind", ["fma", "mkldnn", ""])
def test_each_adapter_kernel_gives_the_models_logits(host, kind, monkeypatch):
    # The adapters' products run on the FMA kernel, else on oneDNN's, else on F.linear (``adapter_kind``): each
    # machine takes one, so each is checked here on whichever this machine has.
    if (kind == "fma" and fma_linear.kernel() is None) or (kind == "mkldnn" and "mkldnn" not in decode.pack_kinds()):
        pytest.skip(f"no {kind} kernel here")
    monkeypatch.setattr(decode, "adapter_kind", lambda: kind)
    with host.active("tuned") as model:
        decoder = started_decoder(model, torch.tensor([0, 0, 1, 2]))
        assert all(a.kind == kind for p in decoder.projections for a in p.adapters)
        decode_against_the_model(model, decoder, PROMPTS, torch.tensor([0, 0, 1, 2]), {2: [0, 3]}, seed=5)


def test_adapter_packs_are_kept_until_the_adapter_changes_in_place_or_is_replaced():
    # A decoder is built for every sampling batch; its oneDNN packs of the LoRA weights are kept between builds, and
    # must be made anew when the weights change (an optimizer step or a state load changes them in place; a weight
    # may also be replaced by another tensor), or the sampler would decode with the old adapter.
    if not decode.adapter_kind():
        pytest.skip("this torch has no oneDNN matmul: adapters are not packed")
    host = tuned_host(load_base_model("tiny"))

    def logits_and_pack(model):
        decoder = started_decoder(model, torch.tensor([0]))
        step = decoder.step(torch.tensor([9]), torch.tensor([len(PROMPTS[0])]))
        torch.testing.assert_close(step[0], reference_logits(model, [*PROMPTS[0], 9]), atol=3e-4, rtol=1e-4)
        return step, decoder.layers[0].qkv.adapters[0].a

    with host.active("tuned") as model:
        first, pack = logits_and_pack(model)
        again, kept = logits_and_pack(model)
        assert kept is pack and torch.equal(again, first)  # unchanged weights: the pack is reused
        lora_a = model.base_model.model.model.layers[0].self_attn.q_proj.lora_A["tuned"]
        with torch.no_grad():
            lora_a.weight.mul_(3.0)  # in place, as an optimizer step
        stepped, pack = logits_and_pack(model)
        assert pack is not kept and (stepped - first).abs().max() > 1e-3
        host.load_state_dict("tuned", {k: v.clone() * 0.5 for k, v in host.state_dict("tuned").items()})
        loaded, _ = logits_and_pack(model)
        assert (loaded - stepped).abs().max() > 1e-3
        lora_a.weight = torch.nn.Parameter(lora_a.weight.detach() * 2.0)  # another tensor in its place
        replaced, _ = logits_and_pack(model)
        assert (replaced - loaded).abs().max() > 1e-3


@pytest.mark.parametrize(("targets", "groups"), [(["q_proj", "v_proj", "up_proj"], 2),
                                                (["k_proj", "gate_proj", "o_proj"], 3)])
def test_an_adapter_on_some_projections_of_a_group_gives_the_models_logits(targets, groups):
    # The B matrices of projections sharing an input (q, k, v; gate, up) multiply as one block-diagonal matrix; an
    # adapter that leaves some of them out (a peft adapter trained elsewhere) leaves zeros in their columns.
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(load_base_model("tiny").model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    model.eval()
    decoder = started_decoder(model, torch.tensor([0, 1, 1, 2]))
    assert sum(len(p.adapters) for p in decoder.projections) == groups * len(decoder.layers)
    decode_against_the_model(model, decoder, PROMPTS, torch.tensor([0, 1, 1, 2]), {}, seed=3)


def test_other_architectures_fall_back_to_hugging_face():
    # sliding-window layers (Qwen2 with use_sliding_window): not this decoder's attention
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         use_sliding_window=True, sliding_window=4, max_window_layers=0)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    assert LlamaDecoder.build(model) is None
    params = types.SamplingParams(max_tokens=6, temperature=0.0, stop=[])
    jobs = [SampleJob([1, 2, 3], 2, resolve_params(params, 3, 64, [0]), torch.Generator().manual_seed(0))]
    result = sample_batch(model, jobs, lambda ids: str(ids), pad_id=0)
    with torch.inference_mode():
        expected = model.generate(input_ids=torch.tensor([[1, 2, 3]]), do_sample=False, max_new_tokens=6,
                                  min_new_tokens=6, pad_token_id=0)[0, 3:].tolist()
    assert [s.tokens for s in result[0]] == [expected, expected]


def test_fast_and_hugging_face_decoding_agree(host, monkeypatch):
    # float32 products on both sides: the same uniforms then draw the same tokens. (The AMX kernel's products move
    # logits by ~1e-4, enough for a temperature-1 draw near a boundary to land on the next token; its logits are
    # checked against the model's forward in test_steps_give_the_models_logits.)
    monkeypatch.setattr(decode, "fastest_kind", lambda use, weight, rows: "")
    monkeypatch.setattr(decode, "_PACKS", decode.weakref.WeakKeyDictionary())
    params = types.SamplingParams(max_tokens=10, temperature=1.0, stop=[])
    with host.active("tuned") as model:
        results = []
        for fast in (True, False):
            jobs = [SampleJob(p, 3, resolve_params(params, len(p), 128, [0]), torch.Generator().manual_seed(i))
                    for i, p in enumerate([[5, 6, 7, 8], [40, 41]])]
            results.append(sample_batch(model, jobs, lambda ids: str(ids), pad_id=0, fast=fast))
    for fast_job, hf_job in zip(*results, strict=True):
        for a, b in zip(fast_job, hf_job, strict=True):
            assert a.tokens == b.tokens
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


@pytest.mark.parametrize("vocab", [4, 1000, 512])
def test_draw_follows_the_weights_and_never_picks_a_zero(vocab):
    # Unnormalised weights with zeros in them, over vocabularies smaller than, not a multiple of, and a multiple
    # of the block: 40k draws land within 1 point of weight / sum, and no zero-weight entry is ever drawn.
    gen = torch.Generator().manual_seed(0)
    weights = torch.rand(vocab, generator=gen) ** 4
    weights[torch.randperm(vocab, generator=gen)[: vocab // 2]] = 0
    weights[-1] = 3.0  # mass in the last block too
    drawn = draw(weights.expand(40_000, -1), gen)
    freq = torch.bincount(drawn, minlength=vocab).float() / len(drawn)
    assert freq[weights == 0].sum() == 0
    torch.testing.assert_close(freq, weights / weights.sum(), atol=0.01, rtol=0)


@pytest.mark.parametrize("rows", [[0, 1, 0, 1, 0, 1], [2, 0, 1, 0, 2, 2]])
def test_rows_of_interleaved_prompts_decode_their_own_prompt(host, rows):
    # Requests queued one by one (an OpenAI endpoint's, say) put rows of one prompt apart: the decoder lays them out
    # by prompt, and each row must still get the logits of its own sequence, all slots full or not.
    rows = torch.tensor(rows)
    with host.active("tuned") as model:
        decode_against_the_model(model, started_decoder(model, rows), PROMPTS, rows, {1: [0, 1, 3, 4, 5], 3: [1, 2]},
                                 seed=2)
