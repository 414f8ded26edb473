"""SamplingClient: logprobs agree with the trainer's, seeds reproduce, stops stop where they should."""

import pytest
import torch

import rlvr
from datums import rl_datum
from rlvr import types
from rlvr.engine.sample.sampler import DecodeSettings, choose_tokens
from rlvr.errors import ConfigurationError, SamplingError


def trainer_logprobs(tc, prompt, seq):
    datum = rl_datum(prompt, seq.tokens, seq.logprobs, 0.0)
    out = tc.forward([datum], "importance_sampling").result()
    return out.loss_fn_outputs[0]["logprobs"].to_torch()[len(prompt) - 1:]


@pytest.fixture(scope="module")
def trained(service):
    """A tiny LoRA client trained a few steps, so the adapter is not the identity."""
    tc = service.create_lora_training_client(base_model="tiny", rank=8, seed=11)
    tokens = tc.get_tokenizer().encode("some text to move the adapter away from zero")
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    for _ in range(3):
        tc.forward_backward([datum], "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=1e-2))
    return tc


def test_sampler_and_trainer_agree_on_sampled_tokens(trained):
    sampler = trained.save_weights_and_get_sampling_client()
    prompt = trained.get_tokenizer().encode("Hello")
    result = sampler.sample(types.ModelInput.from_ints(prompt), 8,
                            types.SamplingParams(max_tokens=24, temperature=1.0, seed=0)).result()
    diffs = []
    for seq in result.sequences:
        assert len(seq.tokens) == len(seq.logprobs) > 0
        diffs.append((trainer_logprobs(trained, prompt, seq) - torch.tensor(seq.logprobs)).abs())
    mean_abs = torch.cat(diffs).mean().item()
    assert mean_abs < 1e-3, mean_abs


def test_logprobs_are_temperature_one_whatever_the_temperature(trained):
    # The documented distribution: log p at temperature 1, so they still match the trainer at temperature 0.5.
    sampler = trained.save_weights_and_get_sampling_client()
    prompt = trained.get_tokenizer().encode("Hi")
    seq = sampler.sample(types.ModelInput.from_ints(prompt), 1,
                         types.SamplingParams(max_tokens=16, temperature=0.5, seed=1)).result().sequences[0]
    assert (trainer_logprobs(trained, prompt, seq) - torch.tensor(seq.logprobs)).abs().max() < 1e-3


def test_snapshot_is_frozen_while_training_goes_on(service):
    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=12)
    prompt = types.ModelInput.from_ints(tc.get_tokenizer().encode("frozen?"))
    sampler = tc.save_weights_and_get_sampling_client()
    before = sampler.compute_logprobs(prompt).result()
    tokens = prompt.to_ints()
    tc.forward_backward([types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                                     loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 6})],
                        "cross_entropy")
    tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    assert sampler.compute_logprobs(prompt).result() == before
    assert tc.save_weights_and_get_sampling_client().compute_logprobs(prompt).result() != before


def test_released_snapshots_are_reused_with_the_new_weights(service):
    """A publication reuses a released snapshot's adapter: it must hold the current weights, and the number of
    adapters on the base model stays bounded however many times the loop publishes."""
    import gc

    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=13)
    tokens = tc.get_tokenizer().encode("reuse me")
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    host = tc._trainer.host
    counts = []
    for _ in range(6):
        sampler = tc.save_weights_and_get_sampling_client()
        got = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()[1:]
        want = tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-5
        del sampler
        gc.collect()
        tc.forward_backward([datum], "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()  # also waits for the queued release
        counts.append(len(host.specs))
    assert counts[-1] == counts[2], counts  # steady state: no adapter per publication


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_prompt_logprobs_equal_the_trainers_to_the_bit(precision):
    # compute_logprobs runs the trainer's own computation on the same shapes, so at equal weights the two agree
    # exactly in either precision (in bfloat16 any other path differs by rounding that grows through the layers):
    # the loop's sampler-freshness probe relies on it.
    from rlvr.engine import Engine
    from rlvr.engine.cpu.packed import bfloat16_supported

    if precision == "bfloat16" and not bfloat16_supported():
        pytest.skip("no oneDNN bfloat16 matmul on this CPU")
    service = rlvr.ServiceClient(Engine(precision=precision))
    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=3)
    tokens = tc.get_tokenizer().encode("the same tokens, twice")
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    tc.forward_backward([datum], "cross_entropy")
    tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    got = tc.save_weights_and_get_sampling_client().compute_logprobs(types.ModelInput.from_ints(tokens)).result()
    want = tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    assert got[1:] == want


