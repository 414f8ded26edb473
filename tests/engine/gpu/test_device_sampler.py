"""The GPU paths' sampler, on the CPU: its counter-based random numbers, its vectorised token choice (the CPU
sampler's rule), and whole requests through an engine on the GPU paths: logprobs equal to the trainer's, seeds that
reproduce whatever else is batched, stops where they should be, finished rows leaving the batch."""

import pytest
import torch

import rlvr
from datums import rl_datum
from rlvr import types
from rlvr.engine import Engine
from rlvr.engine.device import GpuPaths
from rlvr.engine.gpu import device_sampler as ds
from rlvr.engine.gpu.decode import GpuDecoder
from rlvr.engine.sample.kv_cache import GrowingCache


def test_mul32_is_exact_multiplication_mod_2_to_the_32():
    g = torch.Generator().manual_seed(0)
    xs = torch.cat([torch.randint(0, 2**32, (1000,), generator=g), torch.tensor([0, 1, 2**32 - 1, 2**31])])
    for c in (0x85EBCA6B, 0xC2B2AE35, 1, 0xFFFFFFFF):
        assert ds._mul32(xs, c).tolist() == [(x * c) % 2**32 for x in xs.tolist()]


def test_uniforms_are_uniform_reproducible_and_depend_on_every_input():
    samples = torch.arange(20_000)
    seeds = torch.full_like(samples, 12345)
    u = ds.uniforms(seeds, samples, step=3)
    assert u.dtype == torch.float32 and float(u.min()) >= 0 and float(u.max()) < 1
    assert torch.equal(u, ds.uniforms(seeds, samples, step=3))
    # 20 bins of 1000 expected each: a binomial's standard deviation is ~31, so 150 is ~5 of them.
    counts = torch.histc(u, bins=20, min=0, max=1)
    assert (counts - 1000).abs().max() < 150, counts
    assert abs(float(u.mean()) - 0.5) < 0.01
    # consecutive steps and neighbouring samples are uncorrelated
    v = ds.uniforms(seeds, samples, step=4)
    assert abs(float(torch.corrcoef(torch.stack([u, v]))[0, 1])) < 0.03
    assert abs(float(torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1])) < 0.03
    for other in (ds.uniforms(seeds + 1, samples, 3), ds.uniforms(seeds + 2**40, samples, 3), v,
                  ds.uniforms(seeds, samples + 1, 3)):
        assert (other != u).float().mean() > 0.99
    zero = torch.zeros(1, dtype=torch.long)
    assert float(ds.uniforms(zero, zero, 0)) != 0.0  # no fixed point at all-zero inputs
    big = torch.tensor([-(2**63), 2**63 - 1])  # seeds over 2**63 arrive as negative int64 (``_signed``)
    assert ds._signed(2**64 - 1) == -1 and torch.isfinite(ds.uniforms(big, torch.zeros(2, dtype=torch.long), 0)).all()


@pytest.mark.parametrize("capacity", [0, 100])
def test_a_reserved_cache_holds_every_column_without_reallocating(capacity):
    cache = GrowingCache(capacity)
    written = [torch.randn(2, 1, 10, 4)] + [torch.randn(2, 1, 1, 4) for _ in range(80)]  # a prompt, then 80 steps
    cache.update(written[0], -written[0], 0)
    buffer = cache.layers[0]._keys_buffer.data_ptr()
    for column in written[1:]:
        keys, values = cache.update(column, -column, 0)
    torch.testing.assert_close(keys, torch.cat(written, dim=2), rtol=0, atol=0)
    torch.testing.assert_close(values, -keys, rtol=0, atol=0)
    # reserved for 100 columns: the buffer of the first write is the one still used; unreserved, it grew
    assert (cache.layers[0]._keys_buffer.data_ptr() == buffer) == (capacity == 100)


def _rows(temperature, top_k, top_p, n):
    return ds._Rows(index=torch.arange(n), seed=torch.zeros(n, dtype=torch.long), sample=torch.arange(n),
                    temperature=torch.full((n,), temperature), top_k=torch.full((n,), top_k),
                    top_p=torch.full((n,), top_p), max_tokens=torch.full((n,), 5),
                    stop_ids=torch.full((n, 1), -1), done=torch.zeros(n, dtype=torch.bool))


