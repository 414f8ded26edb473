"""``rlvr serve``: Tinker's HTTP protocol over the local engine, so code written for the official ``tinker`` SDK or
tinker-cookbook trains on this machine by setting ``TINKER_BASE_URL`` (and a ``tml-`` API key).

    from rlvr.server import serve
    serve(port=8000, api_keys="tml-...")          # or create_app(...) for any ASGI server

Needs the ``rlvr[server]`` extra (fastapi, uvicorn). Modules: ``app`` (the app, ``serve``), ``routes/`` (the
``/api/v1`` routes by concern: sessions, training, sampling, futures, the RestClient's), ``state`` (sessions, models,
ordering, futures), ``wire`` (protobuf/JSON bodies), ``auth`` (API keys, body limits), ``openai`` (OpenAI-compatible
sampling at ``/v1``), ``generate`` (vLLM's token-in/token-out ``/inference/v1/generate``), ``in_process`` (both in
process: ``openai_client(service)`` is an ``openai.AsyncOpenAI`` on them, with no socket), ``catalog`` (runs and
checkpoints), ``signing`` (signed download URLs), ``hub`` (tokenizer folders, and a hub-shaped view of them at
``/hf``).
Not here: anything about training itself, which is ``rlvr.client`` on ``rlvr.engine``.
"""

from __future__ import annotations

from rlvr.server.app import create_app, serve
from rlvr.server.auth import load_api_keys
from rlvr.server.in_process import create_openai_app, openai_client

__all__ = ["create_app", "create_openai_app", "load_api_keys", "openai_client", "serve"]