def test_seeded_sampling_reproduces_and_seeds_differ(trained):
    sampler = trained.save_weights_and_get_sampling_client()
    prompt = types.ModelInput.from_ints(trained.get_tokenizer().encode("abc"))

    def draw(seed):
        params = types.SamplingParams(max_tokens=12, temperature=1.0, seed=seed)
        return [s.tokens for s in sampler.sample(prompt, 4, params).result().sequences]

    assert draw(5) == draw(5)
    assert draw(5) != draw(6)


def test_greedy_is_argmax_of_trainer_logits(trained):
    sampler = trained.save_weights_and_get_sampling_client()
    prompt = trained.get_tokenizer().encode("xyz")
    seqs = sampler.sample(types.ModelInput.from_ints(prompt), 3,
                          types.SamplingParams(max_tokens=10, temperature=0.0, stop=[])).result().sequences
    assert seqs[0].tokens == seqs[1].tokens == seqs[2].tokens
    # Each greedy token is the most likely one: no other token has a higher logprob.
    tokens = prompt + seqs[0].tokens
    full = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
    for i in range(len(seqs[0].tokens)):
        assert full[len(prompt) + i] == pytest.approx(seqs[0].logprobs[i], abs=1e-4)


def test_max_tokens_gives_length_stop(trained):
    sampler = trained.save_weights_and_get_sampling_client()
    seqs = sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 2,
                          types.SamplingParams(max_tokens=7, stop=[], seed=0)).result().sequences
    assert all(len(s.tokens) == 7 and s.stop_reason == "length" for s in seqs)


def test_stop_token_ids_end_the_sequence_on_that_token(trained):
    sampler = trained.save_weights_and_get_sampling_client()
    prompt = types.ModelInput.from_ints([10, 11, 12])
    free = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=20, stop=[], seed=3)).result().sequences[0]
    stop_token = free.tokens[4]
    first = free.tokens.index(stop_token)
    seq = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=20, stop=[stop_token], seed=3)).result()
    seq = seq.sequences[0]
    assert seq.stop_reason == "stop"
    assert seq.tokens == free.tokens[: first + 1]


def test_stop_strings_end_the_sequence_once_the_text_contains_them(trained):
    sampler = trained.save_weights_and_get_sampling_client()
    tok = trained.get_tokenizer()
    prompt = types.ModelInput.from_ints([10, 11, 12])
    free = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=20, stop=[], seed=4)).result().sequences[0]
    text = tok.decode(free.tokens)
    stop = text[5:7]
    seq = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=20, stop=[stop], seed=4)).result().sequences[0]
    assert seq.stop_reason == "stop"
    out = tok.decode(seq.tokens)
    assert out.endswith(stop) or stop in out
    assert stop not in tok.decode(seq.tokens[:-1])


