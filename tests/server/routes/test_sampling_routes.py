"""``rlvr.server.routes.sampling``: a sampling session on ``tiny``, what ``samplers/{id}`` says of it, and ``asample``'s
refusals and its future (protobuf, one sequence id per sample)."""

from __future__ import annotations

import asyncio

import pytest
from tinker import types
from tinker.proto import tinker_public_pb2 as pb

from rlvr.server import wire
from rlvr.server.routes import sampling
from rlvr.server.state import UnknownId

PROMPT = types.ModelInput.from_ints([1, 2, 3]).model_dump(mode="json")


@pytest.fixture(scope="module")
def sampler(api) -> str:
    r = api.post("/create_sampling_session", json={"session_id": api.session(), "sampling_session_seq_id": 0,
                                                    "base_model": "tiny"})
    assert r.status_code == 200, r.text
    return r.json()["sampling_session_id"]


def test_a_sampler_says_what_it_samples(api, sampler):
    found = asyncio.run(sampling.get_sampler(sampler, api.ctx, api.owner))
    assert found == {"sampler_id": sampler, "base_model": "tiny"}  # no model_path: a base model
    with pytest.raises(UnknownId):  # another key's sampler is unknown to it
        asyncio.run(sampling.get_sampler(sampler, api.ctx, "someone-else"))
    assert api.get(f"/samplers/{sampler}", api.other).status_code == 404


def test_a_sampling_session_needs_a_live_session_of_the_caller(api):
    body = {"session_id": api.session(), "sampling_session_seq_id": 0, "base_model": "tiny"}
    assert api.post("/create_sampling_session", api.other, json=body).status_code == 404


def test_asample_answers_with_a_future_of_num_samples_sequences(api, sampler):
    r = api.post("/asample", json={"sampling_session_id": sampler, "num_samples": 2, "prompt": PROMPT,
                                   "sampling_params": {"max_tokens": 3, "seed": 1}})
    request_id = r.json()["request_id"]
    assert r.json()["sample_sequence_ids"] == [f"{request_id}:0", f"{request_id}:1"]
    done = api.result(r)
    assert done.headers["content-type"].startswith(wire.PROTO_CONTENT_TYPE)
    response = pb.SampleResponse()
    response.ParseFromString(done.content)
    assert len(response.sequences) == 2


@pytest.mark.parametrize(("change", "says"), [
    ({"sampling_session_id": None}, "asample needs sampling_session_id; create one with create_sampling_client"),
    ({"num_samples": 0}, "num_samples=0 must be >= 1"),
])
def test_asample_refusals_name_the_field(api, sampler, change, says):
    body = {"sampling_session_id": sampler, "num_samples": 1, "prompt": PROMPT, "sampling_params": {"max_tokens": 2},
            **change}
    r = api.post("/asample", json=body)
    assert r.status_code == 400 and r.json()["detail"] == says
