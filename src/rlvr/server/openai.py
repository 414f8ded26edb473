"""OpenAI-compatible sampling: ``GET /v1/models``, ``POST /v1/completions`` and ``POST /v1/chat/completions``, served
by rlvr's own sampler, so agent code and libraries that take an OpenAI client sample from rlvr models and checkpoints.

    client = openai_client(service)                    # in process (in_process.py): an openai.AsyncOpenAI, no socket
    await client.chat.completions.create(model="tiny", messages=[...], logprobs=True, seed=1)

``rlvr serve`` mounts the same routes at ``/v1``, behind its API keys. ``model`` is a base model, a sampler
checkpoint (``rlvr://<run>/sampler_weights/<name>``, or its bare name when one run has it) or, in process, a sampling
client handed to ``openai_client``; ``/v1/models`` lists them.

Contract: the request fields OpenAI and vLLM define for sampling are honoured (the chat template, ``n``, the
sampling parameters, ``stop``, ``seed``, ``logprobs`` / ``top_logprobs``, ``echo`` with prompt logprobs, tools with
``tool_choice`` ``"auto"`` or ``"none"``, ``stream``); every other known field is a 400 naming it. Each choice carries
``token_ids`` (every sampled token, stop string and EOS included) and the response ``prompt_token_ids``, and logprobs
are under the model at temperature 1, the numbers a training client's forward gives. A stream's chunks of a choice
concatenate to the non-streamed choice of the same seed; a client that disconnects cancels its rows at the next
decode step. Errors have OpenAI's shape: 400 (naming the field and the fix), 401, 404; one after a stream began is its
last event before ``[DONE]``. Every field, covered or refused: ``docs/server.md`` ("OpenAI-compatible sampling").

Not here: request bodies, prompts and the error shape (``openai_wire.py``), rendering tools and parsing tool calls
(``openai_tools.py``), the text of a stream and its calls' events (``openai_stream.py``), the sampling itself
(``rlvr.SamplingClient.sample``), which checkpoints exist and whose they are (``catalog.py``), the Tinker protocol
(``routes/``), vLLM's token-in/token-out route (``generate.py``, over the same ``Models``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from tinker import types

from rlvr.client import SamplingClient
from rlvr.engine.sample.scores import PromptTopk
from rlvr.engine.sample.watch import Watch
from rlvr.errors import ContextFullError, InvalidDatumError, RlvrError
from rlvr.server import openai_wire as bodies
from rlvr.server.auth import BodyTooLarge
from rlvr.server.catalog import Catalog
from rlvr.server.openai_stream import Calls, ChoiceText, choice_text, event_stream, pieces
from rlvr.server.openai_tools import parse_tool_calls
from rlvr.server.openai_wire import ChatRequest, CompletionRequest, OpenAIError, SamplingRequest
from rlvr.server.state import ServerState, UnknownId

__all__ = ["Models", "TokenStrings", "openai_routes", "sampling_app"]

log = logging.getLogger("rlvr.server")

IN_PROCESS_OWNER = "in-process"
"""Whose checkpoints the in-process app serves: with no server keys, every run on disk is visible."""


# -- which sampling client serves `model` ----------------------------------------------------------------------------

class Models:
    """Resolves a request's ``model`` to a ``rlvr.SamplingClient`` and lists what ``/v1/models`` shows.

    Clients are kept for the last ``keep`` checkpoints and every base model, so a checkpoint's adapter is not read
    from disk on every request; a checkpoint saved again under the same name gets a new client."""

    def __init__(self, state: ServerState, catalog: Catalog, pinned: dict[str, SamplingClient],
                 keep: int = 8) -> None:
        self.state, self.catalog, self.pinned, self.keep = state, catalog, pinned, keep
        self._clients: OrderedDict[tuple[str, int | None], SamplingClient] = OrderedDict()

    def base_models(self) -> list[str]:
        return [m.model_name for m in self.state.service.get_server_capabilities().supported_models if m.model_name]

    def checkpoints(self, owner: str) -> list[tuple[str, types.Checkpoint]]:
        """(run id, checkpoint) of every sampler checkpoint ``owner`` may sample."""
        return [(run, c) for run in self.catalog.runs(owner) for c in self.catalog.checkpoints(run, owner)
                if c.checkpoint_type == "sampler"]

    def listing(self, owner: str) -> list[dict[str, Any]]:
        now = int(time.time())
        found = {name: {"created": now, "parent": c.get_base_model() if c.model_path else None}
                 for name, c in self.pinned.items()}
        for name in self.base_models():
            found.setdefault(name, {"created": 0, "parent": None})
        for run, ckpt in self.checkpoints(owner):
            path = f"rlvr://{run}/{ckpt.checkpoint_id}"
            meta = self.catalog.root() / run / ckpt.checkpoint_id / "rlvr.json"
            base = json.loads(meta.read_text()).get("base_model") if meta.exists() else None
            found.setdefault(path, {"created": int(ckpt.time.timestamp()), "parent": base})
        return [{"id": name, "object": "model", "owned_by": "rlvr", "root": name, **info}
                for name, info in found.items()]

    async def client(self, model: str, owner: str) -> SamplingClient:
        from rlvr.engine.models.load import canonical_name
        from rlvr.home import resolve

        if model in self.pinned:
            return self.pinned[model]
        path = self.checkpoint_path(model, owner)
        if path is None:
            key, create = (canonical_name(model), None), {"base_model": model}
        else:  # keyed by the file's time too: a checkpoint saved again under its name is new weights
            meta = resolve(path) / "rlvr.json"
            key, create = (path, meta.stat().st_mtime_ns if meta.exists() else None), {"model_path": path}
        if key not in self._clients:
            try:
                self._clients[key] = await run_in_threadpool(self.state.service.create_sampling_client, **create)
            except RlvrError as exc:
                raise OpenAIError(404, f"model={model!r} cannot be loaded: {exc}", "model", "model_not_found") from exc
            checkpoints = [k for k in self._clients if k[0].startswith("rlvr://")]
            if len(checkpoints) > self.keep:
                del self._clients[checkpoints[0]]
        self._clients.move_to_end(key)
        return self._clients[key]

    def checkpoint_path(self, model: str, owner: str) -> str | None:
        """The ``rlvr://`` path of the sampler checkpoint of ``owner``'s that ``model`` names; None for a base model.
        Raises a 404 naming what is served when it is neither."""
        from rlvr.engine.models.load import canonical_name
        from rlvr.home import SCHEMES

        self.catalog.sweep()
        if model.startswith(SCHEMES) or "/sampler_weights/" in model:
            parts = model.split("://", 1)[-1].split("/")
            if len(parts) != 3 or parts[1] != "sampler_weights" or not parts[2] or parts[2].startswith("."):
                raise OpenAIError(404, f"model={model!r} is not a sampler checkpoint: sample from "
                                       "rlvr://<run>/sampler_weights/<name> (save_weights_for_sampler writes one)",
                                  "model", "model_not_found")
            return f"rlvr://{self.catalog.run_id(parts[0], owner)}/sampler_weights/{parts[2]}"
        if canonical_name(model) in {canonical_name(m) for m in self.base_models()}:
            return None
        named = [f"rlvr://{run}/{c.checkpoint_id}" for run, c in self.checkpoints(owner)
                 if c.checkpoint_id == f"sampler_weights/{model}"]
        if len(named) > 1:
            raise OpenAIError(400, f"model={model!r} names a sampler checkpoint of {len(named)} runs; give its full "
                                   f"path, one of {named}", "model")
        if not named:
            raise OpenAIError(404, f"model={model!r} is neither a base model ({', '.join(self.base_models())}) nor a "
                                   "sampler checkpoint; GET /v1/models lists what is served", "model",
                              "model_not_found")
        return named[0]


# -- responses --------------------------------------------------------------------------------------------------------

def _params(req: SamplingRequest, max_tokens: int | None) -> types.SamplingParams:
    return types.SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                                stop=list(req.stop) or None, seed=req.seed)


async def _sample(client: SamplingClient, prompt: list[int], req: SamplingRequest, max_tokens: int | None,
                  top: int, field: str, watch: Watch | None = None) -> types.SampleResponse:
    """Sample ``prompt``, the request's ``field`` (``prompt`` or ``messages``) as tokens, handing ``watch`` the tokens
    as they are drawn (the distributed clients, and one without ``sample_watched``, hand it none); the
    engine's refusals of the prompt (a token outside the vocabulary, a prompt that fills the context) name that
    field. ``max_tokens=0`` (an echo that only scores its prompt) gives ``req.n`` empty sequences."""
    if max_tokens == 0:
        empty = types.SampledSequence(stop_reason="length", sequence_id=uuid.uuid4().hex, _tokens_list=[],
                                      _logprobs_list=[])
        return types.SampleResponse(sequences=[empty] * req.n)
    model_input, params = types.ModelInput.from_ints(prompt), _params(req, max_tokens)
    try:
        if watch is not None and hasattr(client, "sample_watched"):
            return await client.sample_watched(watch, model_input, req.n, params, topk_sample_logprobs=top)
        return await client.sample(model_input, req.n, params, topk_sample_logprobs=top)
    except RlvrError as exc:
        raise _refusal(exc, field) from exc


async def _score_prompt(client: SamplingClient, prompt: list[int], top: int) -> PromptTopk:
    """The logprobs of ``prompt``'s tokens and its ``top`` alternatives at each position, for an echo."""
    if not hasattr(client, "compute_topk_logprobs_async"):
        raise OpenAIError(400, f"echo with logprobs needs a sampler that scores prompts, which "
                               f"{type(client).__name__} does not; leave logprobs unset or serve the model from "
                               "rlvr's engine", "echo")
    try:
        return await client.compute_topk_logprobs_async(types.ModelInput.from_ints(prompt), top)
    except RlvrError as exc:
        raise _refusal(exc, "prompt") from exc