def test_eos_stops_by_default(service):
    # Train the adapter to emit EOS right away, then sample with stop=None (implicit EOS) and stop=[] (disabled).
    tc = service.create_lora_training_client(base_model="tiny", rank=8, seed=13)
    eos = tc.get_tokenizer().eos_token_id
    prompt = [5, 6, 7]
    datum = types.Datum(model_input=types.ModelInput.from_ints(prompt),
                        loss_fn_inputs={"target_tokens": prompt[1:] + [eos], "weights": [0.0, 0.0, 1.0]})
    for _ in range(20):
        tc.forward_backward([datum], "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=3e-2))
    sampler = tc.save_weights_and_get_sampling_client()
    greedy = types.SamplingParams(max_tokens=5, temperature=0.0)
    seq = sampler.sample(types.ModelInput.from_ints(prompt), 1, greedy).result().sequences[0]
    assert seq.tokens == [eos] and seq.stop_reason == "stop"
    no_stop = types.SamplingParams(max_tokens=5, temperature=0.0, stop=[])
    assert len(sampler.sample(types.ModelInput.from_ints(prompt), 1, no_stop).result().sequences[0].tokens) == 5


def test_top_k_one_is_greedy_and_top_p_keeps_the_head():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    gen = torch.Generator().manual_seed(0)
    settings = DecodeSettings(5, 1.0, 1, 1.0, frozenset(), ())
    assert all(choose_tokens(logits, settings, gen).item() == 1 for _ in range(20))
    # probs ~ [0.03, 0.64, 0.09, 0.24]: top_p=0.7 keeps {1, 3} (mass before token 3 is 0.64 < 0.7)
    settings = DecodeSettings(5, 1.0, -1, 0.7, frozenset(), ())
    drawn = {choose_tokens(logits, settings, gen).item() for _ in range(200)}
    assert drawn == {1, 3}


def test_base_model_sampler_and_bad_requests(service):
    sampler = service.create_sampling_client(base_model="tiny")
    prompt = types.ModelInput.from_ints([1, 2])
    assert len(sampler.sample(prompt, 2, types.SamplingParams(max_tokens=3)).result().sequences) == 2
    with pytest.raises(SamplingError, match="num_samples"):
        sampler.sample(prompt, 0, types.SamplingParams(max_tokens=3)).result()
    with pytest.raises(ConfigurationError, match="top_p"):
        sampler.sample(prompt, 1, types.SamplingParams(max_tokens=3, top_p=0.0)).result()
    for temperature in (float("nan"), float("inf"), -0.5):
        with pytest.raises(ConfigurationError, match=f"temperature must be a finite number >= 0, got {temperature}"):
            sampler.sample(prompt, 1, types.SamplingParams(max_tokens=3, temperature=temperature)).result()
    vocab = len(sampler.get_tokenizer())  # the embedding rows of tiny: its tokenizer with the special tokens
    for never in (vocab, -1):
        with pytest.raises(ConfigurationError, match=f"stop has token id {never}, outside the vocabulary"):
            sampler.sample(prompt, 1, types.SamplingParams(max_tokens=3, stop=[5, never])).result()
    assert sampler.sample(prompt, 1, types.SamplingParams(max_tokens=3, stop=[vocab - 1])).result().sequences
    with pytest.raises(ValueError, match="outside the vocabulary"):
        sampler.sample(types.ModelInput.from_ints([10**6]), 1, types.SamplingParams(max_tokens=3)).result()
    with pytest.raises(SamplingError, match="model_path"):
        service.create_sampling_client()


@pytest.fixture(scope="module")
def pristine_tiny():
    """A separate copy of the tiny model that no adapter has ever touched: the reference for generate."""
    from rlvr.engine.models.tiny import build_tiny_model

    return build_tiny_model()[0].eval()


def hf_greedy(model, prompt, n):
    """Hugging Face generate's greedy tokens, one prompt, no padding."""
    with torch.inference_mode():
        out = model.generate(input_ids=torch.tensor([prompt]),
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             do_sample=False, max_new_tokens=n, pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


def test_greedy_matches_hugging_face_generate(service, pristine_tiny):
    sampler = service.create_sampling_client(base_model="tiny")
    prompts = [[1, 2, 3], [40, 50, 60, 70, 80, 90], [200]]
    params = types.SamplingParams(max_tokens=12, temperature=0.0, stop=[])
    # One request at a time: generate's computation up to the products' rounding (float32's, or the AMX kernel's,
    # which moves logits by up to ~1e-4; no two candidates here are that close), so exactly its tokens.
    for prompt in prompts:
        seq = sampler.sample(types.ModelInput.from_ints(prompt), 1, params).result().sequences[0]
        assert seq.tokens == hf_greedy(pristine_tiny, prompt, 12)


def test_batched_greedy_matches_generate_up_to_ties(service, pristine_tiny):
    # Batched and left-padded, a logit can change in its last bits; a token may then differ only where the two
    # candidates are tied (logprobs within 1e-4 of each other), after which the continuations diverge.
    sampler = service.create_sampling_client(base_model="tiny")
    prompts = [[1, 2, 3], [40, 50, 60, 70, 80, 90], [200]]
    params = types.SamplingParams(max_tokens=12, temperature=0.0, stop=[])
    futures = [sampler.sample(types.ModelInput.from_ints(p), 2, params) for p in prompts]
    for prompt, future in zip(prompts, futures, strict=True):
        expected = hf_greedy(pristine_tiny, prompt, 12)
        for seq in future.result().sequences:
            for i, (ours, theirs) in enumerate(zip(seq.tokens, expected, strict=True)):
                if ours != theirs:
                    context = types.ModelInput.from_ints(prompt + seq.tokens[:i] + [theirs])
                    their_logprob = sampler.compute_logprobs(context).result()[-1]
                    assert abs(seq.logprobs[i] - their_logprob) < 1e-4, (i, ours, theirs)
                    break


def test_batched_requests_agree_with_the_trainer_and_reproduce_alone(trained):
    sampler = trained.save_weights_and_get_sampling_client()
    tok = trained.get_tokenizer()
    prompts = [tok.encode(text) for text in ("a", "a longer prompt", "mid size")]
    params = [types.SamplingParams(max_tokens=10, temperature=t, seed=s) for t, s in ((1.0, 1), (0.7, 2), (1.0, 3))]
    futures = [sampler.sample(types.ModelInput.from_ints(p), 3, sp) for p, sp in zip(prompts, params, strict=True)]
    batched = [f.result() for f in futures]
    for prompt, sp, result in zip(prompts, params, batched, strict=True):
        for seq in result.sequences:
            diff = (trainer_logprobs(trained, prompt, seq) - torch.tensor(seq.logprobs)).abs().max().item()
            assert diff < 1e-3
        alone = sampler.sample(types.ModelInput.from_ints(prompt), 3, sp).result()
        assert [s.tokens for s in alone.sequences] == [s.tokens for s in result.sequences]


def test_many_requests_split_into_bounded_batches(service):
    import rlvr
    from rlvr.engine import Engine

    engine = Engine(max_sample_rows=4)
    sampler = rlvr.ServiceClient(engine).create_sampling_client(base_model="tiny")
    params = types.SamplingParams(max_tokens=3, seed=0)
    futures = [sampler.sample(types.ModelInput.from_ints([i + 1, i + 2]), 3, params) for i in range(5)]
    assert all(len(f.result().sequences) == 3 for f in futures)


def test_draws_follow_the_distribution():
    # probs = softmax([0, 1, 2, 3] / T) at T = 1: [0.032, 0.087, 0.237, 0.644]; 20k draws land within 1.5 points.
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]]).expand(20_000, -1)
    gen = torch.Generator().manual_seed(0)
    drawn = choose_tokens(logits, DecodeSettings(5, 1.0, -1, 1.0, frozenset(), ()), gen)
    freq = torch.bincount(drawn, minlength=4).float() / len(drawn)
    torch.testing.assert_close(freq, torch.softmax(logits[0], -1), atol=0.015, rtol=0)
    # At temperature 0.5 the distribution sharpens to softmax(2 * logits).
    drawn = choose_tokens(logits, DecodeSettings(5, 0.5, -1, 1.0, frozenset(), ()), gen)
    freq = torch.bincount(drawn, minlength=4).float() / len(drawn)
    torch.testing.assert_close(freq, torch.softmax(2 * logits[0], -1), atol=0.015, rtol=0)


