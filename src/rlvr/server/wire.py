"""Wire formats of the Tinker protocol: protobuf and JSON bodies in, SDK types out, and back.

Uses the schema the ``tinker`` package ships (``tinker.proto.tinker_public_pb2``), so the server reads exactly what
the SDK writes (``tinker.proto.request_conv``) and writes what it reads (``tinker.proto.response_conv``):

* ``decode_forward_backward`` -- a ``/forward_backward`` body (protobuf, optionally zstd) into rlvr call arguments.
* ``encode_forward_backward_output`` / ``encode_sample_response`` -- results into protobuf bytes.
* ``parse_json`` -- a JSON body into a ``tinker.types`` request model, with a 400-ready message on failure.
* ``json_position`` / ``proto_position`` -- the (model_id, seq_id) a body states, read leniently, so a request
  refused as malformed can still free its seq_id.
* ``to_wire_path`` -- rlvr checkpoint paths into the ``tinker://`` form the SDK insists on.

Not here: HTTP routing (``routes/``), which request runs when (``state.py``), any model math (``rlvr.engine``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pydantic
import zstandard
from google.protobuf.message import DecodeError
from tinker import types
from tinker.proto import tinker_public_pb2 as pb

__all__ = [
    "BadRequest",
    "FwdBwdCall",
    "ProtoPayload",
    "decode_forward_backward",
    "decompress",
    "encode_forward_backward_output",
    "encode_sample_response",
    "json_position",
    "parse_json",
    "proto_position",
    "sample_scores",
    "to_wire_path",
]

M = TypeVar("M", bound=pydantic.BaseModel)

PROTO_CONTENT_TYPE = "application/x-protobuf"

_DTYPES: dict[int, tuple[str, np.dtype]] = {
    pb.DTYPE_FLOAT32: ("float32", np.dtype(np.float32)),
    pb.DTYPE_INT64: ("int64", np.dtype(np.int64)),
    pb.DTYPE_INT32: ("int64", np.dtype(np.int32)),
}
_TO_PROTO_DTYPE = {np.dtype(np.float32): pb.DTYPE_FLOAT32, np.dtype(np.int64): pb.DTYPE_INT64}
_STOP_REASONS = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}


class BadRequest(ValueError):
    """A request body that cannot be understood; the message names the field, the value and the fix (HTTP 400)."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message)
        self.status_code = status_code


@dataclass
class ProtoPayload:
    """A result already serialized as protobuf (served with ``Content-Type: application/x-protobuf``)."""

    data: bytes


@dataclass
class FwdBwdCall:
    """The arguments of one ``/forward_backward`` request, ready for ``TrainingClient.forward[_backward]``."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float] | None
    data: list[types.Datum]
    forward_only: bool


# -- requests -------------------------------------------------------------------------------------------------------


def decompress(body: bytes, content_encoding: str | None, max_bytes: int) -> bytes:
    """The body with its ``Content-Encoding`` undone (identity or zstd), refusing to inflate past ``max_bytes``."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding != "zstd":
        raise BadRequest(f"Content-Encoding {content_encoding!r} is not supported; send identity or zstd", 415)
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True)  # RFC 8878: 1+ frames
        parts, size = [], 0
        while size <= max_bytes and (part := reader.read(max_bytes + 1 - size)):
            parts.append(part)
            size += len(part)
        if size > max_bytes:
            raise BadRequest(f"decompressed body exceeds the server limit of {max_bytes} bytes; send fewer datums "
                             "per request", 413)
        _check_frames_end(body)  # inflates at most what was just read: the limit holds
    except zstandard.ZstdError as exc:
        raise BadRequest(f"body is not valid zstd ({exc}); send the raw protobuf or compress it with zstd") from exc
    return b"".join(parts)


def _check_frames_end(body: bytes) -> None:
    """Refuse a zstd body whose last frame is cut off (the stream reader returns what a torn frame inflates to)."""
    rest = body
    while rest:
        frame = zstandard.ZstdDecompressor().decompressobj()
        frame.decompress(rest)
        if not frame.eof:
            raise BadRequest("body is a truncated zstd frame (the upload was cut off); send the whole compressed body")
        rest = frame.unused_data