def _refusal(exc: RlvrError, field: str) -> OpenAIError:
    """The engine's refusal of a request's ``field`` (a token outside the vocabulary, a prompt that fills the
    context) as a 400 naming it."""
    if isinstance(exc, ContextFullError):
        return OpenAIError(400, f"{field}: {exc}", field, "context_length_exceeded")
    if isinstance(exc, InvalidDatumError):
        return OpenAIError(400, f"{field}: {exc}", field)
    return OpenAIError(400, str(exc))


def _prompt_texts(prompt: str | list[str] | list[int] | list[list[int]], prompts: list[list[int]],
                  tokenizer: Any) -> list[str]:
    """Each prompt's text as an echo begins with it: as sent, or its token ids decoded (special tokens kept)."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and isinstance(prompt[0], str):
        return list(prompt)  # type: ignore[arg-type]
    return [tokenizer.decode(p) for p in prompts]


class TokenStrings:
    """Token strings as logprobs show them: the token's text, or ``token_id:<id>`` when the request asks."""

    def __init__(self, tokenizer: Any, as_ids: bool) -> None:
        self.tokenizer, self.as_ids = tokenizer, as_ids

    def __call__(self, token: int) -> str:
        return f"token_id:{token}" if self.as_ids else self.tokenizer.decode([token])

    def chat(self, tokens: list[int], logprobs: list[float], top: list | None = None) -> dict[str, Any]:
        """Chat's ``logprobs`` of ``tokens``; ``top``: their top-k rows (None: no alternatives)."""
        def entry(token: int, logprob: float) -> dict[str, Any]:
            text = self(token)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8", "replace"))}

        rows = top or [None] * len(tokens)
        return {"content": [{**entry(t, lp), "top_logprobs": [entry(*alt) for alt in row or []]}
                            for t, lp, row in zip(tokens, logprobs, rows, strict=True)],
                "refusal": None}

    def completion(self, tokens: list[int], logprobs: list[float | None], top: list | None, offset: int = 0
                   ) -> dict[str, Any]:
        """Completions' ``logprobs`` of ``tokens``, their ``text_offset`` counted from ``offset``; ``top``: their
        top-k rows (None: ``top_logprobs`` is null; a None row, an echoed prompt's first token, is null)."""
        texts = [self(t) for t in tokens]
        offsets = [offset + o for o in [0, *itertools.accumulate(len(t) for t in texts)][:len(texts)]]
        tops = [None if row is None else self.alternatives(row) for row in top] if top is not None else None
        return {"tokens": texts, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}

    def alternatives(self, row: Iterable[tuple[int, float]]) -> dict[str, float]:
        """``row``'s (token, logprob) pairs, most likely first, by token string: of tokens that show as the same
        string (bytes of a broken character: ``\ufffd``), the most likely one's logprob."""
        shown: dict[str, float] = {}
        for token, logprob in row:
            shown.setdefault(self(token), logprob)
        return shown


