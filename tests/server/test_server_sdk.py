"""The official tinker SDK, unchanged, trains and samples through ``rlvr serve`` with the same numbers as the
in-process ``rlvr.ServiceClient``."""

from __future__ import annotations

import re

import numpy as np
import pytest
from tinker import types

PROMPT = [72, 101, 108, 108, 111, 32]
COMPLETION = [119, 111, 114, 108, 100, 33]
TOKENS = PROMPT + COMPLETION
CONFIGS: dict[str, dict[str, float] | None] = {
    "cross_entropy": None, "importance_sampling": None, "ppo": {"clip_low_threshold": 0.7},
    "cispo": None, "dro": {"beta": 0.5}, "gspo": {"clip_high_threshold": 1.5}, "stable_reinforce": {"kl_coeff": 0.2},
}


def _datum(loss: str, shift: float) -> types.Datum:
    n = len(TOKENS) - 1
    inputs: dict = {"target_tokens": types.TensorData(data=TOKENS[1:], dtype="int64")}
    if loss == "cross_entropy":
        inputs["weights"] = types.TensorData(data=[0.0] * 4 + [1.0] * (n - 4), dtype="float32")
    else:
        inputs["logprobs"] = types.TensorData(data=[-5.0 + shift + 0.1 * i for i in range(n)], dtype="float32")
        inputs["advantages"] = types.TensorData(data=[0.0] * 4 + [1.0 - shift] * (n - 4), dtype="float32")
    if loss == "gspo":
        inputs["sequence_ratio_mask"] = types.TensorData(data=[0.0] * 4 + [1.0] * (n - 4), dtype="float32")
    datum = types.Datum(model_input=types.ModelInput.from_ints(TOKENS[:-1]), loss_fn_inputs=inputs)
    if loss == "stable_reinforce":  # targets 0..3 are prompt tokens 1..4, the rest sampled
        datum = datum.with_provenance(
            model_input=[types.PromptProvenanceSpan(sequence_id="s", length=5),
                         types.SampledProvenanceSpan(sequence_id="s", length=n - 5)],
            loss_fn_inputs=[types.PromptProvenanceSpan(sequence_id="s", offset=1, length=4),
                            types.SampledProvenanceSpan(sequence_id="s", length=n - 4)])
    return datum


def _close(a, b, what: str) -> None:
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), rtol=1e-5,
                               atol=1e-6, err_msg=what)