def parse_json(model: type[M], body: bytes) -> M:
    """``body`` parsed as JSON and validated as ``model`` (a ``tinker.types`` request)."""
    try:
        raw = json.loads(body or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"{model.__name__}: body is not valid JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise BadRequest(f"{model.__name__}: body must be a JSON object, got {type(raw).__name__}")
    try:
        return model.model_validate(raw)
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<body>'}: {e['msg']} "
                             f"(got {_short(e.get('input'))})" for e in exc.errors()[:5])
        raise BadRequest(f"{model.__name__}: {problems}") from exc


def json_position(body: bytes) -> tuple[str, int] | None:
    """``(model_id, seq_id)`` as a JSON request body states them, whatever else is wrong with it; None when the body
    is not a JSON object with a string ``model_id`` and an integer ``seq_id``."""
    try:
        raw = json.loads(body or b"null")
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep
        return None
    return _position(raw.get("model_id"), raw.get("seq_id")) if isinstance(raw, dict) else None


def proto_position(body: bytes) -> tuple[str, int] | None:
    """``(model_id, seq_id)`` of a ``ForwardBackwardRequest`` protobuf, whatever else is wrong with its contents; None
    when the body does not parse or names no model."""
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except (DecodeError, RuntimeError):
        return None
    return _position(msg.model_id, msg.seq_id)


def _position(model_id: Any, seq_id: Any) -> tuple[str, int] | None:
    if isinstance(model_id, str) and model_id and isinstance(seq_id, int) and not isinstance(seq_id, bool):
        return model_id, seq_id
    return None


def decode_forward_backward(body: bytes) -> FwdBwdCall:
    """A ``ForwardBackwardRequest`` protobuf into rlvr arguments; BadRequest names what is wrong."""
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except (DecodeError, RuntimeError) as exc:
        raise BadRequest(f"forward_backward: body is not a tinker ForwardBackwardRequest protobuf ({exc}); send it "
                         f"with Content-Type {PROTO_CONTENT_TYPE} as the tinker SDK does") from exc
    if not msg.model_id:
        raise BadRequest("forward_backward: model_id is empty; use the model_id create_model returned")
    if not msg.loss_fn:
        raise BadRequest("forward_backward: loss_fn is empty; name a loss such as 'cross_entropy'")
    config: dict[str, float] = {}
    for key, value in msg.loss_fn_config_v2.items():
        if value.WhichOneof("value") != "number":
            raise BadRequest(f"forward_backward: loss_fn_config[{key!r}] is {value.text!r}; rlvr losses take numbers")
        config[key] = value.number
    for key, number in msg.loss_fn_config.items():
        config.setdefault(key, number)
    data = [_datum(d, i) for i, d in enumerate(msg.data)]
    if not data:
        raise BadRequest("forward_backward: data is empty; send at least one Datum")
    return FwdBwdCall(msg.model_id, msg.seq_id, msg.loss_fn, config or None, data, msg.forward_only)


def _datum(msg: pb.Datum, index: int) -> types.Datum:
    chunks: list[types.ModelInputChunk] = []
    for j, chunk in enumerate(msg.model_input):
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise BadRequest(f"forward_backward: data[{index}].model_input[{j}] is a {kind or 'empty'} chunk; rlvr "
                             "models take text tokens only (EncodedTextChunk)")
        raw = chunk.encoded_text.tokens
        if len(raw) % 4:
            raise BadRequest(f"forward_backward: data[{index}].model_input[{j}].tokens has {len(raw)} bytes, not a "
                             "whole number of int32 tokens")
        chunks.append(types.EncodedTextChunk(tokens=np.frombuffer(raw, dtype=np.int32).tolist()))
    inputs = {name: _tensor(t, f"data[{index}].loss_fn_inputs[{name!r}]") for name, t in msg.loss_fn_inputs.items()}
    datum = types.Datum(model_input=types.ModelInput(chunks=chunks), loss_fn_inputs=inputs)
    if not msg.model_input_spans and not msg.loss_fn_input_spans:
        return datum
    spans = {field: [_span(s, f"data[{index}].{field}[{j}]") for j, s in enumerate(getattr(msg, field))]
             for field in ("model_input_spans", "loss_fn_input_spans")}
    return types.Datum(model_input=datum.model_input, loss_fn_inputs=datum.loss_fn_inputs, **spans)


