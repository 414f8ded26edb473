"""rlvr's chat harness for verifiers 0.4 (``verifiers.v1``): verifiers' tool-less ``null`` chat loop, run in this
process instead of as a PEP 723 script under ``uv``, so a chat taskset trains with no ``uv`` and no sandbox.

Its id is ``rlvr_chat``: verifiers loads a harness by importing the module its id names, and ``verifiers_v1.py``
registers this module under that flat name. ``VerifiersV1Dataset`` picks it for every taskset that does not bring its
own harness. Each segment of a
rollout sends the conversation to the rollout's interception endpoint (``endpoint`` and ``secret``, as verifiers hands
every harness), appends the reply, runs the tool calls it holds against the task's MCP tool servers (verifiers' own
client for them, ``harnesses.utils.mcp``) and goes on until a reply calls no tool. A resumed segment (a user turn from
a multi-turn env) starts again from the whole conversation, as the ``null`` harness's relaunch does.

What is covered: system prompts, a prompt as text or messages, MCP tools (a call with arguments that are not a JSON
object, or to a tool no server offers, is answered with an error the model reads, never a crash), the env's turn
limits (a turn the interception refuses ends the segment as the ``null`` program's exit does) and a full context
(the conversation ends there). What is not: verifiers' built-in ``bash``, ``edit`` and ``search`` tools and
compaction (the ``bash`` harness and the coding agents run their programs under ``uv``, in the subprocess runtime).

Imported only where ``verifiers.v1`` is installed (``verifiers_v1.py`` checks first).
"""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from typing import Any

import openai
import verifiers.v1 as vf
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.harnesses.utils.compaction import bound_tool_message, is_context_overflow
from verifiers.v1.harnesses.utils.mcp import call_mcp, connect_mcp
from verifiers.v1.runtimes import ProgramResult

__all__ = ["InProcessChatHarness", "InProcessChatHarnessConfig"]

HARNESS_ID = "rlvr_chat"


class InProcessChatHarnessConfig(vf.HarnessConfig):
    """The harness's config: verifiers' own fields (``tool_timeout``, ``disabled_tools``...), its id this module."""

    id: str = HARNESS_ID


class InProcessChatHarness(vf.Harness[InProcessChatHarnessConfig]):
    """A chat loop over the rollout's interception endpoint, with the task's MCP tools, in this process."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: Any, tool_interception_url: str | None = None) -> ProgramResult:
        del runtime, tool_interception_url  # nothing runs in the runtime; tools run on their MCP servers
        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt is not None:
            messages += [message_to_wire(m) for m in prompt]
        client = openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        servers_config = {"mcpServers": {name: {"url": url, "timeout": self.config.tool_timeout}
                                         for name, url in mcp_urls.items()}}
        try:
            async with AsyncExitStack() as stack:
                tools, dispatch, servers = (await connect_mcp(servers_config, stack) if mcp_urls else ([], {}, {}))
                await _chat(client, ctx.model, messages, tools, dispatch, servers, trace)
        finally:
            await client.close()
        return ProgramResult(exit_code=0, stdout="", stderr="")


async def _chat(client: openai.AsyncOpenAI, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                dispatch: dict[str, Any], servers: dict[str, Any], trace: Any) -> None:
    """Turns until a reply calls no tool, the interception stops the rollout, or the context is full."""
    while True:
        try:
            completion = await client.chat.completions.create(model=model, messages=messages,
                                                              **({"tools": tools} if tools else {}))
        except openai.APIStatusError as error:
            if trace.stop_condition is not None or is_context_overflow(error):
                return  # a stop condition refused the turn, or there is no room for one: the conversation is over
            raise
        message = completion.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return
        for call in message.tool_calls:
            messages.append(bound_tool_message({"role": "tool", "tool_call_id": call.id, "name": call.function.name,
                                                "content": await _tool_result(call, dispatch, servers)}))


async def _tool_result(call: Any, dispatch: dict[str, Any], servers: dict[str, Any]) -> Any:
    """What the model reads back for one tool call: the tool's result, or what was wrong with the call."""
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError as exc:
        return f"error: invalid JSON in tool arguments ({exc}); resend the call with valid JSON"
    if not isinstance(arguments, dict):
        return f"error: tool arguments must be a JSON object, got {type(arguments).__name__}; resend as an object"
    if call.function.name not in dispatch:
        return f"error: unknown tool {call.function.name!r}"
    return await call_mcp(servers, dispatch, call.function.name, arguments)
