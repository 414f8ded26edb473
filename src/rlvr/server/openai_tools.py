"""Tool calls on the OpenAI chat endpoint (``openai.py``): the ``tools`` a request offers and the ``tool`` and
``tool_calls`` messages of its conversation, rendered into the prompt; the tool calls a reply's text holds, parsed
out of it into OpenAI's ``tool_calls``.

Rendering: a chat template that renders tools (``apply_chat_template(..., tools=...)``, as Qwen's, Llama 3.1's and
Hermes' do) gets them as they are, each call's ``arguments`` as a JSON object. A template that ignores them (found by
rendering a probe tool once per template) gets rlvr's ChatML-like fallback: a system block listing each schema
between ``<tools>`` tags and asking for ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, an assistant
turn's calls written after its text, tool results as one user turn in ``<tool_response>`` tags.

Parsing: every ``<tool_call>JSON</tool_call>`` of a reply whose JSON is an object naming an offered function, with
``arguments`` an object (or absent), becomes ``{"id", "type": "function", "function": {"name", "arguments"}}``; the
text around the calls is the content (null when nothing is left). Anything else (bad JSON, an unknown function, a
tag left open) stays in the content as written: nothing a model writes fails the request. A call's id hashes the
prompt, the sampled tokens and the call's place, so the same seed gives the same ids.

Not covered: ``tool_choice`` other than ``"auto"`` and ``"none"`` (constrained decoding), ``parallel_tool_calls:
false``, the legacy ``functions`` API (each a 400, ``openai_wire.REFUSED``); tool-call tags the tokenizer holds as
special tokens (left out of the text, so unparsed); other call formats (``<|python_tag|>``, ``[TOOL_CALLS]``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterator
from typing import Any

__all__ = ["CALL_CLOSE", "CALL_OPEN", "fallback_messages", "parse_tool_calls", "render_prompt", "renders_tools"]

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"

_PROBE_NAME = "rlvr_probe_tool"
_PROBE = [{"type": "function", "function": {"name": _PROBE_NAME, "description": "A probe.",
                                            "parameters": {"type": "object", "properties": {}}}}]
_RENDERS_TOOLS: dict[str, bool] = {}  # chat template text -> whether it renders tools


# -- rendering --------------------------------------------------------------------------------------------------------

def renders_tools(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s chat template renders the ``tools`` it is given (a probe tool's name shows in the
    text); remembered per template."""
    template = tokenizer.chat_template
    key = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    if key not in _RENDERS_TOOLS:
        try:
            text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tools=_PROBE, tokenize=False)
        except Exception:  # a template that fails on tools does not render them
            text = ""
        _RENDERS_TOOLS[key] = _PROBE_NAME in text
    return _RENDERS_TOOLS[key]


def render_prompt(messages: list[dict[str, Any]], tools: list[dict[str, Any]], tokenizer: Any) -> str:
    """The prompt text of ``messages`` (OpenAI's shape, content as text) offering ``tools`` (OpenAI function
    schemas), ready for the assistant's turn: through the template's own tool support, or the fallback."""
    if renders_tools(tokenizer):
        native = [{**m, "tool_calls": [_with_object_arguments(c) for c in m["tool_calls"]]} if m.get("tool_calls")
                  else m for m in messages]
        return tokenizer.apply_chat_template(native, tools=tools or None, tokenize=False, add_generation_prompt=True)
    return tokenizer.apply_chat_template(fallback_messages(messages, tools), tokenize=False,
                                         add_generation_prompt=True)


def fallback_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, str]]:
    """``messages`` with ``tools`` as plain text turns (``role`` and ``content`` only) for a template that has no
    tool support: the tools in a system block, tool calls as ``<tool_call>`` lines, tool results as user turns."""
    out: list[dict[str, str]] = []
    in_results = False  # the results of one turn's calls share one user turn
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "tool":
            block = f"{RESPONSE_OPEN}\n{content}\n{RESPONSE_CLOSE}"
            if in_results:
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block})
            in_results = True
            continue
        in_results = False
        calls = [_call_line(c) for c in message.get("tool_calls") or []]
        out.append({"role": role, "content": "\n".join([content, *calls] if content else calls)})
    if tools:
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{_tools_block(tools)}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": _tools_block(tools)})
    return out


def _tools_block(tools: list[dict[str, Any]]) -> str:
    schemas = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou can call these functions; each line is one function's schema:\n"
            f"<tools>\n{schemas}\n</tools>\n\n"
            "To call one, write its name and arguments as a JSON object between tags, one call per tag:\n"
            f'{CALL_OPEN}\n{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}\n{CALL_CLOSE}\n'
            "Each call's result comes back to you between <tool_response> tags.")


def _call_line(call: dict[str, Any]) -> str:
    function = call.get("function") or {}
    arguments = _with_object_arguments(call)["function"]["arguments"]
    body = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def _with_object_arguments(call: dict[str, Any]) -> dict[str, Any]:
    """``call`` with its ``function.arguments`` as a JSON object when the JSON text it holds is one (transformers'
    templates expect an object, OpenAI sends text); left as it is otherwise."""
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except (ValueError, RecursionError):
            parsed = None
        if isinstance(parsed, dict):
            function["arguments"] = parsed
    return {**call, "function": function}


# -- parsing ----------------------------------------------------------------------------------------------------------

def parse_tool_calls(text: str, names: Collection[str], key: Any = ()) -> tuple[str | None, list[dict[str, Any]]]:
    """The content and the OpenAI tool calls of a reply's ``text``: each well-formed ``<tool_call>`` of a function
    in ``names`` becomes a call and leaves the content; anything else stays in it. ``key`` (JSON-able: the prompt and
    sampled tokens) makes the calls' ids. Never raises on what ``text`` holds. With no calls the content is
    ``text`` itself; with calls it is the rest, stripped, or None when nothing is left."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    for before, inner, raw in _spans(text):
        kept.append(before)
        call = _call(inner, names) if inner is not None else None
        if call is None:
            kept.append(raw)
        else:
            calls.append(call)
    if not calls:
        return text, []
    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()
    for i, call in enumerate(calls):
        call["id"] = f"call_{hashlib.sha256(f'{digest}:{i}'.encode()).hexdigest()[:24]}"
    content = "".join(kept).strip()
    return content or None, calls


def _spans(text: str) -> Iterator[tuple[str, str | None, str]]:
    """(text before, what is inside or None, the tag as written) of each ``<tool_call>...</tool_call>``; the text
    after the last closed tag comes last with None. One pass with ``str.find``, linear in ``text``."""
    at = 0
    while (start := text.find(CALL_OPEN, at)) >= 0:
        end = text.find(CALL_CLOSE, start + len(CALL_OPEN))
        if end < 0:
            break
        stop = end + len(CALL_CLOSE)
        yield text[at:start], text[start + len(CALL_OPEN):end], text[start:stop]
        at = stop
    yield text[at:], None, ""


def _call(inner: str, names: Collection[str]) -> dict[str, Any] | None:
    """The tool call ``inner`` (a tag's JSON) makes, or None when it is not one of ``names`` with object
    arguments. Deep nesting, huge numbers and non-finite values are not calls."""
    try:
        found = json.loads(inner)
    except (ValueError, RecursionError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("name"), str) or found["name"] not in names:
        return None
    arguments = found.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    try:
        encoded = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
        encoded.encode("utf-8")  # a lone surrogate from a \ud800 escape cannot go out as UTF-8
    except (ValueError, RecursionError):
        return None
    return {"id": "", "type": "function", "function": {"name": found["name"], "arguments": encoded}}
