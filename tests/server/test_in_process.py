"""``rlvr.server.in_process.LoopbackEndpoint``: rlvr's sampling routes on a loopback port behind a key of its own,
serving one sampling client's weights at a time (what verifiers 0.4's ``TrainClient``, which takes only a URL, samples
from in process)."""

from __future__ import annotations

import httpx
import pytest
from tinker import types

pytest.importorskip("uvicorn", reason="the loopback endpoint needs the server extra: pip install 'rlvr[server]'")

PROMPT = [1, 2, 3, 4]


def test_the_loopback_endpoint_serves_the_latest_sampler_behind_its_key(service):
    from rlvr.server.in_process import LoopbackEndpoint

    endpoint = LoopbackEndpoint(service)
    try:
        assert endpoint.url.startswith("http://127.0.0.1:") and endpoint.key.startswith("tml-")
        body = {"model": "tiny", "token_ids": PROMPT, "sampling_params": {"max_tokens": 4, "seed": 2, "logprobs": 0}}
        assert httpx.post(f"{endpoint.url}/inference/v1/generate", json=body, timeout=30).status_code == 401
        key = {"Authorization": f"Bearer {endpoint.key}"}
        trained = service.create_lora_training_client("tiny", rank=4, seed=5)
        samplers = [service.create_sampling_client(base_model="tiny"),
                    trained.save_weights_and_get_sampling_client("loopback")]
        for sampler in samplers:
            name = endpoint.serve(sampler)
            reply = httpx.post(f"{endpoint.url}/inference/v1/generate", json={**body, "model": name}, headers=key,
                               timeout=30).json()
            [choice] = reply["choices"]
            full = sampler.compute_logprobs(types.ModelInput.from_ints(PROMPT + choice["token_ids"])).result()
            got = [c["logprob"] for c in choice["logprobs"]["content"]]
            assert max(abs(a - b) for a, b in zip(got, full[len(PROMPT):], strict=True)) < 1e-4
        first, second = (s.model_path or s.get_base_model() for s in samplers)
        assert first != second
        assert list(endpoint._models.pinned) == [second]  # the earlier client is let go: one step's weights at a time
        again = httpx.post(f"{endpoint.url}/inference/v1/generate", json={**body, "model": first}, headers=key,
                           timeout=30)
        assert again.status_code == 200  # "tiny" names the base model again
    finally:
        endpoint.close()