def _span(msg: pb.ProvenanceSpan, where: str) -> types.PromptProvenanceSpan | types.SampledProvenanceSpan:
    kind = msg.WhichOneof("span")
    if kind is None:
        raise BadRequest(f"forward_backward: {where} is empty; a provenance span is prompt_tokens or sampled_tokens")
    arm = getattr(msg, kind)
    cls = types.SampledProvenanceSpan if kind == "sampled_tokens" else types.PromptProvenanceSpan
    try:
        return cls(sequence_id=arm.sequence_id, offset=arm.offset, length=arm.length)
    except ValueError as exc:
        raise BadRequest(f"forward_backward: {where} is not a valid span ({exc})") from exc


def _tensor(msg: pb.Tensor, where: str) -> types.TensorData:
    if msg.dtype not in _DTYPES:
        raise BadRequest(f"forward_backward: {where} has dtype {msg.dtype}; send float32 or int64")
    name, np_dtype = _DTYPES[msg.dtype]
    shape = list(msg.shape) or None
    try:
        if msg.WhichOneof("encoding") == "sparse_csr":
            csr = msg.sparse_csr
            values = np.frombuffer(csr.values, dtype=np_dtype)
            return types.TensorData(data=values, dtype=name, shape=shape,  # type: ignore[arg-type]
                                    sparse_crow_indices=np.frombuffer(csr.crow_indices, np.int64).tolist(),
                                    sparse_col_indices=np.frombuffer(csr.col_indices, np.int64).tolist())
        array = np.frombuffer(msg.dense, dtype=np_dtype)
        return types.TensorData(data=array, dtype=name, shape=shape)  # type: ignore[arg-type]
    except ValueError as exc:  # buffer length or shape that does not fit the dtype
        raise BadRequest(f"forward_backward: {where} does not decode ({exc}); its bytes must hold prod(shape) "
                         f"values of its dtype") from exc


# -- responses ------------------------------------------------------------------------------------------------------


def encode_forward_backward_output(out: types.ForwardBackwardOutput) -> ProtoPayload:
    """A ``ForwardBackwardOutput`` as the protobuf the SDK's ``deserialize_forward_backward_output`` reads."""
    msg = pb.ForwardBackwardOutput(loss_fn_output_type=out.loss_fn_output_type or "ArrayRecord")
    for key, value in out.metrics.items():
        msg.metrics[key] = float(value)
    if out.loss_fn_outputs:
        record = msg.loss_fn_outputs.add(num_datums=len(out.loss_fn_outputs))
        for name in out.loss_fn_outputs[0]:
            arrays = [np.ascontiguousarray(d[name].to_numpy()) for d in out.loss_fn_outputs]
            dtype = np.dtype(np.float32) if arrays[0].dtype.kind == "f" else np.dtype(np.int64)
            arrays = [a.astype(dtype, copy=False) for a in arrays]
            offsets = np.cumsum([0] + [a.nbytes for a in arrays], dtype=np.int64)
            record.fields[name].CopyFrom(pb.BatchedTensor(
                data=b"".join(a.tobytes() for a in arrays), offsets=offsets.tobytes(), dtype=_TO_PROTO_DTYPE[dtype],
                trailing_shape=list(arrays[0].shape[1:])))
    return ProtoPayload(msg.SerializeToString())


