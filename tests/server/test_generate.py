"""vLLM's token-in/token-out route (``rlvr.server.generate``) against a live ``rlvr serve``, sent the request verifiers
0.4's ``TrainClient`` sends (``renderers.client.generate`` builds it: the prompt's token ids, the caller's sampling
settings plus ``stop_token_ids``, ``logprobs=1`` and ``skip_special_tokens=false``). Every number is checked against
the engine's own: the same seed samples the same tokens, and the logprobs are a forward's over prompt + sample."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest
from tinker import types

pytest.importorskip("fastapi", reason="rlvr serve needs the server extra: pip install 'rlvr[server]'")

PROMPT = list(b"Q: 2+2? A:")


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=f"{server.base_url}/inference/v1",
                      headers={"Authorization": f"Bearer {server.api_key}"}, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def engine(service):
    return service.create_sampling_client(base_model="tiny")


@pytest.fixture(scope="module")
def eos(engine) -> int:
    return engine.get_tokenizer().eos_token_id


def _train_client_body(prompt: list[int], eos: int, **sampling) -> dict:
    """The body ``renderers.client.generate`` posts (renderers 0.1.12): ``sampling`` as the env's sampling config
    dumps it (``exclude_none``), then the three fields it always sets."""
    return {"model": "tiny", "token_ids": prompt,
            "sampling_params": {**sampling, "stop_token_ids": [eos], "logprobs": 1, "skip_special_tokens": False}}


def _engine_logprobs(engine, prompt: list[int], tokens: list[int]) -> list[float]:
    return engine.compute_logprobs(types.ModelInput.from_ints(prompt + tokens)).result()[len(prompt):]


def test_the_train_clients_request_gets_the_engines_tokens_and_logprobs(http, engine, eos):
    r = http.post("/generate", json=_train_client_body(PROMPT, eos, temperature=1.0, max_tokens=12, seed=5))
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["prompt_token_ids"] == PROMPT and out["request_id"]
    [choice] = out["choices"]
    same = engine.sample(types.ModelInput.from_ints(PROMPT), 1, types.SamplingParams(
        max_tokens=12, temperature=1.0, seed=5, stop=[eos])).result().sequences[0]
    assert choice["token_ids"] == same.tokens and choice["finish_reason"] == same.stop_reason
    content = choice["logprobs"]["content"]
    assert [c["token"] for c in content] == [f"token_id:{t}" for t in choice["token_ids"]]  # what renderers checks
    np.testing.assert_allclose([c["logprob"] for c in content], _engine_logprobs(engine, PROMPT, same.tokens),
                               atol=1e-4)
    assert all(len(c["top_logprobs"]) == 1 and c["top_logprobs"][0]["logprob"] >= c["logprob"] - 1e-4
               for c in content)
    assert out["usage"] == {"prompt_tokens": len(PROMPT), "completion_tokens": len(same.tokens),
                            "total_tokens": len(PROMPT) + len(same.tokens)}


def test_sampling_settings_are_honoured(http, engine, eos):
    def generate(**sampling) -> list[dict]:
        r = http.post("/generate", json={"model": "tiny", "token_ids": PROMPT, "sampling_params": sampling})
        assert r.status_code == 200, r.text
        return r.json()["choices"]

    three = generate(n=3, max_tokens=6, seed=1, logprobs=0)
    assert [c["index"] for c in three] == [0, 1, 2] and len({tuple(c["token_ids"]) for c in three}) > 1
    assert generate(n=3, max_tokens=6, seed=1, logprobs=0) == three  # a seed reproduces
    assert all(c["logprobs"] is None for c in generate(max_tokens=3))  # no logprobs asked, none given
    greedy = generate(temperature=0, max_tokens=8, top_k=0)[0]["token_ids"]
    assert greedy == engine.sample(types.ModelInput.from_ints(PROMPT), 1, types.SamplingParams(
        max_tokens=8, temperature=0)).result().sequences[0].tokens
    long = generate(max_tokens=10, seed=2, stop_token_ids=[])[0]
    assert len(long["token_ids"]) <= 10
    stop_at = long["token_ids"][3]  # a token it samples with this seed: stopping there ends the sample there
    stopped = generate(max_tokens=10, seed=2, stop_token_ids=[stop_at])[0]
    assert stopped["token_ids"][-1] == stop_at and stopped["finish_reason"] == "stop"
    assert stopped["token_ids"] == long["token_ids"][:long["token_ids"].index(stop_at) + 1]


BAD_REQUESTS = [
    ({"token_ids": None}, "token_ids", "token_ids is required"),
    ({"token_ids": []}, "token_ids", "at least 1 item"),
    ({"token_ids": [1, True]}, "token_ids.1", "valid integer"),
    ({"token_ids": ["5"]}, "token_ids.0", "valid integer"),
    ({"token_ids": [-1]}, "token_ids.0", "greater than or equal to 0"),
    ({"token_ids": [300000]}, "token_ids", "outside the vocabulary"),
    ({"token_ids": [5] * 9000}, "token_ids", "fills the model's context"),
    ({"model": None}, "model", "model is required"),
    ({"sampling_params": {"temperature": -1}}, "sampling_params.temperature", "greater than or equal to 0"),
    ({"sampling_params": {"logprobs": 21}}, "sampling_params.logprobs", "less than or equal to 20"),
    ({"sampling_params": {"min_p": 0.1}}, "sampling_params.min_p", "not supported"),
    ({"sampling_params": {"repetition_penalty": 1.1}}, "sampling_params.repetition_penalty", "no penalties"),
    ({"sampling_params": {"stop": ["x"], "stop_token_ids": [5]}}, "sampling_params.stop", "send stop_token_ids only"),
    ({"sampling_params": {"stop_token_ids": [300000]}}, "sampling_params.stop_token_ids", "outside the vocabulary"),
    ({"sampling_params": "hot"}, "sampling_params", "valid dictionary"),
    ({"stream": True}, "stream", "each sample whole"),
]


@pytest.mark.parametrize(("change", "param", "says"), BAD_REQUESTS, ids=[p for _, p, _ in BAD_REQUESTS])
def test_a_malformed_request_is_400_naming_the_field_and_the_next_request_is_served(http, eos, change, param, says):
    body = {k: v for k, v in {**_train_client_body(PROMPT, eos, max_tokens=2), **change}.items() if v is not None}
    refused = http.post("/generate", content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and says in error["message"], error
    assert (error["code"] == "context_length_exceeded") == ("context" in says)  # how clients tell an overflow
    ok = http.post("/generate", json=_train_client_body(PROMPT, eos, max_tokens=2))
    assert ok.status_code == 200 and ok.json()["choices"][0]["token_ids"]


def test_keys_models_and_bodies_are_refused_in_openais_shape(server, http, eos):
    body = _train_client_body(PROMPT, eos, max_tokens=2)
    no_key = httpx.post(f"{server.base_url}/inference/v1/generate", json=body, timeout=30)
    assert no_key.status_code == 401 and no_key.json()["error"]["message"].startswith("missing API key")
    unknown = http.post("/generate", json={**body, "model": "gpt-4o"})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    not_json = http.post("/generate", content=b"{nope", headers={"Content-Type": "application/json"})
    assert not_json.status_code == 400 and "not JSON" in not_json.json()["error"]["message"]
    elsewhere = http.post("/chat", json=body)
    assert elsewhere.status_code == 404 and "POST /inference/v1/generate" in elsewhere.json()["error"]["message"]


def test_the_in_process_client_serves_the_route_too(service, http, eos):
    from rlvr.server import openai_client

    async def post() -> dict:
        client = openai_client(service)
        # how renderers reaches it: the OpenAI client's base URL without its /v1, then the route
        base = str(client.base_url).rstrip("/").removesuffix("/v1")
        reply = await client.post(f"{base}/inference/v1/generate", cast_to=httpx.Response,
                                  body=_train_client_body(PROMPT, eos, max_tokens=5, seed=4))
        return reply.json()

    served = http.post("/generate", json=_train_client_body(PROMPT, eos, max_tokens=5, seed=4)).json()
    assert asyncio.run(post())["choices"] == served["choices"]