def test_requests_submitted_back_to_back_decode_as_one_batch(monkeypatch):
    # The engine thread wakes on the first request; a loop of sample() calls that does some work between them
    # (rendering the next prompt, here 0.5 ms) must still become one batch. The window is widened from 2 ms to
    # 0.5 s so that a busy machine pausing the loop cannot split the batch (a 2 ms window did, in a full suite);
    # the window's own logic is tested on a fake clock in ``test_sample_queue.py``.
    import time

    import rlvr
    from rlvr.engine import Engine, sample_queue

    batches = []
    engine = Engine()
    real = engine._samples.sample_batch

    def spy(model, jobs, *args, **kwargs):
        batches.append(sum(job.num_samples for job in jobs))
        return real(model, jobs, *args, **kwargs)

    monkeypatch.setattr(engine._samples, "sample_batch", spy)
    sampler = rlvr.ServiceClient(engine).create_sampling_client(base_model="tiny")
    sampler.sample(types.ModelInput.from_ints([1]), 1, types.SamplingParams(max_tokens=1)).result()  # load
    batches.clear()
    monkeypatch.setattr(sample_queue, "SAMPLE_GATHER_S", 0.5)
    params = types.SamplingParams(max_tokens=3, seed=0)
    futures = []
    for i in range(8):
        futures.append(sampler.sample(types.ModelInput.from_ints([i + 1, i + 2]), 4, params))
        time.sleep(0.0005)
    assert all(len(f.result().sequences) == 4 for f in futures)
    assert batches == [32]