def _delta(message: dict[str, Any]) -> dict[str, Any]:
    """A whole message as one stream delta: its tool calls numbered, as deltas number them."""
    if "tool_calls" not in message:
        return message
    return {**message, "tool_calls": [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]}


def _usage(prompts: list[list[int]], sequences: Iterable[types.SampledSequence]) -> dict[str, int]:
    completion = sum(len(s.tokens) for s in sequences)
    prompt = sum(len(p) for p in prompts)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _stream_error(exc: Exception) -> dict[str, Any]:
    """An error raised after a stream began, as OpenAI's error event."""
    if isinstance(exc, OpenAIError):
        return bodies.error_body(str(exc), exc.param, exc.code)
    if isinstance(exc, RlvrError):
        return bodies.error_body(str(exc))
    log.error("a streamed sampling request failed", exc_info=exc)
    return bodies.error_body(str(exc) or type(exc).__name__, kind="server_error")


async def _start(client: SamplingClient, prompts: list[list[int]], req: SamplingRequest, max_tokens: int | None,
                 top: int, field: str, watched: bool) -> Calls:
    """The streamed request's sampling calls, one per prompt, started (``watched``: handing out their tokens as they
    are drawn); returns once each has drawn or finished, so a refused request is a plain 400."""
    calls = Calls()
    for prompt in prompts:
        calls.start(_sample(client, prompt, req, max_tokens, top, field, calls.watch() if watched else None))
    await calls.started()
    return calls


