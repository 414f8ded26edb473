"""``rlvr.server.wire``: Tinker's wire formats in and out, checked against the tinker SDK's own encoders and decoders
(``tinker.proto.request_conv`` / ``response_conv``) and ``tinker.types``, and bad bodies refused with a BadRequest
that names the field."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zstandard
from tinker import types
from tinker.proto import tinker_public_pb2 as pb
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response

from rlvr.server import wire
from rlvr.server.wire import BadRequest


def sdk_body(data: list[types.Datum], loss_fn: str = "cross_entropy", config: dict | None = None,
             model_id: str = "sess:train:0", seq_id: int = 7, forward_only: bool = False) -> bytes:
    """A /forward_backward body exactly as the tinker SDK writes it (``resources/training.py``)."""
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=loss_fn, loss_fn_config=config),
        model_id=model_id, seq_id=seq_id)
    msg = forward_backward_request_to_proto(request)
    msg.forward_only = forward_only
    return msg.SerializeToString()


def ce(tokens: list[int]) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": types.TensorData(data=tokens[1:], dtype="int64"),
                                       "weights": types.TensorData(data=[1.0] * (len(tokens) - 1), dtype="float32")})


def valid_msg() -> pb.ForwardBackwardRequest:
    msg = pb.ForwardBackwardRequest()
    msg.ParseFromString(sdk_body([ce([1, 2, 3])]))
    return msg


def assert_tensor_equal(got: types.TensorData, want: types.TensorData) -> None:
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert got.sparse_crow_indices == want.sparse_crow_indices
    assert got.sparse_col_indices == want.sparse_col_indices
    np.testing.assert_array_equal(got.to_numpy(), want.to_numpy())


# -- requests: /forward_backward --------------------------------------------------------------------------------------


def test_forward_backward_body_from_the_sdk_decodes_to_the_datums_it_was_built_from():
    weights = np.array([0.5, 0.0, 0.0, 0.25], dtype=np.float32)
    datums = [
        types.Datum(
            model_input=types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[1, 2]),
                                                 types.EncodedTextChunk(tokens=[70_000])]),
            loss_fn_inputs={
                "target_tokens": types.TensorData(data=[2, 70_000, 4], dtype="int64"),
                "weights": types.TensorData(data=weights, dtype="float32", shape=[2, 2]),
                "sparse": types.TensorData(data=[1.5, -2.5], dtype="float32", shape=[2, 3],
                                           sparse_crow_indices=[0, 1, 2], sparse_col_indices=[2, 0]),
            }),
        ce([9, 8, 7, 6, 5]),
    ]
    call = wire.decode_forward_backward(sdk_body(datums, "ppo", {"clip_low_threshold": 0.25}, "s:train:3", 11))
    assert (call.model_id, call.seq_id, call.loss_fn, call.forward_only) == ("s:train:3", 11, "ppo", False)
    assert call.loss_fn_config == {"clip_low_threshold": 0.25}
    assert len(call.data) == 2
    for got, want in zip(call.data, datums, strict=True):
        assert isinstance(got, types.Datum)
        # Chunk boundaries survive, not just the flat token list.
        assert [c.tokens for c in got.model_input.chunks] == [c.tokens for c in want.model_input.chunks]
        assert sorted(got.loss_fn_inputs) == sorted(want.loss_fn_inputs)
        for key, tensor in want.loss_fn_inputs.items():
            assert_tensor_equal(got.loss_fn_inputs[key], tensor)
    # The sparse tensor densifies to the matrix it stands for: row 0 has 1.5 at column 2, row 1 has -2.5 at column 0.
    dense = call.data[0].loss_fn_inputs["sparse"].to_torch().tolist()
    assert dense == [[0.0, 0.0, 1.5], [-2.5, 0.0, 0.0]]


def test_forward_only_flag_and_empty_loss_config_decode():
    call = wire.decode_forward_backward(sdk_body([ce([1, 2, 3])], forward_only=True))
    assert call.forward_only is True
    assert call.loss_fn_config is None  # no config sent: None, not {}


def test_loss_config_prefers_v2_numbers_and_falls_back_to_the_legacy_map():
    msg = valid_msg()
    msg.loss_fn_config_v2["clip_low_threshold"].number = 0.1  # double: exact
    msg.loss_fn_config["clip_low_threshold"] = 0.9  # an old client's value for the same key: v2 wins
    msg.loss_fn_config["clip_high_threshold"] = 1.5  # only in the legacy map (old SDKs): still read
    call = wire.decode_forward_backward(msg.SerializeToString())
    assert call.loss_fn_config == {"clip_low_threshold": 0.1, "clip_high_threshold": 1.5}


def test_int32_tensors_decode_as_int64_as_the_sdk_reads_them():
    msg = valid_msg()
    msg.data[0].loss_fn_inputs["target_tokens"].CopyFrom(
        pb.Tensor(dtype=pb.DTYPE_INT32, dense=np.array([5, -1], dtype=np.int32).tobytes()))
    tensor = wire.decode_forward_backward(msg.SerializeToString()).data[0].loss_fn_inputs["target_tokens"]
    assert tensor.dtype == "int64"
    assert tensor.to_numpy().tolist() == [5, -1]


def _set_text_config(msg):
    msg.loss_fn_config_v2["mode"].text = "fast"


def _set_image_chunk(msg):
    msg.data[0].model_input.add().image.data = b"\x89PNG"


def _set_odd_token_bytes(msg):
    msg.data[0].model_input[0].encoded_text.tokens = b"\x01\x00\x00"


def _set_bfloat16_input(msg):
    msg.data[0].loss_fn_inputs["weights"].CopyFrom(pb.Tensor(dtype=pb.DTYPE_BFLOAT16, dense=b"\x00\x00"))


def _set_short_float_buffer(msg):
    msg.data[0].loss_fn_inputs["weights"].CopyFrom(pb.Tensor(dtype=pb.DTYPE_FLOAT32, dense=b"\x00\x00\x80"))


def _set_shape_that_does_not_fit(msg):
    msg.data[0].loss_fn_inputs["weights"].CopyFrom(
        pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[3], dense=np.ones(2, np.float32).tobytes()))


@pytest.mark.parametrize(
    ("corrupt", "field"),
    [
        (lambda m: m.ClearField("model_id"), "model_id is empty"),
        (lambda m: m.ClearField("loss_fn"), "loss_fn is empty"),
        (lambda m: m.ClearField("data"), "data is empty"),
        (_set_text_config, "loss_fn_config['mode'] is 'fast'"),
        (_set_image_chunk, r"data[0].model_input[1] is a image chunk"),
        (_set_odd_token_bytes, "data[0].model_input[0].tokens has 3 bytes"),
        (_set_bfloat16_input, "data[0].loss_fn_inputs['weights'] has dtype"),
        (_set_short_float_buffer, "data[0].loss_fn_inputs['weights'] does not decode"),
        (_set_shape_that_does_not_fit, "data[0].loss_fn_inputs['weights'] does not decode"),
    ],
    ids=["model_id", "loss_fn", "data", "text_config", "image_chunk", "token_bytes", "dtype", "buffer", "shape"],
)
def test_bad_forward_backward_body_is_a_400_naming_the_field(corrupt, field):
    msg = valid_msg()
    corrupt(msg)
    with pytest.raises(BadRequest) as caught:
        wire.decode_forward_backward(msg.SerializeToString())
    assert field in str(caught.value)
    assert caught.value.status_code == 400


def test_bytes_that_are_not_a_protobuf_are_a_400_saying_what_to_send():
    with pytest.raises(BadRequest, match="not a tinker ForwardBackwardRequest protobuf.*application/x-protobuf"):
        wire.decode_forward_backward(b"\x0a\xff\xff\xff\xff\x0f garbage")


# -- Content-Encoding -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", [None, "", "identity", " Identity "])
def test_identity_bodies_pass_through_untouched(encoding):
    assert wire.decompress(b"raw bytes", encoding, max_bytes=3) == b"raw bytes"  # the size limit is auth's job here


@pytest.mark.parametrize("encoding", ["zstd", "ZSTD", " zstd "])
def test_zstd_body_inflates_to_the_original_bytes(encoding):
    body = sdk_body([ce(list(range(1, 200)))])
    assert wire.decompress(zstandard.ZstdCompressor().compress(body), encoding, len(body)) == body


def test_zstd_body_inflating_past_the_limit_is_a_413_and_at_the_limit_is_fine():
    original = bytes(range(256)) * 64
    stream = zstandard.ZstdCompressor().compressobj()  # no content size in the frame header: found by inflating
    body = stream.compress(original) + stream.flush()
    assert wire.decompress(body, "zstd", len(original)) == original
    with pytest.raises(BadRequest, match=f"exceeds the server limit of {len(original) - 1} bytes") as caught:
        wire.decompress(body, "zstd", len(original) - 1)
    assert caught.value.status_code == 413


def test_unknown_encoding_is_a_415_and_bad_zstd_a_400():
    with pytest.raises(BadRequest, match="'br' is not supported; send identity or zstd") as caught:
        wire.decompress(b"x", "br", 100)
    assert caught.value.status_code == 415
    with pytest.raises(BadRequest, match="not valid zstd") as caught:
        wire.decompress(b"not zstd at all", "zstd", 100)
    assert caught.value.status_code == 400


def test_zstd_body_of_several_frames_inflates_whole():
    compressor = zstandard.ZstdCompressor()
    body = compressor.compress(b"first frame;") + compressor.compress(b"second frame")
    assert wire.decompress(body, "zstd", 1000) == b"first frame;second frame"


def test_truncated_zstd_body_is_refused():
    full = zstandard.ZstdCompressor().compress(bytes(range(256)) * 64)
    with pytest.raises(BadRequest, match="zstd"):
        wire.decompress(full[: len(full) // 2], "zstd", 10**6)


# -- requests: JSON ---------------------------------------------------------------------------------------------------


def test_json_request_written_by_the_sdk_parses_to_an_equal_tinker_object():
    requests = [
        types.OptimStepRequest(model_id="s:train:0", seq_id=3,
                               adam_params=types.AdamParams(learning_rate=3e-4, beta2=0.99, grad_clip_norm=1.0)),
        types.SampleRequest(sampling_session_id="s:sample:1", seq_id=2, num_samples=4,
                            prompt=types.ModelInput.from_ints([1, 2, 3]),
                            sampling_params=types.SamplingParams(max_tokens=5, stop=["\n"], temperature=0.5, seed=9)),
    ]
    for request in requests:
        body = json.dumps(request.model_dump(mode="json")).encode()
        parsed = wire.parse_json(type(request), body)
        assert type(parsed) is type(request)
        assert parsed == request


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", r"OptimStepRequest: body is not valid JSON"),
        (b"\xff\xfe", r"OptimStepRequest: body is not valid JSON"),
        (b"", r"OptimStepRequest: body must be a JSON object, got NoneType"),
        (b"[1, 2]", r"OptimStepRequest: body must be a JSON object, got list"),
        (b'{"model_id": "m", "adam_params": {"learning_rate": "fast"}}',
         r"adam_params\.(AdamParams\.)?learning_rate: .* \(got 'fast'\)"),
        (b'{"adam_params": {"learning_rate": 0.1}}', r"model_id: Field required"),
    ],
    ids=["syntax", "not_utf8", "empty", "array", "wrong_type", "missing_field"],
)
def test_bad_json_body_is_a_400_naming_the_model_and_the_field(body, message):
    with pytest.raises(BadRequest, match=message) as caught:
        wire.parse_json(types.OptimStepRequest, body)
    assert caught.value.status_code == 400
    assert isinstance(caught.value, ValueError)


def test_long_bad_values_are_shortened_in_the_message():
    body = json.dumps({"model_id": "m", "adam_params": {"learning_rate": "x" * 500}}).encode()
    with pytest.raises(BadRequest) as caught:
        wire.parse_json(types.OptimStepRequest, body)
    assert "x" * 60 not in str(caught.value) and "..." in str(caught.value)


# -- responses --------------------------------------------------------------------------------------------------------


def test_forward_backward_output_reads_back_through_the_sdk():
    out = types.ForwardBackwardOutput(
        loss_fn_output_type="ArrayRecord",
        loss_fn_outputs=[  # ragged: datums of different lengths, one empty
            {"logprobs": types.TensorData(data=[-0.5, -1.25, -3.0], dtype="float32")},
            {"logprobs": types.TensorData(data=[], dtype="float32")},
            {"logprobs": types.TensorData(data=[-0.125], dtype="float32")},
        ],
        metrics={"loss:sum": 4.875, "clip_fraction:mean": 0.25},
    )
    payload = wire.encode_forward_backward_output(out)
    assert isinstance(payload, wire.ProtoPayload)
    back = deserialize_forward_backward_output(payload.data)
    assert back.loss_fn_output_type == "ArrayRecord"
    assert back.metrics == out.metrics
    assert len(back.loss_fn_outputs) == 3
    for got, want in zip(back.loss_fn_outputs, out.loss_fn_outputs, strict=True):
        assert got["logprobs"].dtype == "float32"
        assert got["logprobs"].to_numpy().tolist() == want["logprobs"].to_numpy().tolist()


def test_integer_outputs_and_no_outputs_read_back_through_the_sdk():
    out = types.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord",
                                      loss_fn_outputs=[{"ids": types.TensorData(data=[2**40, -3], dtype="int64")}],
                                      metrics={})
    back = deserialize_forward_backward_output(wire.encode_forward_backward_output(out).data)
    assert back.loss_fn_outputs[0]["ids"].dtype == "int64"
    assert back.loss_fn_outputs[0]["ids"].to_numpy().tolist() == [2**40, -3]
    empty = types.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[], metrics={"a:sum": 1.0})
    back = deserialize_forward_backward_output(wire.encode_forward_backward_output(empty).data)
    assert back.loss_fn_outputs == [] and back.metrics == {"a:sum": 1.0}


def sequence(stop_reason: str, tokens: list[int], logprobs: list[float]) -> types.SampledSequence:
    return types.SampledSequence(stop_reason=stop_reason, sequence_id="seq",  # type: ignore[arg-type]
                                 tokens_np=np.array(tokens, np.int32), logprobs_np=np.array(logprobs, np.float32))


def test_sample_response_reads_back_through_the_sdk():
    resp = types.SampleResponse(
        sequences=[sequence("stop", [5, 70_000, 2], [-0.5, -1.5, -0.25]), sequence("length", [9], [-2.0])],
        prompt_logprobs_np=np.array([np.nan, -0.75, -4.0], np.float32),  # NaN: the first token has none
        prompt_cache_hit_tokens=3,
    )
    back = deserialize_sample_response(wire.encode_sample_response(resp).data)
    assert [s.stop_reason for s in back.sequences] == ["stop", "length"]
    assert [s.tokens for s in back.sequences] == [[5, 70_000, 2], [9]]
    assert [s.logprobs for s in back.sequences] == [[-0.5, -1.5, -0.25], [-2.0]]
    assert back.prompt_logprobs == [None, -0.75, -4.0]
    assert back.prompt_cache_hit_tokens == 3


def test_sample_response_without_prompt_logprobs_has_none():
    resp = types.SampleResponse(sequences=[sequence("length", [1], [-1.0])])
    assert deserialize_sample_response(wire.encode_sample_response(resp).data).prompt_logprobs is None


def test_rlvr_paths_are_written_as_tinker_paths():
    assert wire.to_wire_path("rlvr://run-1/weights/step-3") == "tinker://run-1/weights/step-3"
    assert wire.to_wire_path("tinker://run-1/sampler_weights/x") == "tinker://run-1/sampler_weights/x"
    assert wire.to_wire_path("/tmp/rlvr://x") == "/tmp/rlvr://x"  # only the scheme is rewritten


def test_json_body_dumps_models_without_nones_and_passes_dicts_through():
    body = wire.json_body(types.SaveWeightsResponse(path="tinker://r/weights/a"))
    assert body == {"path": "tinker://r/weights/a"}  # type=None left out
    body = wire.json_body(types.SaveWeightsResponse(path="tinker://r/weights/a", type="save_weights"))
    assert body == {"path": "tinker://r/weights/a", "type": "save_weights"}
    assert json.loads(json.dumps(body)) == body
    assert wire.json_body({"status": "ok"}) == {"status": "ok"}
    assert wire.json_body(None) is None


def test_bad_request_is_a_value_error_carrying_its_status():
    assert isinstance(BadRequest("x"), ValueError)
    assert BadRequest("x").status_code == 400 and BadRequest("x", 413).status_code == 413
