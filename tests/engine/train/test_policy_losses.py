"""gspo and stable_reinforce through the engine: the built-in loss gives the same value and the same weights after a
step as that loss written by hand with ``forward_backward_custom``; stable_reinforce needs provenance."""

import pytest
import torch

from rlvr import types
from rlvr.errors import InvalidDatumError


def _datum(prompt, completion, logprobs, advantage, ratio_mask=False, provenance=None):
    """The cookbook's rl_loop datum, with gspo's ``sequence_ratio_mask`` or stable_reinforce's provenance."""
    ob_len = len(prompt) - 1
    inputs = {
        "target_tokens": prompt[1:] + completion,
        "logprobs": [0.0] * ob_len + list(logprobs),
        "advantages": [0.0] * ob_len + [advantage] * len(completion),
    }
    if ratio_mask:
        inputs["sequence_ratio_mask"] = [0.0] * ob_len + [1.0] * len(completion)
    datum = types.Datum(model_input=types.ModelInput.from_ints(prompt + completion[:-1]), loss_fn_inputs=inputs)
    if provenance is None:
        return datum
    return datum.with_provenance(
        model_input=[types.PromptProvenanceSpan(sequence_id=provenance, length=len(prompt)),
                     types.SampledProvenanceSpan(sequence_id=provenance, length=len(completion) - 1)],
        loss_fn_inputs=[types.PromptProvenanceSpan(sequence_id=provenance, offset=1, length=ob_len),
                        types.SampledProvenanceSpan(sequence_id=provenance, length=len(completion))],
    )


def _by_hand_gspo(data, logprobs_list):
    """Tinker's GSPO page, written per datum: sequence ratio over the masked tokens, each token its own gradient."""
    loss = torch.zeros(())
    for datum, lp in zip(data, logprobs_list, strict=True):
        q, adv, mask = (datum.loss_fn_inputs[k].to_torch() for k in ("logprobs", "advantages", "sequence_ratio_mask"))
        log_ratio = (lp.detach() - q)[mask != 0].mean()
        ratio = torch.exp(log_ratio + lp - lp.detach())
        loss = loss - torch.minimum(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv).sum()
    return loss, {}


def _by_hand_stable_reinforce(kl_coeff):
    def loss_fn(data, logprobs_list):
        loss = torch.zeros(())
        for datum, lp in zip(data, logprobs_list, strict=True):
            q, adv = datum.loss_fn_inputs["logprobs"].to_torch(), datum.loss_fn_inputs["advantages"].to_torch()
            sampled = torch.cat([torch.full((s.length,), isinstance(s, types.SampledProvenanceSpan))
                                 for s in datum.loss_fn_input_spans])
            r = torch.exp(lp[sampled] - q[sampled])
            loss = loss - (r.clamp(max=1.0).detach() * adv[sampled] * lp[sampled]).sum()
            loss = loss + kl_coeff * (r - 1 - torch.log(r)).sum()
        return loss, {}
    return loss_fn


def _step(service, seed, run):
    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=seed)
    before = tc.parameters()
    out = run(tc)
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    after = tc.parameters()
    assert any(not torch.equal(before[k], v) for k, v in after.items()), "the step moved no weight"
    return out.metrics["loss:sum"], after


def _off_policy(service, seed, **kwargs):
    """Two datums of different lengths whose sampler logprobs differ from the model's, so ratios are not 1."""
    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=seed)
    shapes = [([5, 6, 7], [8, 9, 10, 11], 1.0), ([12, 13], [14, 15], -0.5)]
    probe = [_datum(p, c, [0.0] * len(c), a) for p, c, a in shapes]
    now = [o["logprobs"].to_torch() for o in tc.forward(probe, "importance_sampling").result().loss_fn_outputs]
    shifts = torch.tensor([0.15, -0.1, 0.05, 0.3])
    return [_datum(p, c, (lp[len(p) - 1:] - shifts[:len(c)]).tolist(), a, **kwargs)
            for (p, c, a), lp in zip(shapes, now, strict=True)]


def test_gspo_matches_the_hand_written_loss(service):
    data = _off_policy(service, 11, ratio_mask=True)
    builtin = _step(service, 11, lambda tc: tc.forward_backward(data, "gspo").result())
    custom = _step(service, 11, lambda tc: tc.forward_backward_custom(data, _by_hand_gspo).result())
    assert builtin[0] == pytest.approx(custom[0], rel=1e-5)
    for key, value in builtin[1].items():
        torch.testing.assert_close(value, custom[1][key])


def test_stable_reinforce_matches_the_hand_written_loss(service):
    data = _off_policy(service, 12, provenance="seq-0")
    config = {"kl_coeff": 0.5}
    builtin = _step(service, 12, lambda tc: tc.forward_backward(data, "stable_reinforce", config).result())
    custom = _step(service, 12, lambda tc: tc.forward_backward_custom(data, _by_hand_stable_reinforce(0.5)).result())
    assert builtin[0] == pytest.approx(custom[0], rel=1e-5)
    for key, value in builtin[1].items():
        torch.testing.assert_close(value, custom[1][key])


def test_stable_reinforce_without_provenance_names_the_fix(service):
    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=13)
    with pytest.raises(InvalidDatumError, match=r"data\[0\] has no provenance.*with_provenance"):
        tc.forward_backward([_datum([1, 2], [3, 4], [-1.0, -1.0], 1.0)], "stable_reinforce").result()