def test_server_sdk_matches_in_process_client(sdk, service):
    remote = sdk.create_lora_training_client(base_model="tiny", rank=4, seed=1234).result()
    local = service.create_lora_training_client("tiny", rank=4, seed=1234)
    adam = types.AdamParams(learning_rate=5e-3)

    info = remote.get_info()
    assert re.fullmatch(r"session-[0-9a-f]+:train:\d+", info.model_id) and info.lora_rank == 4
    tokenizer = remote.get_tokenizer()  # loads the tokenizer folder the server hands out, offline
    text = "Hello world <|im_end|>"
    assert tokenizer.encode(text) == local.get_tokenizer().encode(text)
    assert tokenizer.decode(tokenizer.encode("Hello")) == "Hello"

    for step, loss in enumerate(CONFIGS):
        data = [_datum(loss, 0.0), _datum(loss, 0.5)]
        fwd_remote = remote.forward_backward(data, loss, CONFIGS[loss])
        opt_remote = remote.optim_step(adam)  # submitted before the result is awaited: order is kept
        out_local = local.forward_backward(data, loss, CONFIGS[loss]).result()
        opt_local = local.optim_step(adam).result()
        out_remote = fwd_remote.result()
        assert set(out_remote.metrics) == set(out_local.metrics), loss
        assert all(":" in key for key in out_remote.metrics)
        for key in out_local.metrics:
            _close(out_remote.metrics[key], out_local.metrics[key], f"{loss} {key}")
        for r, lo in zip(out_remote.loss_fn_outputs, out_local.loss_fn_outputs, strict=True):
            _close(r["logprobs"].to_numpy(), lo["logprobs"].to_numpy(), f"{loss} logprobs step {step}")
        _close(opt_remote.result().metrics["grad_norm:mean"], opt_local.metrics["grad_norm:mean"], loss)

    # forward only: same numbers, no gradient
    probe = [_datum("cross_entropy", 0.0)]
    _close(remote.forward(probe, "cross_entropy").result().metrics["loss:sum"],
           local.forward(probe, "cross_entropy").result().metrics["loss:sum"], "forward")

    # sampling on the trained weights
    sampler_remote = remote.save_weights_and_get_sampling_client().result()
    sampler_local = local.save_weights_and_get_sampling_client()
    params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=7)
    prompt = types.ModelInput.from_ints(PROMPT)
    got = sampler_remote.sample(prompt, 2, params).result()
    want = sampler_local.sample(prompt, 2, params).result()
    assert [s.tokens for s in got.sequences] == [s.tokens for s in want.sequences]
    for g, w in zip(got.sequences, want.sequences, strict=True):
        _close(g.logprobs, w.logprobs, "sampled logprobs")
        assert g.sequence_id and g.stop_reason == w.stop_reason
    lp_remote = sampler_remote.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()
    lp_local = sampler_local.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()
    assert lp_remote[0] is None and lp_local[0] is None
    _close(lp_remote[1:], lp_local[1:], "prompt logprobs (weights)")

    # save_state, then resume with the optimizer: the next step matches the uninterrupted local run
    saved = remote.save_state("ckpt").result()
    assert saved.path.startswith("tinker://") and saved.path.endswith("/weights/ckpt")
    resumed = sdk.create_training_client_from_state_with_optimizer(saved.path).result()
    data = [_datum("importance_sampling", 0.25)]
    out_resumed = resumed.forward_backward(data, "importance_sampling").result()
    resumed.optim_step(adam).result()
    out_local = local.forward_backward(data, "importance_sampling").result()
    local.optim_step(adam).result()
    _close(out_resumed.metrics["loss:sum"], out_local.metrics["loss:sum"], "resumed loss")
    after_remote = resumed.forward(probe, "cross_entropy").result().metrics["loss:sum"]
    after_local = local.forward(probe, "cross_entropy").result().metrics["loss:sum"]
    _close(after_remote, after_local, "resumed weights after a step")

    # a named sampler checkpoint, opened through create_sampling_client
    path = remote.save_weights_for_sampler("final").result().path
    assert path.startswith("tinker://")
    sampler = sdk.create_sampling_client(model_path=path).result()
    _close(sampler.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()[1:], lp_remote[1:],
           "named sampler weights")


def test_server_sdk_stable_reinforce_on_sequences_sampled_with_stability_info(sdk, service):
    """The cookbook's rl_loop path: sample with record_stability_info, name each sequence in the datum's provenance,
    train stable_reinforce; the server gives the numbers of the same datums in process."""
    remote = sdk.create_lora_training_client(base_model="tiny", rank=4, seed=77).result()
    local = service.create_lora_training_client("tiny", rank=4, seed=77)
    sampler = remote.save_weights_and_get_sampling_client(record_stability_info=True).result()
    local.save_weights_and_get_sampling_client(record_stability_info=True)  # the in-process signature takes it too
    prompt = types.ModelInput.from_ints(PROMPT)
    response = sampler.sample(prompt, 2, types.SamplingParams(max_tokens=4, temperature=1.0, seed=3)).result()
    data = []
    for sequence, advantage in zip(response.sequences, (1.0, -1.0), strict=True):
        tokens, ob_len = sequence.tokens, len(PROMPT) - 1
        datum = types.Datum(
            model_input=prompt.append(types.EncodedTextChunk(tokens=tokens[:-1])),
            loss_fn_inputs={"target_tokens": [0] * ob_len + tokens,
                            "logprobs": [0.0] * ob_len + [lp - 0.1 for lp in sequence.logprobs],
                            "advantages": [0.0] * ob_len + [advantage] * len(tokens)})
        data.append(datum.with_provenance(
            model_input=[types.PromptProvenanceSpan(sequence_id=sequence.sequence_id, length=len(PROMPT)),
                         types.SampledProvenanceSpan(sequence_id=sequence.sequence_id, length=len(tokens) - 1)],
            loss_fn_inputs=[types.PromptProvenanceSpan(sequence_id=sequence.sequence_id, offset=1, length=ob_len),
                            types.SampledProvenanceSpan(sequence_id=sequence.sequence_id, length=len(tokens))]))
    got = remote.forward_backward(data, "stable_reinforce").result()
    want = local.forward_backward(data, "stable_reinforce").result()
    for key in want.metrics:
        _close(got.metrics[key], want.metrics[key], f"stable_reinforce {key}")
    with pytest.raises(Exception, match="has no provenance"):
        remote.forward_backward([_datum("importance_sampling", 0.0)], "stable_reinforce").result()