def test_draws_follow_the_distribution_at_each_temperature():
    # probs = softmax([0, 1, 2, 3] / T): at T = 1 [0.032, 0.087, 0.237, 0.644]; 20k draws land within 1.5 points.
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]]).expand(20_000, -1)
    for temperature in (1.0, 0.5):
        rows = _rows(temperature, 0, float("inf"), 20_000)
        chosen, logprobs = ds.choose(logits, rows, ds.uniforms(rows.seed, rows.sample, 0), 0, False)
        freq = torch.bincount(chosen, minlength=4).float() / len(chosen)
        torch.testing.assert_close(freq, torch.softmax(logits[0] / temperature, -1), atol=0.015, rtol=0)
        # the logprob is at temperature 1 whatever the temperature
        torch.testing.assert_close(logprobs, torch.log_softmax(logits[0], -1)[chosen])


def test_greedy_top_k_and_top_p_rows_follow_the_cpu_rule_side_by_side():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]]).expand(400, -1).contiguous()
    # rows 0-99 greedy, 100-199 top_k=1, 200-299 top_p=0.7 (probs ~ [0.03, 0.64, 0.09, 0.24]: keeps {1, 3}),
    # 300-399 top_k=2 (keeps {1, 3}) at temperature 2
    rows = _rows(1.0, 0, float("inf"), 400)
    rows.temperature[:100] = 0
    rows.top_k[100:200] = 1
    rows.top_p[200:300] = 0.7
    rows.top_k[300:], rows.temperature[300:] = 2, 2.0
    chosen, logprobs = ds.choose(logits, rows, ds.uniforms(rows.seed, rows.sample, 0), top_k_max=2, top_p_any=True)
    assert set(chosen[:200].tolist()) == {1}
    assert set(chosen[200:300].tolist()) == {1, 3}
    assert set(chosen[300:].tolist()) == {1, 3}
    torch.testing.assert_close(logprobs, torch.log_softmax(logits[0], -1)[chosen])


@pytest.fixture(scope="module")
def gpu_paths_client():
    """A tiny LoRA client on an engine taking the GPU paths on the CPU, trained a few steps (the adapter is not the
    identity); the host looks every 3 steps, so finishing, stop strings and compaction happen between looks."""
    engine = Engine(device="cpu", gpu_paths=GpuPaths(sync_every=3, row_tokens=64))
    tc = rlvr.ServiceClient(engine).create_lora_training_client(base_model="tiny", rank=8, seed=11)
    tokens = tc.get_tokenizer().encode("some text to move the adapter away from zero")
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    for _ in range(3):
        tc.forward_backward([datum], "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=1e-2))
    return tc


def _trainer_logprobs(tc, prompt, seq):
    out = tc.forward([rl_datum(prompt, seq.tokens, seq.logprobs, 0.0)], "importance_sampling").result()
    return out.loss_fn_outputs[0]["logprobs"].to_torch()[len(prompt) - 1:]


def test_batched_requests_agree_with_the_trainer_and_reproduce_alone(gpu_paths_client):
    tc = gpu_paths_client
    sampler = tc.save_weights_and_get_sampling_client()
    tok = tc.get_tokenizer()
    prompts = [tok.encode(text) for text in ("a", "a longer prompt", "mid size")]  # left-padded together
    params = [types.SamplingParams(max_tokens=14, temperature=t, top_k=k, top_p=p, seed=s, stop=[])
              for t, k, p, s in ((1.0, -1, 1.0, 1), (0.7, 20, 0.9, 2), (0.0, -1, 1.0, 3))]
    futures = [sampler.sample(types.ModelInput.from_ints(p), 3, sp) for p, sp in zip(prompts, params, strict=True)]
    batched = [f.result() for f in futures]
    for prompt, sp, result in zip(prompts, params, batched, strict=True):
        assert len({tuple(s.tokens) for s in result.sequences}) == (1 if sp.temperature == 0 else 3)
        for seq in result.sequences:
            assert len(seq.tokens) == len(seq.logprobs) == 14 and seq.stop_reason == "length"
            assert (_trainer_logprobs(tc, prompt, seq) - torch.tensor(seq.logprobs)).abs().max() < 1e-4
        alone = sampler.sample(types.ModelInput.from_ints(prompt), 3, sp).result()
        assert [s.tokens for s in alone.sequences] == [s.tokens for s in result.sequences]
    again = sampler.sample(types.ModelInput.from_ints(prompts[0]), 3, params[0].model_copy(update={"seed": 9}))
    assert [s.tokens for s in again.result().sequences] != [s.tokens for s in batched[0].sequences]


def test_greedy_matches_hugging_face_generate(gpu_paths_client):
    from rlvr.engine.models.tiny import build_tiny_model

    pristine = build_tiny_model()[0].eval()
    sampler = rlvr.ServiceClient(gpu_paths_client.engine).create_sampling_client(base_model="tiny")
    params = types.SamplingParams(max_tokens=12, temperature=0.0, stop=[])
    for prompt in ([1, 2, 3], [40, 50, 60, 70, 80, 90], [200]):
        seq = sampler.sample(types.ModelInput.from_ints(prompt), 1, params).result().sequences[0]
        with torch.inference_mode():
            out = pristine.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                                    dtype=torch.long), do_sample=False, max_new_tokens=12, pad_token_id=0,
                                    eos_token_id=None)
        assert seq.tokens == out[0, len(prompt):].tolist()


