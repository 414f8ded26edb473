"""A chat endpoint whose model writes what a test says: ``tiny``'s outputs are noise, so a test that needs a tool call
(or any exact text) scripts it, shared by the server and verifiers tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlvr import types


def script_chat(monkeypatch, write: Callable[[str], str | None]) -> list[str]:
    """Make rlvr's OpenAI endpoint (in process and the live test server alike) answer each request with the text
    ``write(prompt text)`` returns, then EOS (a stream gets it whole at the end), or sample for real where it returns
    None. Scripted tokens carry the model's own logprobs of them, so they train as sampled ones would. Returns the
    prompts seen, as text."""
    from rlvr.server import openai as endpoint

    real = endpoint._sample
    seen: list[str] = []

    async def sample(client, prompt: list[int], req, max_tokens, top: int, field: str, watch=None
                     ) -> types.SampleResponse:
        tokenizer = client.get_tokenizer()
        seen.append(tokenizer.decode(prompt))
        text = write(seen[-1])
        if text is None:
            return await real(client, prompt, req, max_tokens, top, field, watch)
        tokens = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        logprobs = (await client.compute_logprobs(types.ModelInput.from_ints(prompt + tokens)))[len(prompt):]
        return types.SampleResponse(sequences=[
            types.SampledSequence(stop_reason="stop", sequence_id=f"scripted-{i}", tokens_np=np.asarray(tokens),
                                  logprobs_np=np.asarray(logprobs, dtype=np.float32)) for i in range(req.n)])

    monkeypatch.setattr(endpoint, "_sample", sample)
    return seen