def sample_scores(req: types.SampleRequest) -> dict[str, Any]:
    """The optional scores a SampleRequest sets beyond prompt logprobs, as ``SamplingClient.sample`` keywords (only
    those set, so a sampler that takes none still serves plain requests)."""
    options: dict[str, Any] = {}
    for name in ("topk_sample_logprobs", "prompt_alt_tokens_k", "prompt_logprobs_last_n"):
        if getattr(req, name):
            options[name] = getattr(req, name)
    if req.target_prompt_logprobs is not None:
        t = req.target_prompt_logprobs
        options["target_prompt_logprobs"] = types.TensorData(
            data=t.data, dtype=t.dtype, shape=t.shape, sparse_crow_indices=t.sparse_crow_indices,
            sparse_col_indices=t.sparse_col_indices)
    return options


def _topk_proto(topk: Any, out: pb.TopkLogprobs) -> None:
    n, k = topk.token_ids.shape
    out.token_ids = np.ascontiguousarray(topk.token_ids, dtype=np.int32).tobytes()
    out.logprobs = np.ascontiguousarray(topk.logprobs, dtype=np.float32).tobytes()
    out.k, out.length = k, n


def _tensor_proto(tensor: types.TensorData, out: pb.Tensor) -> None:
    array = tensor.to_numpy() if tensor.sparse_crow_indices is None else np.asarray(tensor.data)
    dtype = np.dtype(np.float32) if tensor.dtype == "float32" else np.dtype(np.int64)
    out.dtype = _TO_PROTO_DTYPE[dtype]
    out.shape.extend(tensor.shape or list(array.shape))
    if tensor.sparse_crow_indices is None:
        out.dense = np.ascontiguousarray(array, dtype=dtype).tobytes()
    else:
        out.sparse_csr.values = np.asarray(array, dtype=dtype).tobytes()
        out.sparse_csr.crow_indices = np.asarray(tensor.sparse_crow_indices, dtype=np.int64).tobytes()
        out.sparse_csr.col_indices = np.asarray(tensor.sparse_col_indices, dtype=np.int64).tobytes()


def encode_sample_response(resp: types.SampleResponse) -> ProtoPayload:
    """A ``SampleResponse`` as the protobuf the SDK's ``deserialize_sample_response`` reads."""
    msg = pb.SampleResponse(prompt_cache_hit_tokens=resp.prompt_cache_hit_tokens)
    for seq in resp.sequences:
        out = msg.sequences.add(stop_reason=_STOP_REASONS[seq.stop_reason],
                                tokens=np.asarray(seq.tokens, dtype=np.int32).tobytes())
        if seq.logprobs is not None:
            out.logprobs = np.asarray(seq.logprobs, dtype=np.float32).tobytes()
        if seq.topk_logprobs_np is not None:
            _topk_proto(seq.topk_logprobs_np, out.topk_sampled_logprobs)
    if resp.prompt_logprobs is not None:
        values = [np.nan if v is None else v for v in resp.prompt_logprobs]
        msg.prompt_logprobs = np.asarray(values, dtype=np.float32).tobytes()
    if resp.topk_prompt_logprobs_np is not None:
        _topk_proto(resp.topk_prompt_logprobs_np, msg.topk_prompt_logprobs)
    if resp.target_prompt_logprobs is not None:
        _tensor_proto(resp.target_prompt_logprobs, msg.target_prompt_logprobs)
    if resp.prompt_alt_tokens is not None:
        _tensor_proto(resp.prompt_alt_tokens.tokens, msg.prompt_alt_tokens.tokens)
        _tensor_proto(resp.prompt_alt_tokens.logprobs, msg.prompt_alt_tokens.logprobs)
    return ProtoPayload(msg.SerializeToString())


def to_wire_path(path: str) -> str:
    """``rlvr://run/kind/name`` as ``tinker://run/kind/name`` (the SDK only accepts tinker:// paths)."""
    return "tinker://" + path[len("rlvr://"):] if path.startswith("rlvr://") else path


def json_body(model: pydantic.BaseModel | dict[str, Any] | None) -> Any:
    """A response object as JSON-ready data (pydantic models dumped the way the SDK reads them)."""
    if isinstance(model, pydantic.BaseModel):
        return model.model_dump(mode="json", exclude_none=True)
    return model


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