def test_stop_token_ids_and_strings_end_the_sequence_where_they_first_appear(gpu_paths_client):
    tc = gpu_paths_client
    sampler = tc.save_weights_and_get_sampling_client()
    tok = tc.get_tokenizer()
    prompt = types.ModelInput.from_ints([10, 11, 12])
    free = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=20, stop=[], seed=3)).result().sequences[0]
    stop_token = free.tokens[4]
    first = free.tokens.index(stop_token)
    seq = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=20, stop=[stop_token], seed=3)).result()
    assert seq.sequences[0].stop_reason == "stop" and seq.sequences[0].tokens == free.tokens[:first + 1]
    text = tok.decode(free.tokens)
    for stop in (text[5:7], text[1:2]):  # ends after the first look (step 3), and before it
        seq = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=20, stop=[stop], seed=3)).result()
        seq = seq.sequences[0]
        assert seq.stop_reason == "stop" and stop in tok.decode(seq.tokens)
        assert stop not in tok.decode(seq.tokens[:-1]) and seq.tokens == free.tokens[:len(seq.tokens)]
    short = sampler.sample(prompt, 2, types.SamplingParams(max_tokens=4, stop=[], seed=3)).result().sequences
    assert all(len(s.tokens) == 4 and s.stop_reason == "length" for s in short)


def test_finished_rows_leave_the_batch(gpu_paths_client, monkeypatch):
    # Rows with max_tokens 2 have their tokens after two steps; the host's look after the third step drops them (half
    # the batch), so the forwards after it run the remaining rows only.
    sampler = gpu_paths_client.save_weights_and_get_sampling_client()
    model = gpu_paths_client._trainer.host.peft
    sizes = []
    real_forward = type(model).forward

    def spy(self, *args, **kwargs):
        sizes.append(kwargs["input_ids"].shape[0])
        return real_forward(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", spy)
    futures = [sampler.sample(types.ModelInput.from_ints([5, 6]), 4, types.SamplingParams(max_tokens=2, stop=[])),
               sampler.sample(types.ModelInput.from_ints([7, 8]), 4, types.SamplingParams(max_tokens=9, stop=[]))]
    assert [len(s.tokens) for f in futures for s in f.result().sequences] == [2] * 4 + [9] * 4
    assert sizes[0] == 2  # the two prompts prefilled once each
    assert sizes[1:] == [8, 8] + [4] * 6, sizes  # a forward after each of 8 draws (the 9th is the last)


def _trained_client(paths: GpuPaths):
    engine = Engine(device="cpu", gpu_paths=paths)
    tc = rlvr.ServiceClient(engine).create_lora_training_client(base_model="tiny", rank=8, seed=11)
    tokens = tc.get_tokenizer().encode("some text to move the adapter away from zero")
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    for _ in range(3):
        tc.forward_backward([datum], "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=1e-2))
    return tc


@pytest.mark.parametrize("paths", [GpuPaths(sync_every=3, row_tokens=64, graphs=True),
                                   GpuPaths(sync_every=3, row_tokens=64, decode_step="reference")],
                         ids=["fixed", "rlvr-decode-step"])
def test_fixed_steps_decode_as_the_eager_forward_does_through_padding_interleaving_and_compaction(paths, monkeypatch):
    # The fixed step (GpuPaths.graphs: what CUDA captures as a graph), and rlvr's own decode step on the reference
    # kernels (GpuPaths.decode_step), against the eager forward over the columns so far: prompts of three lengths
    # (left padding), one prompt queued apart from itself (rows of a prompt not side by side), and rows ending at 2,
    # 5 and 13 tokens, so finished rows leave the batch twice between looks (every 3 steps) and the step is rebuilt
    # (or its rows kept) for the rows left. Same tokens, the same logprobs, and those equal to the trainer's.
    clients = [_trained_client(p) for p in (paths, GpuPaths(sync_every=3, row_tokens=64, graphs=False))]
    own_steps = []  # rows of each step rlvr's decode step ran (none for the fixed step)
    real_step = GpuDecoder.step
    monkeypatch.setattr(GpuDecoder, "step", lambda self, tokens, positions: (
        own_steps.append(len(tokens)), real_step(self, tokens, positions))[1])
    prompts = [[5, 6, 7, 8, 9, 10, 11], [40, 41], [5, 6, 7, 8, 9, 10, 11], [90, 91, 92, 93]]
    lengths = [13, 2, 5, 13]
    results = []
    for tc in clients:
        sampler = tc.save_weights_and_get_sampling_client()
        futures = [sampler.sample(types.ModelInput.from_ints(p), 3, types.SamplingParams(
            max_tokens=n, temperature=1.0, stop=[], seed=i))
            for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))]
        results.append([f.result().sequences for f in futures])
    for prompt, n, fixed, eager in zip(prompts, lengths, *results, strict=True):
        for a, b in zip(fixed, eager, strict=True):
            assert a.tokens == b.tokens and len(a.tokens) == n
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
            assert (_trainer_logprobs(clients[0], prompt, a) - torch.tensor(a.logprobs)).abs().max() < 1e-4
    # rlvr's step ran each of the first batch's steps (12 rows; 3 leave at the look after step 3, 3 more after
    # step 6; the 13th draw needs no step), and nothing else did
    assert own_steps == ([12] * 2 + [9] * 3 + [6] * 7 if paths.decode_step != "hf" else [])