def test_a_unit_gives_the_same_logprobs_bit_for_bit_whatever_arrives_with_it(trained, monkeypatch):
    # Where the decode is not row by row (Hugging Face's forward, as for architectures other than Llama's), which
    # requests share a decode moves each one's logprobs in the last bits. Requests sent one by one join whatever
    # else is waiting; sent as a unit (sample_many, the loop's way) they decode alone, so a crowd of other requests
    # arriving with them changes nothing.
    import threading

    from rlvr.engine.cpu import decode

    monkeypatch.setattr(decode.LlamaDecoder, "build", classmethod(lambda cls, model: None))
    sampler = trained.save_weights_and_get_sampling_client()
    tok = trained.get_tokenizer()
    params = types.SamplingParams(max_tokens=12, temperature=1.0, seed=4)
    unit = [(types.ModelInput.from_ints(tok.encode(text)), 3, params) for text in ("a b", "the third one")]
    crowd = [types.ModelInput.from_ints(tok.encode(text * 9)) for text in ("xyz ", "long prompt ", "q")]

    def logprobs(responses):
        return [list(s.logprobs) for r in responses for s in r.sequences]

    alone = logprobs(f.result() for f in sampler.sample_many(unit))
    before = [sampler.sample(p, 5, params) for p in crowd]  # waiting when the unit arrives, and after it
    crowded = sampler.sample_many(unit)
    after = [sampler.sample(p, 5, params) for p in crowd]
    assert logprobs(f.result() for f in crowded) == alone
    assert all(len(f.result().sequences) == 5 for f in before + after)
    gate = threading.Event()
    sampler.engine.submit(gate.wait)  # the engine thread waits while the single requests queue up, so they do meet
    one_by_one = [sampler.sample(p, 5, params) for p in crowd[:2]] + [sampler.sample(*r) for r in unit]
    gate.set()
    mixed = logprobs(f.result() for f in one_by_one[2:])  # sent singly, the unit's prompts joined the crowd
    assert mixed != alone, "this batch does not move logprobs, so the test above could not fail"
    bad = sampler.sample_many([unit[0], (types.ModelInput.from_ints([]), 1, params)])  # the bad one fails alone
    assert logprobs([bad[0].result()]) == logprobs(f.result() for f in sampler.sample_many(unit[:1]))
    with pytest.raises(SamplingError, match="prompt is empty"):
        bad[1].result()


def test_a_seeded_request_gets_the_same_samples_whatever_is_batched_beside_it(trained, monkeypatch):
    # What a user expects of a seed, and what makes runs repeat against a server that batches requests in arrival
    # order: a seeded request's tokens and logprobs, bit for bit, whether it decodes alone or beside other requests
    # (prompts shorter and longer than its own, so its prompt is padded; more and fewer samples; other lengths and
    # sampling settings, seeded or not), wherever it arrives among them. The engine is held busy while a batch is
    # submitted, so that every request of it waits and they decode as one batch (checked below).
    import threading

    from rlvr.engine.cpu import fused_attention
    from rlvr.engine.sample import sampler as sampler_module

    if not fused_attention.buildable():
        pytest.skip("the guarantee holds where the fused attention kernel runs (no AVX2 or no C compiler here)")
    batches = []
    real = sampler_module.sample_batch

    def spy(model, jobs, *args, **kwargs):
        batches.append(len(jobs))
        return real(model, jobs, *args, **kwargs)

    monkeypatch.setattr(sampler_module, "sample_batch", spy)
    sampler = trained.save_weights_and_get_sampling_client()
    tok = trained.get_tokenizer()

    def request(text, n, **params):
        return types.ModelInput.from_ints(tok.encode(text)), n, types.SamplingParams(**params)

    target = request("What is 2 + 3? Answer:", 4, max_tokens=24, temperature=1.0, seed=7)
    neighbours = [
        [request("x", 1, max_tokens=5, seed=1)],
        [request("a much longer prompt than the target's own, by a good margin", 8, max_tokens=40)],
        [request("q", 3, max_tokens=60, temperature=0.7, seed=2),
         request("another prompt of some length " * 3, 5, max_tokens=10, top_p=0.9, seed=3)],
        [request("What is 2 + 3? Answer:", 2, max_tokens=30, seed=8),  # its own prompt, another seed
         request("mid-sized prompt", 16, max_tokens=24), request("greedy", 1, max_tokens=12, temperature=0.0)],
    ]

    def samples(response):
        return [(list(s.tokens), list(s.logprobs)) for s in response.sequences]

    def batched(requests):
        gate = threading.Event()
        sampler.engine.submit(gate.wait)  # the engine thread waits here while the batch queues up
        futures = [sampler.sample(*r) for r in requests]
        gate.set()
        return [samples(f.result()) for f in futures]

    alone = samples(sampler.sample(*target).result())
    assert batches[-1] == 1
    for others in neighbours:
        for place in range(len(others) + 1):
            requests = [*others[:place], target, *others[place:]]
            assert batched(requests)[place] == alone, (len(others), place)
            assert batches[-1] == len(requests)  # they did decode as one batch
        unit = [f.result() for f in sampler.sample_many([*others, target])]
        assert samples(unit[-1]) == alone
