"""OpenAI request bodies for the ``/v1`` routes (``openai.py``): what each endpoint takes, the fields refused by
name, prompts as token ids (text, token ids, or a chat and its tools through the model's chat template), and errors
in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, each naming the field and the fix.

Fields sent as ``null`` count as not sent. Fields in neither ``REFUSED`` nor the request models are ignored, as vLLM
ignores them (``user``, ``metadata``, ``store``...).

Not here: routes, which weights serve a request, responses (``openai.py``); how tools are rendered and tool calls
parsed (``openai_tools.py``); the Tinker protocol's bodies (``wire.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import pydantic
from fastapi import Request

from rlvr.server.openai_tools import render_prompt

__all__ = ["MAX_TOP_LOGPROBS", "REFUSED", "ChatRequest", "CompletionRequest", "OpenAIError", "SamplingRequest",
           "chat_prompt", "error_body", "parse", "prompts"]

MAX_TOP_LOGPROBS = 20
"""The most alternatives ``top_logprobs`` (chat) or ``logprobs`` (completions) may ask for, as vLLM's default."""

REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "functions": ((None, []), "the legacy functions API is not served; offer them as tools"),
    "function_call": ((None, "none", "auto"), "the legacy functions API is not served; use tools and tool_choice"),
    "parallel_tool_calls": ((None, True), "rlvr returns every tool call a reply holds"),
    "response_format": ((None, {"type": "text"}), "rlvr does not constrain the output format"),
    "logit_bias": ((None, {}), "the sampler has no logit bias"),
    "presence_penalty": ((None, 0), "the sampler has no penalties"),
    "frequency_penalty": ((None, 0), "the sampler has no penalties"),
    "repetition_penalty": ((None, 1), "the sampler has no penalties"),
    "best_of": ((None, 1), "use n and rank the choices yourself"),
    "suffix": ((None, ""), "rlvr does not fill in the middle"),
    "modalities": ((None, ["text"]), "rlvr serves text models"),
    "audio": ((None,), "rlvr serves text models"),
}
"""Request fields that would change the result but that rlvr does not implement: field -> (the values that change
nothing, why). Any other value is a 400 naming the field."""


class OpenAIError(Exception):
    """A request answered with OpenAI's error body: ``status``, what is wrong and the fix, the field (``param``)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


def error_body(message: str, param: str | None = None, code: str | None = None,
               kind: str = "invalid_request_error") -> dict[str, Any]:
    """OpenAI's error JSON (``openai.APIStatusError.body`` reads ``error``)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# -- request bodies ----------------------------------------------------------------------------------------------------

def _stop_list(stop: str | list[str]) -> list[str]:
    stops = [stop] if isinstance(stop, str) else stop
    if any(s == "" for s in stops):
        raise ValueError("stop strings must be non-empty; drop the empty one")
    return stops


Stops = Annotated[str | list[str], pydantic.AfterValidator(_stop_list)]
"""``stop``: one string or a list of them, none empty; a list once validated."""