def test_a_watched_request_gets_its_tokens_at_each_look_and_a_cancel_ends_its_rows(gpu_paths_client):
    from rlvr.engine.sample.watch import Watch

    sampler = rlvr.ServiceClient(gpu_paths_client.engine).create_sampling_client(base_model="tiny")
    prompt, params = types.ModelInput.from_ints([5, 6, 7]), types.SamplingParams(max_tokens=10, stop=[], seed=4)
    looks: list = []
    response = sampler.sample_watched(Watch(looks.append), prompt, 2, params).result()
    assert [s.tokens for s in response.sequences] == [s.tokens for s in sampler.sample(prompt, 2, params).result(
        ).sequences]
    assert [len(look) for look in looks] == [6, 6, 6, 2]  # 2 rows x 3 steps per look (sync_every=3), then the last
    for j, seq in enumerate(response.sequences):
        assert [(t, lp) for look in looks for k, t, lp in look if k == j] == list(zip(seq.tokens, seq.logprobs,
                                                                                        strict=True))

    def cancel_at_first_look(drawn):
        watch.cancel()

    watch = Watch(cancel_at_first_look)
    cut = sampler.sample_watched(watch, prompt, 2, params).result()
    assert [len(s.tokens) for s in cut.sequences] == [3, 3] and {s.stop_reason for s in cut.sequences} == {"length"}


def test_a_decode_step_that_cannot_take_the_model_falls_back_with_a_warning():
    pytest.importorskip("triton", reason="the Triton decode step needs triton")
    tc = _trained_client(GpuPaths(sync_every=3, row_tokens=64, decode_step="triton"))  # tiny: heads of 24
    sampler = tc.save_weights_and_get_sampling_client()
    with pytest.warns(RuntimeWarning, match="decode_step='triton' does not support this model"):
        seq = sampler.sample(types.ModelInput.from_ints([5, 6]), 1, types.SamplingParams(max_tokens=3, stop=[]))
        assert len(seq.result().sequences[0].tokens) == 3


def test_triton_kernels_compiled_for_cuda_are_refused_on_the_cpu(monkeypatch):
    pytest.importorskip("triton", reason="the Triton decode step needs triton")
    from rlvr.engine.gpu import kernels

    monkeypatch.setattr(kernels, "triton_interpreted", lambda: False)  # as in a process without TRITON_INTERPRET
    with pytest.raises(ValueError, match="decode_step='triton' on cpu.*use decode_step='reference'"):
        ds._own_decoder(torch.nn.Linear(1, 1), "triton", torch.device("cpu"))
