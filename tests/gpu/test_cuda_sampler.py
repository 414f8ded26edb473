"""The sampler on CUDA: its logprobs against the trainer's (float32: 1e-4 per token; bfloat16: the rounding of
bfloat16 base weights), seeds that reproduce, stops, on ``tiny`` and a small random Qwen3.

Run on a machine with an NVIDIA GPU: ``pytest tests/gpu -m gpu``."""

import pytest
import torch

import rlvr
from datums import rl_datum
from rlvr import types
from rlvr.engine import Engine
from rlvr.engine.models.random_models import small_config, write_model_folder

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return str(write_model_folder(small_config("qwen3"), tmp_path_factory.mktemp("qwen3") / "model", seed=1))


def trained(engine: Engine, base_model: str):
    tc = rlvr.ServiceClient(engine).create_lora_training_client(base_model=base_model, rank=8, seed=11)
    tokens = tc.get_tokenizer().encode("some text to move the adapter away from zero")
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    for _ in range(3):
        tc.forward_backward([datum], "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=1e-2))
    return tc


def assert_near_the_trainers(tc, prompts, results, mean: float, worst: float | None) -> None:
    """The sampled logprobs of ``results`` (each prompt's sequences) differ from ``tc``'s forward by less than
    ``mean`` on average and ``worst`` at most (None: unbounded)."""
    diffs = []
    for prompt, sequences in zip(prompts, results, strict=True):
        for seq in sequences:
            out = tc.forward([rl_datum(prompt, seq.tokens, seq.logprobs, 0.0)], "importance_sampling").result()
            trainer = out.loss_fn_outputs[0]["logprobs"].to_torch()[len(prompt) - 1:]
            diffs.append((trainer - torch.tensor(seq.logprobs)).abs())
    diffs = torch.cat(diffs)
    assert float(diffs.mean()) < mean, float(diffs.mean())
    if worst is not None:
        assert float(diffs.max()) < worst, float(diffs.max())


@pytest.mark.parametrize(("precision", "worst", "mean"), [("float32", 1e-4, 1e-5), ("bfloat16", None, 0.05)])
@pytest.mark.parametrize("model", ["tiny", "qwen3"])
def test_sampler_logprobs_equal_the_trainers(precision, worst, mean, model, qwen3):
    tc = trained(Engine(device="cuda", precision=precision), qwen3 if model == "qwen3" else "tiny")
    sampler = tc.save_weights_and_get_sampling_client()
    tok = tc.get_tokenizer()
    prompts = [tok.encode(text) for text in ("a", "a longer prompt", "mid size")]
    params = [types.SamplingParams(max_tokens=24, temperature=t, seed=s) for t, s in ((1.0, 1), (0.7, 2), (1.0, 3))]
    futures = [sampler.sample(types.ModelInput.from_ints(p), 4, sp) for p, sp in zip(prompts, params, strict=True)]
    assert_near_the_trainers(tc, prompts, [f.result().sequences for f in futures], mean, worst)


def test_seeds_reproduce_and_stops_stop_on_cuda():
    tc = trained(Engine(device="cuda"), "tiny")
    sampler = tc.save_weights_and_get_sampling_client()
    prompt = types.ModelInput.from_ints([10, 11, 12])

    def draw(seed, stop=None, n=4):
        params = types.SamplingParams(max_tokens=20, temperature=1.0, seed=seed, stop=stop if stop is not None else [])
        return sampler.sample(prompt, n, params).result().sequences

    assert [s.tokens for s in draw(5)] == [s.tokens for s in draw(5)]
    assert [s.tokens for s in draw(5)] != [s.tokens for s in draw(6)]
    free = draw(3, n=1)[0]
    stop_token = free.tokens[4]
    seq = draw(3, stop=[stop_token], n=1)[0]
    assert seq.stop_reason == "stop" and seq.tokens == free.tokens[:free.tokens.index(stop_token) + 1]
    text = tc.get_tokenizer().decode(free.tokens)
    seq = draw(3, stop=[text[5:7]], n=1)[0]
    assert seq.stop_reason == "stop" and text[5:7] not in tc.get_tokenizer().decode(seq.tokens[:-1])


@pytest.mark.parametrize("model", ["tiny", "qwen3"])
def test_decode_steps_replayed_as_cuda_graphs_equal_the_eager_forward(model, qwen3):
    # float32, so that the captured fixed step and the eager forward over the columns so far agree to rounding:
    # the same tokens and logprobs through left padding, a prompt queued apart from itself and rows that end at 2,
    # 5 and 13 tokens (finished rows leave the batch and the graph is captured again for the rows left).
    from rlvr.engine.device import GpuPaths
    from rlvr.engine.gpu import device_sampler

    base = qwen3 if model == "qwen3" else "tiny"
    prompts = [[5, 6, 7, 8, 9, 10, 11], [40, 41], [5, 6, 7, 8, 9, 10, 11], [90, 91, 92, 93]]
    lengths = [13, 2, 5, 13]
    results = []
    for graphs in (True, False):
        before = device_sampler.captures
        engine = Engine(device="cuda", precision="float32", gpu_paths=GpuPaths(sync_every=3, graphs=graphs))
        sampler = trained(engine, base).save_weights_and_get_sampling_client()
        futures = [sampler.sample(types.ModelInput.from_ints(p), 3, types.SamplingParams(
            max_tokens=n, temperature=1.0, stop=[], seed=i))
            for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))]
        results.append([f.result().sequences for f in futures])
        assert (device_sampler.captures > before) == graphs, "the fixed step was not captured as a CUDA graph"
    for n, fixed, eager in zip(lengths, *results, strict=True):
        for a, b in zip(fixed, eager, strict=True):
            assert a.tokens == b.tokens and len(a.tokens) == n
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


@pytest.mark.parametrize(("precision", "worst", "mean"), [("float32", 1e-4, 1e-5), ("bfloat16", None, 0.05)])
def test_rlvrs_decode_step_on_triton_samples_the_trainers_logprobs(precision, worst, mean, qwen3, monkeypatch):
    # GpuPaths.decode_step="triton": rlvr's decode step on the compiled kernels (engine/gpu/decode.py) instead of
    # the model's forward, captured as a CUDA graph (again when rows leave: the 3-token rows at the look after step
    # 3); the sampled logprobs within the same bounds of the trainer's as the forward's are.
    from rlvr.engine.device import GpuPaths
    from rlvr.engine.gpu import device_sampler
    from rlvr.engine.gpu.decode import GpuDecoder

    engine = Engine(device="cuda", precision=precision, gpu_paths=GpuPaths(sync_every=3, decode_step="triton"))
    tc = trained(engine, qwen3)
    sampler = tc.save_weights_and_get_sampling_client()
    steps = []
    real_step = GpuDecoder.step
    monkeypatch.setattr(GpuDecoder, "step", lambda self, tokens, positions: (
        steps.append(len(tokens)), real_step(self, tokens, positions))[1])
    before = device_sampler.captures
    prompts = [[5, 6, 7, 8, 9], [40, 41], [90, 91, 92]]
    futures = [sampler.sample(types.ModelInput.from_ints(p), 4, types.SamplingParams(
        max_tokens=n, temperature=1.0, stop=[], seed=i)) for i, (p, n) in enumerate(zip(prompts, (20, 3, 12),
                                                                                           strict=True))]
    results = [f.result().sequences for f in futures]
    assert steps and steps[0] == 12, steps  # rlvr's step decoded the batch (the step's calls: one per capture)
    assert device_sampler.captures >= before + 2, "the decode step was not captured for 12 rows and then for 8"
    assert_near_the_trainers(tc, prompts, results, mean, worst)