class NullMeansUnset(pydantic.BaseModel):
    """A request body whose fields sent as ``null`` count as not sent; fields it does not know are ignored."""

    model_config = pydantic.ConfigDict(extra="ignore")

    @pydantic.model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class SamplingRequest(NullMeansUnset):
    """What both endpoints take. Fields sent as ``null`` count as not sent."""

    model: str
    n: int = pydantic.Field(1, ge=1)
    temperature: float = pydantic.Field(1.0, ge=0)
    top_p: float = pydantic.Field(1.0, gt=0, le=1)
    top_k: int = -1
    max_tokens: int | None = pydantic.Field(None, ge=1)
    stop: Stops = []
    seed: int | None = pydantic.Field(None, ge=-(2**63), lt=2**63)
    stream: bool = False
    stream_options: dict[str, Any] = {}
    return_tokens_as_token_ids: bool = False

    @pydantic.field_validator("top_k")
    @classmethod
    def _top_k(cls, top_k: int) -> int:
        if top_k == 0 or top_k < -1:
            raise ValueError("top_k must be -1 (no limit) or >= 1")
        return top_k


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = pydantic.Field(16, ge=0)  # OpenAI's default for completions; 0 only with echo
    logprobs: int | None = pydantic.Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    """Each choice begins with its prompt: the text, and with ``logprobs`` the prompt tokens' logprobs (None at the
    first) and top alternatives, before the completion's. ``max_tokens: 0`` then scores the prompt alone."""

    def check(self) -> None:
        """A 400 naming the field for what the fields allow one by one but not together."""
        if self.max_tokens == 0 and not self.echo:
            raise OpenAIError(400, "max_tokens=0 samples nothing, which only echo=true (scoring the prompt) asks "
                                   "for; set echo=true or ask for at least 1 token", "max_tokens")

    @pydantic.field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, prompt: Any) -> Any:
        def ids(value: Any) -> bool:
            return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)

        if not (isinstance(prompt, str) or (isinstance(prompt, list) and prompt and (
                all(isinstance(p, str) for p in prompt) or ids(prompt) or all(ids(p) and p for p in prompt)))):
            raise ValueError("send text, a list of texts, a list of token ids, or a list of token-id lists (one "
                             "kind, none empty)")
        return prompt


class _Function(pydantic.BaseModel):
    """A function a request offers (OpenAI's ``FunctionDefinition``)."""

    model_config = pydantic.ConfigDict(extra="ignore")

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @pydantic.field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            raise ValueError("a function name is 1 to 64 letters, digits, underscores or dashes, as OpenAI's; "
                             "rename the function")
        return name


