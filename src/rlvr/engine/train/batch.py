"""Turns a list of Tinker ``Datum`` into checked tensors, or a clear error naming the datum and the key at fault.

Everything is checked before any model work starts, so a rejected call changes nothing: no gradient is
accumulated, no optimizer state moves.

Alignment is Tinker's: ``loss_fn_inputs[key][i]`` belongs to position ``i`` of ``model_input``, whose logits predict
``target_tokens[i]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tinker import types

from rlvr.errors import InvalidDatumError


@dataclass
class CheckedDatum:
    """One datum as tensors, checked against the model and the loss."""

    input_ids: torch.Tensor
    """Model input tokens, int64 (T,)."""
    targets: torch.Tensor
    """``target_tokens``, int64 (T,)."""
    inputs: dict[str, torch.Tensor]
    """The other ``loss_fn_inputs`` the loss needs, float32 (T,) each."""


def model_input_tokens(model_input: types.ModelInput, vocab_size: int, where: str) -> list[int]:
    """The token ids of a ModelInput, checked to be text-only and inside the vocabulary."""
    if not isinstance(model_input, types.ModelInput):
        raise InvalidDatumError(f"{where} must be a tinker ModelInput (types.ModelInput.from_ints([...])), got "
                                f"{type(model_input).__name__}")
    for chunk in model_input.chunks:
        if not isinstance(chunk, types.EncodedTextChunk):
            raise InvalidDatumError(f"{where} holds a {type(chunk).__name__}; rlvr's models take text tokens only "
                                    "(EncodedTextChunk)")
    tokens = model_input.to_ints()
    bad = [t for t in tokens if not 0 <= t < vocab_size]
    if bad:
        raise InvalidDatumError(f"{where} has token id {bad[0]} outside the vocabulary [0, {vocab_size})")
    return tokens


def sampled_mask(datum: types.Datum, where: str) -> torch.Tensor:
    """1.0 at the targets the datum's provenance names as sampled tokens, 0.0 at prompt tokens, float32 (T,)."""
    spans = datum.loss_fn_input_spans
    if spans is None:
        raise InvalidDatumError(
            f"{where} has no provenance; this loss needs the sampled sequence behind every target: sample with "
            "record_stability_info=True and attach datum.with_provenance(model_input=[...], loss_fn_inputs=[...]) "
            "naming each SampledSequence.sequence_id"
        )
    mask = torch.cat([torch.full((span.length,), float(isinstance(span, types.SampledProvenanceSpan)))
                      for span in spans]) if spans else torch.zeros(0)
    return mask


def check_data(
    data: Sequence[types.Datum], required: Sequence[str], vocab_size: int, allow_extra: bool = False,
    provenance: bool = False, topk: bool = False,
) -> list[CheckedDatum]:
    """Check every datum of a ``forward``/``forward_backward`` call and convert it to tensors.

    ``required`` names the loss's inputs besides ``target_tokens``; with ``allow_extra`` (custom losses) other keys
    pass through unchecked except for length. With ``provenance`` every datum must carry provenance, turned into the
    input ``sampled_mask``. With ``topk`` (cross_entropy) ``target_tokens`` and the inputs may be (T, K), K targets per
    position for top-K distillation, dense or sparse CSR (unlisted cells are token 0 with weight 0), one K per call.
    """
    if not isinstance(data, Sequence) or isinstance(data, (str, bytes)) or len(data) == 0:
        raise InvalidDatumError("data must be a non-empty list of tinker Datum")
    checked = []
    for i, datum in enumerate(data):
        if not isinstance(datum, types.Datum):
            raise InvalidDatumError(f"data[{i}] must be a tinker Datum, got {type(datum).__name__}")
        tokens = model_input_tokens(datum.model_input, vocab_size, f"data[{i}].model_input")
        if not tokens:
            raise InvalidDatumError(f"data[{i}].model_input is empty")
        keys = dict(datum.loss_fn_inputs)
        missing = [k for k in ("target_tokens", *required) if k not in keys]
        if missing:
            raise InvalidDatumError(f"data[{i}].loss_fn_inputs lacks {missing}; this loss needs "
                                    f"{['target_tokens', *required]}")
        extra = sorted(set(keys) - {"target_tokens", *required})
        if extra and not allow_extra:
            raise InvalidDatumError(f"data[{i}].loss_fn_inputs has keys {extra} that this loss does not use; it takes "
                                    f"{['target_tokens', *required]} (remove the others, e.g. a 'mask')")
        tensors = {}
        for key, value in keys.items():
            tensor = value.to_torch() if isinstance(value, types.TensorData) else torch.as_tensor(value)
            if key in ("target_tokens", *required):
                tensor = tensor.reshape(-1) if tensor.dim() == 0 else tensor
                if tensor.dim() != 1 and not (topk and tensor.dim() == 2):
                    shapes = "(T,) or (T, K)" if topk else "1-D (T,)"
                    raise InvalidDatumError(f"data[{i}].loss_fn_inputs[{key!r}] must be {shapes}, got shape "
                                            f"{tuple(tensor.shape)}")
                if tensor.shape[0] != len(tokens):
                    raise InvalidDatumError(
                        f"data[{i}].loss_fn_inputs[{key!r}] has {tensor.shape[0]} entries but model_input has "
                        f"{len(tokens)} tokens; they must match (targets are the inputs shifted by one)"
                    )
            tensors[key] = tensor
        targets = tensors.pop("target_tokens").to(torch.int64)
        for key in required:
            if tensors[key].shape != targets.shape:
                raise InvalidDatumError(f"data[{i}].loss_fn_inputs[{key!r}] has shape {tuple(tensors[key].shape)} but "
                                        f"target_tokens has {tuple(targets.shape)}; give one value per target")
        if checked and targets.shape[1:] != checked[0].targets.shape[1:]:
            raise InvalidDatumError(f"data[{i}].loss_fn_inputs['target_tokens'] has shape {tuple(targets.shape)} but "
                                    f"data[0]'s is {tuple(checked[0].targets.shape)}; use one K (or all 1-D) per call")
        bad = targets[(targets < 0) | (targets >= vocab_size)]
        if bad.numel():
            raise InvalidDatumError(f"data[{i}].loss_fn_inputs['target_tokens'] has token id {int(bad[0])} outside "
                                    f"the vocabulary [0, {vocab_size})")
        inputs = {}
        for key, tensor in tensors.items():
            tensor = tensor.to(torch.float32) if key in required else tensor
            if key in required and not torch.isfinite(tensor).all():
                position = tuple((~torch.isfinite(tensor)).nonzero()[0].tolist())
                where = ", ".join(map(str, position))
                raise InvalidDatumError(f"data[{i}].loss_fn_inputs[{key!r}][{where}] is "
                                        f"{float(tensor[position])}; it must be finite")
            inputs[key] = tensor
        if provenance:
            mask = sampled_mask(datum, f"data[{i}]")
            if mask.shape[0] != len(tokens):
                raise InvalidDatumError(f"data[{i}].loss_fn_input_spans cover {mask.shape[0]} targets but the datum "
                                        f"has {len(tokens)}; the spans must tile target_tokens exactly")
            inputs["sampled_mask"] = mask
        checked.append(CheckedDatum(torch.tensor(tokens, dtype=torch.int64), targets, inputs))
    return checked