def _incremental(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s text can stream token by token (``openai_stream.py``)."""
    return not getattr(tokenizer, "clean_up_tokenization_spaces", False)


# -- routes -----------------------------------------------------------------------------------------------------------

def openai_routes(state: ServerState, catalog: Catalog,
                  sampling_clients: Iterable[SamplingClient] = ()) -> FastAPI:
    """The routes (``/models``, ``/completions``, ``/chat/completions``) as an app to mount at ``/v1``, sampling
    through ``state.service`` and serving each of ``sampling_clients`` under its ``model_path`` (or base model)."""
    pinned = {c.model_path or c.get_base_model(): c for c in sampling_clients}
    app = sampling_app(Models(state, catalog, pinned), "/v1",
                       "GET /v1/models, POST /v1/completions and POST /v1/chat/completions")
    app.include_router(router)
    return app


def sampling_app(models: Models, mount: str, served: str) -> FastAPI:
    """An app without routes, to mount at ``mount``, whose routes sample through ``models`` and answer errors in
    OpenAI's shape (a route that is not there: a 404 saying what is ``served``). ``openai_routes`` and
    ``generate.generate_routes`` each add theirs, over the same ``models``."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.state.models = models
    app.add_exception_handler(OpenAIError, lambda r, e: _error(e.status, e, e.param, e.code))
    app.add_exception_handler(UnknownId, lambda r, e: _error(404, e, "model", "model_not_found"))
    app.add_exception_handler(RlvrError, lambda r, e: _error(400, e))
    app.add_exception_handler(BodyTooLarge, lambda r, e: _error(413, e))
    app.add_exception_handler(Exception, _server_error)
    app.add_exception_handler(HTTPException, lambda r, e: _error(
        e.status_code, OpenAIError(e.status_code, f"{r.method} {mount}{r.url.path.removeprefix(mount)} is not "
                                   f"served: rlvr serves {served}")))
    return app


def _error(status: int, exc: BaseException, param: str | None = None, code: str | None = None,
           kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(bodies.error_body(str(exc) or type(exc).__name__, param, code, kind), status_code=status)


def _server_error(request: Request, exc: Exception) -> JSONResponse:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return _error(500, exc, kind="server_error")


def _models(request: Request) -> Models:
    return request.app.state.models


def _owner(request: Request) -> str:
    return request.scope.get("state", {}).get("principal", IN_PROCESS_OWNER)


def _parsed(model: type[SamplingRequest]) -> Any:
    async def parse(request: Request) -> Any:
        return await bodies.parse(model, request)

    return Depends(parse)


ModelsOf = Annotated[Models, Depends(_models)]
"""The ``Models`` of the app serving the request."""
Caller = Annotated[str, Depends(_owner)]
"""Whose checkpoints the request may sample: its key's principal (``auth.py``), or ``IN_PROCESS_OWNER``."""

router = APIRouter()


@router.get("/models")
async def list_models(models: ModelsOf, owner: Caller) -> dict:
    return {"object": "list", "data": models.listing(owner)}


@router.post("/completions")
async def completions(req: Annotated[CompletionRequest, _parsed(CompletionRequest)], models: ModelsOf,
                      owner: Caller) -> Response:
    req.check()
    client = await models.client(req.model, owner)
    tokenizer = client.get_tokenizer()
    prompts = bodies.prompts(req.prompt, tokenizer)
    top = req.logprobs or 0
    show = TokenStrings(tokenizer, req.return_tokens_as_token_ids)
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": req.model}
    if req.stream:
        if req.echo:
            raise OpenAIError(400, "echo is not streamed: set stream=false to have the prompt echoed", "echo")
        return await _stream_completions(client, prompts, req, top, show, head)
    responses = await asyncio.gather(*(_sample(client, p, req, req.max_tokens, top, "prompt") for p in prompts))
    echoes = [([], PromptTopk([], []))] * len(prompts)
    if req.echo and req.logprobs is not None:
        echoes = list(zip(prompts, await asyncio.gather(*(_score_prompt(client, p, top) for p in prompts)),
                          strict=True))
    heads = _prompt_texts(req.prompt, prompts, tokenizer) if req.echo else [""] * len(prompts)

    def logprobs(i: int, seq: types.SampledSequence) -> dict[str, Any]:
        prompt, scores = echoes[i]
        rows = [*scores.topk, *(seq.topk_logprobs or [[]] * len(seq.tokens))] if top else None
        return show.completion([*prompt, *seq.tokens], [*scores.logprobs, *(seq.logprobs or [])], rows)

    choices = [{"index": i * req.n + j, "text": heads[i] + choice_text(tokenizer, seq.tokens, req.stop),
                "finish_reason": seq.stop_reason,
                "logprobs": logprobs(i, seq) if req.logprobs is not None else None,
                "token_ids": seq.tokens, "prompt_token_ids": prompts[i]}
               for i, response in enumerate(responses) for j, seq in enumerate(response.sequences)]
    usage = _usage(prompts, (seq for response in responses for seq in response.sequences))
    return JSONResponse({**head, "choices": choices, "usage": usage})


async def _stream_completions(client: SamplingClient, prompts: list[list[int]], req: CompletionRequest, top: int,
                              show: TokenStrings, head: dict[str, Any]) -> Response:
    """Completions streamed as they are sampled: a chunk per choice per decode step (``openai_stream.py``); top
    logprobs, computed over the finished sample, make each choice one chunk at its end."""
    tokenizer = client.get_tokenizer()
    incremental = _incremental(tokenizer) and not top
    calls = await _start(client, prompts, req, req.max_tokens, top, "prompt", incremental)
    texts = [[ChoiceText(tokenizer, req.stop, incremental) for _ in range(req.n)] for _ in prompts]

    async def chunks() -> AsyncIterator[dict[str, Any]]:
        offsets: dict[tuple[int, int], int] = {}  # each choice's text_offset so far
        finished: list[types.SampledSequence] = []
        async for piece in pieces(calls, texts):
            key = (piece.call, piece.sample)
            choice: dict[str, Any] = {
                "index": piece.call * req.n + piece.sample, "text": piece.text,
                "finish_reason": piece.done.stop_reason if piece.done else None,
                "logprobs": show.completion(piece.tokens, piece.logprobs, piece.top if top else None,
                                            offsets.get(key, 0)) if req.logprobs is not None else None,
                "token_ids": piece.tokens}
            offsets[key] = offsets.get(key, 0) + sum(len(show(t)) for t in piece.tokens)
            if piece.first:
                choice["prompt_token_ids"] = prompts[piece.call]
            if piece.done:
                finished.append(piece.done)
            yield {**head, "choices": [choice]}
        if req.stream_options.get("include_usage"):
            yield {**head, "choices": [], "usage": _usage(prompts, finished)}

    return event_stream(chunks(), _stream_error)


@router.post("/chat/completions")
async def chat_completions(req: Annotated[ChatRequest, _parsed(ChatRequest)], models: ModelsOf,
                           owner: Caller) -> Response:
    if req.top_logprobs and not req.logprobs:
        raise OpenAIError(400, "top_logprobs needs logprobs=true; set both", "top_logprobs")
    client = await models.client(req.model, owner)
    tokenizer = client.get_tokenizer()
    prompt = bodies.chat_prompt(req.messages, tokenizer, req.model, req.tools)
    top = req.top_logprobs if req.logprobs else 0
    max_tokens = req.max_completion_tokens or req.max_tokens
    show = TokenStrings(tokenizer, req.return_tokens_as_token_ids)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": req.model}
    if req.stream:
        return await _stream_chat(client, prompt, req, max_tokens, top, show, head)
    response = await _sample(client, prompt, req, max_tokens, top, "messages")
    choices = []
    for i, seq in enumerate(response.sequences):
        message, finish = _message(req, prompt, i, seq, choice_text(tokenizer, seq.tokens, req.stop))
        choices.append({"index": i, "message": message, "finish_reason": finish,
                        "logprobs": show.chat(seq.tokens, seq.logprobs or [], seq.topk_logprobs)
                        if req.logprobs else None, "token_ids": seq.tokens})
    return JSONResponse({**head, "object": "chat.completion", "choices": choices,
                         "usage": _usage([prompt], response.sequences), "prompt_token_ids": prompt})


def _message(req: ChatRequest, prompt: list[int], index: int, seq: types.SampledSequence, text: str
             ) -> tuple[dict[str, Any], str]:
    """Choice ``index``'s assistant message of ``text`` (its tool calls parsed out when the request has tools) and
    its finish reason."""
    names = req.tool_names()
    content, calls = parse_tool_calls(text, names, [prompt, seq.tokens, index]) if names else (text, [])
    message = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
    return message, "tool_calls" if calls else seq.stop_reason


async def _stream_chat(client: SamplingClient, prompt: list[int], req: ChatRequest, max_tokens: int | None,
                       top: int, show: TokenStrings, head: dict[str, Any]) -> Response:
    """Chat streamed as it is sampled: a chunk per choice per decode step (``openai_stream.py``); tools (parsed out
    of the whole reply) and top logprobs (computed over the finished sample) make each choice one chunk at its
    end."""
    tokenizer = client.get_tokenizer()
    incremental = _incremental(tokenizer) and not top and not req.tool_names()
    calls = await _start(client, [prompt], req, max_tokens, top, "messages", incremental)
    texts = [[ChoiceText(tokenizer, req.stop, incremental) for _ in range(req.n)]]

    async def chunks() -> AsyncIterator[dict[str, Any]]:
        head_chunk = {**head, "object": "chat.completion.chunk", "prompt_token_ids": prompt}
        finished: list[types.SampledSequence] = []
        async for piece in pieces(calls, texts):
            delta: dict[str, Any] = {"role": "assistant"} if piece.first else {}
            finish = None
            if piece.done is not None and not incremental:  # the whole message, its tool calls parsed out
                message, finish = _message(req, prompt, piece.sample, piece.done, piece.text)
                delta = _delta(message)
            else:
                delta["content"] = piece.text
                finish = piece.done.stop_reason if piece.done is not None else None
            if piece.done is not None:
                finished.append(piece.done)
            yield {**head_chunk, "choices": [{
                "index": piece.sample, "delta": delta, "finish_reason": finish,
                "logprobs": show.chat(piece.tokens, piece.logprobs, piece.top) if req.logprobs else None,
                "token_ids": piece.tokens}]}
            head_chunk.pop("prompt_token_ids", None)
        if req.stream_options.get("include_usage"):
            yield {**head, "object": "chat.completion.chunk", "choices": [], "usage": _usage([prompt], finished)}

    return event_stream(chunks(), _stream_error)