class _Tool(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore")

    type: Literal["function"]
    function: _Function


class _CalledFunction(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore")

    name: str
    arguments: str | dict[str, Any] = "{}"


class _ToolCall(pydantic.BaseModel):
    """A tool call of an earlier assistant turn, as the endpoint returned it."""

    model_config = pydantic.ConfigDict(extra="ignore")

    id: str | None = None
    type: Literal["function"] = "function"
    function: _CalledFunction


class _Message(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore")

    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None


class ChatRequest(SamplingRequest):
    messages: list[_Message] = pydantic.Field(min_length=1)
    max_completion_tokens: int | None = pydantic.Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int = pydantic.Field(0, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[_Tool] = []
    tool_choice: str = "auto"

    @pydantic.field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, choice: Any) -> str:
        if choice not in ("auto", "none"):
            raise ValueError('rlvr supports "auto" (parse the tool calls a reply holds) and "none" (never parse); '
                             '"required" and naming a function would need constrained decoding, which rlvr does '
                             "not do, so send one of those two or leave it unset")
        return choice

    def tool_names(self) -> set[str]:
        """The functions a reply's tool calls may name: none when ``tool_choice`` is ``"none"``."""
        return {t.function.name for t in self.tools} if self.tool_choice == "auto" else set()


async def parse(model: type[pydantic.BaseModel], request: Request,
                refused: dict[str, tuple[tuple[Any, ...], str]] = REFUSED) -> Any:
    """``request``'s JSON body as ``model``; a 400 naming the field for a body that is not one, or that sets a field
    of ``refused`` (a dotted name reaches into an object: ``sampling_params.min_p``) to a value that changes the
    result."""
    try:
        data = json.loads(await request.body())
    except ValueError:
        raise OpenAIError(400, "the request body is not JSON; send a JSON object with Content-Type: "
                               "application/json") from None
    if not isinstance(data, dict):
        raise OpenAIError(400, f"the request body is a JSON {type(data).__name__}; send a JSON object")
    for name, (neutral, why) in refused.items():
        *outer, field = name.split(".")
        holder: Any = data
        for key in outer:
            holder = holder.get(key) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and field in holder and holder[field] not in neutral:
            raise OpenAIError(400, f"{name}={_short(holder[field])} is not supported: {why}; leave it unset", name)
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        errors = exc.errors()
        param = _param(errors[0]["loc"])
        if errors[0]["type"] == "missing":
            raise OpenAIError(400, f"{param} is required", param) from None
        # a union field (stop, content) fails once per member: say what each member wanted
        wanted = dict.fromkeys(e["msg"].removeprefix("Value error, ") for e in errors if _param(e["loc"]) == param)
        raise OpenAIError(400, f"{param}={_short(data.get(param, errors[0].get('input')))} is invalid: "
                               f"{' or '.join(wanted)}", param) from None


def _param(loc: tuple[int | str, ...]) -> str:
    """A field's path as OpenAI's ``param`` gives it (``messages.0.content``), without pydantic's union-member tags
    (``str``, ``list[str]``)."""
    return ".".join(str(p) for p in loc if isinstance(p, int) or (p.isidentifier() and p not in _UNION_TAGS))


_UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict"})


def _short(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list, str, int, float, bool)) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def prompts(prompt: str | list[str] | list[int] | list[list[int]], tokenizer: Any) -> list[list[int]]:
    """The token ids of each prompt of a completion request (text is encoded as vLLM does, with special tokens)."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if isinstance(prompt[0], int):
        return [list(prompt)]  # type: ignore[arg-type]
    return [_encode(tokenizer, p, "prompt", True) if isinstance(p, str) else list(p)  # type: ignore[union-attr]
            for p in prompt]


def _encode(tokenizer: Any, text: str, param: str, add_special_tokens: bool, where: str | None = None) -> list[int]:
    """``text``'s token ids; a 400 naming ``param`` (``where`` the text came from, if more) when it holds a lone
    surrogate (JSON's ``\\ud800``), which no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise OpenAIError(400, f"{where or param} holds {text[exc.start:exc.end]!r}, half of a UTF-16 surrogate "
                               "pair, which is not text; send valid Unicode", param) from None
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


def chat_prompt(messages: list[_Message], tokenizer: Any, model: str, tools: Sequence[_Tool] = ()) -> list[int]:
    """The token ids of ``messages`` offering ``tools``, through the model's chat template (``openai_tools``
    renders the tools, tool calls and tool results), ready for the assistant's turn."""
    if not getattr(tokenizer, "chat_template", None):
        raise OpenAIError(400, f"model {model!r} has no chat template; render the prompt yourself and use "
                               "/v1/completions", "model")
    rendered = []
    for i, message in enumerate(messages):
        if message.tool_calls and message.role != "assistant":
            raise OpenAIError(400, f"messages[{i}] is a {message.role!r} message with tool_calls; only assistant "
                                   "messages carry them", f"messages.{i}.tool_calls")
        content = message.content
        if isinstance(content, list):
            kinds = [p.get("type") for p in content]
            if any(k != "text" for k in kinds):
                raise OpenAIError(400, f"messages[{i}].content has a {next(k for k in kinds if k != 'text')!r} "
                                       "part; rlvr serves text models, so send text parts only",
                                  f"messages.{i}.content")
            content = "".join(str(p.get("text", "")) for p in content)
        entry: dict[str, Any] = {"role": message.role, "content": content or ""}
        if message.tool_calls:
            entry["tool_calls"] = [c.model_dump(exclude_none=True) for c in message.tool_calls]
        if message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        rendered.append(entry)
    try:
        text = render_prompt(rendered, [t.model_dump(exclude_none=True) for t in tools], tokenizer)
    except Exception as exc:  # the template's own checks (role order, missing fields) raise jinja errors
        raise OpenAIError(400, f"messages do not fit model {model!r}'s chat template: {exc}", "messages") from exc
    return _encode(tokenizer, text, "messages", False, where="messages (or the tools' schemas)" if tools else None)