def test_server_sdk_topk_cross_entropy_with_sparse_targets(sdk, service):
    """Top-K distillation's datum, (T, K) target_tokens and weights sent as sparse CSR by the SDK, trains through the
    server with the in-process numbers, and the (T, K) logprobs come back."""
    import torch

    targets, weights = torch.zeros(5, 6, dtype=torch.int64), torch.zeros(5, 6)
    targets[:, 0], weights[:, 0] = torch.tensor(TOKENS[1:6]), 0.8
    targets[[1, 3], 2], weights[[1, 3], 2] = torch.tensor([40, 50]), 0.2
    datum = types.Datum(model_input=types.ModelInput.from_ints(TOKENS[:5]),
                        loss_fn_inputs={"target_tokens": targets, "weights": weights})
    assert datum.loss_fn_inputs["weights"].sparse_crow_indices is not None
    remote = sdk.create_lora_training_client(base_model="tiny", rank=4, seed=78).result()
    local = service.create_lora_training_client("tiny", rank=4, seed=78)
    got = remote.forward_backward([datum], "cross_entropy").result()
    want = local.forward_backward([datum], "cross_entropy").result()
    _close(got.metrics["loss:sum"], want.metrics["loss:sum"], "top-K loss")
    assert got.loss_fn_outputs[0]["logprobs"].to_numpy().shape == (5, 6)
    _close(got.loss_fn_outputs[0]["logprobs"].to_numpy(), want.loss_fn_outputs[0]["logprobs"].to_numpy(), "top-K")


def test_server_sdk_sampling_scores_match_in_process(sdk, service):
    """Every optional score of ``sample`` through rlvr serve, decoded by the SDK, equals the in-process answer."""
    import torch

    remote = sdk.create_sampling_client(base_model="tiny").result()
    local = service.create_sampling_client(base_model="tiny")
    ids = torch.full((len(PROMPT) - 1, 2), -1, dtype=torch.int64)
    ids[1, 0], ids[3, 1] = 40, PROMPT[4]
    kwargs = dict(include_prompt_logprobs=True, topk_prompt_logprobs=3, topk_sample_logprobs=2,
                  target_prompt_logprobs=types.TensorData.from_torch_sparse(ids, pad_value=-1),
                  prompt_alt_tokens_k=4, prompt_logprobs_last_n=3)
    params = types.SamplingParams(max_tokens=3, temperature=1.0, seed=5)
    got = remote.sample(types.ModelInput.from_ints(PROMPT), 2, params, **kwargs).result()
    want = local.sample(types.ModelInput.from_ints(PROMPT), 2, params, **kwargs).result()
    assert got.prompt_logprobs[:3] == [None] * 3
    _close(got.prompt_logprobs[3:], want.prompt_logprobs[3:], "last-N prompt logprobs")
    assert got.topk_prompt_logprobs[:3] == [None] * 3 and len(got.topk_prompt_logprobs) == len(PROMPT)
    for g, w in zip(got.topk_prompt_logprobs[3:], want.topk_prompt_logprobs[3:], strict=True):
        assert [t for t, _ in g] == [t for t, _ in w]
        _close([lp for _, lp in g], [lp for _, lp in w], "top-k prompt logprobs")
    assert got.target_prompt_logprobs.sparse_crow_indices == want.target_prompt_logprobs.sparse_crow_indices
    _close(got.target_prompt_logprobs.to_numpy(), want.target_prompt_logprobs.to_numpy(), "target prompt logprobs")
    np.testing.assert_array_equal(got.prompt_alt_tokens.tokens.to_numpy(), want.prompt_alt_tokens.tokens.to_numpy())
    _close(got.prompt_alt_tokens.logprobs.to_numpy(), want.prompt_alt_tokens.logprobs.to_numpy(), "alt logprobs")
    for g, w in zip(got.sequences, want.sequences, strict=True):
        assert g.tokens == w.tokens and len(g.topk_logprobs) == len(g.tokens)
        for gr, wr in zip(g.topk_logprobs, w.topk_logprobs, strict=True):
            assert [t for t, _ in gr] == [t for t, _ in wr]
            _close([lp for _, lp in gr], [lp for _, lp in wr], "top-k sample logprobs")


def test_server_request_errors_reach_the_caller(sdk):
    remote = sdk.create_lora_training_client(base_model="tiny", rank=2, seed=1).result()
    with pytest.raises(Exception, match="not a built-in loss"):
        remote.forward_backward([_datum("cross_entropy", 0.0)], "no_such_loss").result()
