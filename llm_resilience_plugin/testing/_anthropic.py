"""Anthropic's Messages dialect: ``POST /<deployment>/v1/messages`` (or ``/v1/messages``, the
deployment then being the body's ``model``), as LiteLLM's ``anthropic/`` provider sends it when its
``api_base`` is ``http://127.0.0.1:<port>/<deployment>`` (:meth:`ProviderSimulator.anthropic_base`).

Requests are checked as Anthropic checks them, each refusal a 400 ``invalid_request_error`` (401
``authentication_error`` without credentials) logged as ``bad_request`` without consuming a
script: an ``x-api-key`` (or ``Authorization``) and an ``anthropic-version`` header, ``max_tokens``,
a non-empty ``messages`` list of ``user``/``assistant`` turns whose content is a string or known
blocks, tools with a ``name`` and an ``input_schema``, and every ``tool_use`` answered by a
``tool_result`` in the next message (and no ``tool_result`` without its ``tool_use``).

The reply is the chat endpoint's (same text, tool choice and arguments, ``max_tokens`` and
``stop_sequences`` cuts, structured output for ``output_format``) in Anthropic's shape: content
blocks (``text`` or one ``tool_use``), ``stop_reason`` (``end_turn``, ``max_tokens``,
``tool_use``) and ``usage.input_tokens``/``output_tokens``. Streams are Anthropic's events:
``message_start``, ``content_block_start``, ``ping``, ``content_block_delta`` (``text_delta`` per
word or ``input_json_delta`` per 16 characters of arguments), ``content_block_stop``,
``message_delta`` (stop reason, output tokens) and ``message_stop``.

Every fault applies as for chat: ``http_error`` as ``{"type": "error", "error": {"type", "message"}}``
(the type from the status: ``rate_limit_error`` 429, ``overloaded_error`` 529, ``api_error`` 5xx,
...; ``Retry-After`` kept), resets, silences, delays, ``stream_cut``/``stream_stall`` after
``after_chunks`` content deltas (the opening events travel with the first), ``malformed_chunk``
(an invalid ``content_block_delta``; a truncated body when not streaming) and ``no_done`` (the
stream ends without ``message_stop``).

How LiteLLM 1.110's ``anthropic/`` provider surfaces them (``num_retries=0``): 429
``RateLimitError`` (``Retry-After`` in ``litellm_response_headers``, not ``e.response``), 500
``InternalServerError``, 503 ``ServiceUnavailableError``, 529 ``InternalServerError`` with status
**500** (the httpx response in the cause chain keeps 529), 401 ``AuthenticationError``, the
context overflow ``ContextWindowExceededError``, a refused ``tool_result`` ``BadRequestError``, a
reset ``InternalServerError`` ("Connection reset by peer"), silence ``Timeout``; a cut or
malformed stream ``MidStreamFallbackError`` while iterating, a malformed body
``APIConnectionError``; ``no_done`` is accepted.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from llm_resilience_plugin.testing._faults import default_message
from llm_resilience_plugin.testing._intake import Admissions, Intake, Rejection
from llm_resilience_plugin.testing._messages import JSONDict, content_text, estimate_prompt_tokens
from llm_resilience_plugin.testing._replies import Reply, build_reply
from llm_resilience_plugin.testing._state import SimulatorState
from llm_resilience_plugin.testing._writers import Call, send_error_body, send_events, send_json, sse_event

__all__ = [
    "AnthropicEndpoints",
    "anthropic_error_type",
    "chat_view",
    "check_request",
    "message_body",
    "message_events",
]

_BLOCKS = frozenset(
    {"text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking", "search_result"}
)
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
_ARG_FRAGMENT = 16
_MALFORMED = (
    b"event: content_block_delta\n"
    b'data: {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "oops"\n\n'
)
_STOP_EVENT = sse_event({"type": "message_stop"}, "message_stop")


def anthropic_error_type(status: int) -> str:
    """Anthropic's ``error.type`` for an HTTP status (``api_error`` for other 5xx)."""
    if status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def _error(status: int, message: str) -> JSONDict:
    return {"type": "error", "error": {"type": anthropic_error_type(status), "message": message}}


def _block_text(block: JSONDict) -> str:
    kind = block.get("type")
    if kind == "tool_use":
        return json.dumps(block.get("input"), ensure_ascii=False)
    if kind == "tool_result":
        return content_text(block.get("content"))[0]
    text = block.get("text") if kind != "thinking" else block.get("thinking")
    return text if isinstance(text, str) else ""


def _chat_message(message: JSONDict) -> JSONDict:
    """One Anthropic turn as a chat message: a turn of ``tool_result`` blocks is a ``tool`` message."""
    role, content = message.get("role"), message.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
    if blocks and all(b.get("type") == "tool_result" for b in blocks):
        return {"role": "tool", "content": "".join(_block_text(b) for b in blocks)}
    parts: list[JSONDict] = [
        {"type": "image_url"} if b.get("type") == "image" else {"type": "text", "text": _block_text(b)}
        for b in blocks
    ]
    return {"role": role, "content": parts}


def chat_view(body: JSONDict) -> JSONDict:
    """An Anthropic request as the chat request the reply builder reads (messages, tools,
    ``tool_choice``, ``stop``, ``max_tokens``, ``response_format``)."""
    messages: list[JSONDict] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": system})
    raw = body.get("messages")
    messages.extend(_chat_message(m) for m in (raw if isinstance(raw, list) else []) if isinstance(m, dict))
    view: JSONDict = {"messages": messages, "max_tokens": body.get("max_tokens")}
    tools = body.get("tools")
    if isinstance(tools, list):
        view["tools"] = [
            {"type": "function", "function": {"name": t["name"], "parameters": t.get("input_schema")}}
            for t in tools
            if isinstance(t, dict) and isinstance(t.get("name"), str) and "input_schema" in t
        ]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind = choice.get("type")
        view["tool_choice"] = (
            "none" if kind == "none" else {"name": choice.get("name")} if kind == "tool" else "auto"
        )
    if isinstance(body.get("stop_sequences"), list):
        view["stop"] = body["stop_sequences"]
    output = body.get("output_format")
    if isinstance(output, dict) and output.get("type") == "json_schema":
        view["response_format"] = {"type": "json_schema", "json_schema": {"schema": output.get("schema")}}
    return view


def _check_turns(messages: list[Any]) -> str | None:
    """The first way ``messages`` breaks Anthropic's rules, as its error message (else None)."""
    if not messages:
        return "messages: at least one message is required"
    pending: tuple[int, list[str]] | None = None  # (assistant turn, tool_use ids awaiting results)
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        content = message.get("content")
        if not isinstance(content, (str, list)):
            return f"messages.{i}.content: Input should be a valid string or list of content blocks"
        blocks = content if isinstance(content, list) else []
        for j, block in enumerate(blocks):
            if not isinstance(block, dict) or block.get("type") not in _BLOCKS:
                return f"messages.{i}.content.{j}: Input tag does not match any of the expected tags"
            if block["type"] == "text" and not isinstance(block.get("text"), str):
                return f"messages.{i}.content.{j}.text: Field required"
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        expected = pending[1] if pending is not None else []
        unexpected = [r for r in results if r not in expected]
        if unexpected:
            return (
                f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` blocks: "
                f"{', '.join(map(str, unexpected))}. Each `tool_result` block must have a corresponding "
                "`tool_use` block in the previous message."
            )
        if pending is not None and (missing := [u for u in pending[1] if u not in results]):
            return (
                f"messages.{pending[0]}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                "corresponding `tool_result` block in the next message."
            )
        uses = [b for b in blocks if b.get("type") == "tool_use"]
        for block in uses:
            if not (isinstance(block.get("id"), str) and isinstance(block.get("name"), str)):
                return f"messages.{i}.content: tool_use blocks need an id and a name"
            if not isinstance(block.get("input"), dict):
                return f"messages.{i}.content: tool_use.input: Input should be a valid dictionary"
        pending = (i, [str(b["id"]) for b in uses]) if uses and message["role"] == "assistant" else None
    return None


def check_request(intake: Intake) -> Rejection | None:
    """Anthropic's own refusals of a request (see the module docs), else None."""
    headers = intake.headers
    if "x-api-key" not in headers and "authorization" not in headers:
        return Rejection(401, _error(401, "x-api-key header is required"))
    if not headers.get("anthropic-version"):
        return Rejection(400, _error(400, "anthropic-version: header is required"))
    body = intake.body
    if not isinstance(intake.parsed, dict):
        return Rejection(400, _error(400, "The request body is not valid JSON."))
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        return Rejection(400, _error(400, "max_tokens: Field required (an integer >= 1)"))
    messages = body.get("messages")
    problem = _check_turns(messages) if isinstance(messages, list) else "messages: Field required"
    if problem is None:
        for k, tool in enumerate(body.get("tools") or []):
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                problem = f"tools.{k}.name: Field required"
            elif "input_schema" not in tool and tool.get("type") in (None, "custom"):
                problem = f"tools.{k}.custom.input_schema: Field required"
            if problem:
                break
    return Rejection(400, _error(400, problem)) if problem else None


def _tokens(body: JSONDict) -> int:
    return estimate_prompt_tokens(chat_view(body)["messages"])


def message_body(reply: Reply, *, number: int, model: str, input_tokens: int) -> JSONDict:
    """A Messages API response (id ``msg_sim_<number>``, tool use ids ``toolu_sim_<number>``)."""
    if reply.tool_call is not None:
        content: list[JSONDict] = [
            {
                "type": "tool_use",
                "id": f"toolu_sim_{number}",
                "name": reply.tool_call["name"],
                "input": json.loads(reply.tool_call["arguments"]),
            }
        ]
    else:
        content = [{"type": "text", "text": reply.content or ""}]
    return {
        "id": f"msg_sim_{number}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _STOP_REASONS.get(reply.finish_reason, "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": reply.completion_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def message_events(
    reply: Reply, *, number: int, model: str, input_tokens: int
) -> tuple[list[bytes], list[bytes]]:
    """(content deltas, the first carrying the opening events; closing events) as SSE bytes."""
    final = message_body(reply, number=number, model=model, input_tokens=input_tokens)
    start = {**final, "content": [], "stop_reason": None, "usage": {**final["usage"], "output_tokens": 1}}
    block = dict(final["content"][0])
    deltas: list[JSONDict]
    if reply.tool_call is not None:
        block["input"] = {}
        arguments = reply.tool_call["arguments"]
        deltas = [
            {"type": "input_json_delta", "partial_json": arguments[i : i + _ARG_FRAGMENT]}
            for i in range(0, len(arguments), _ARG_FRAGMENT)
        ]
    else:
        block["text"] = ""
        deltas = [{"type": "text_delta", "text": word} for word in reply.words]
    opening = [
        sse_event({"type": "message_start", "message": start}, "message_start"),
        sse_event({"type": "content_block_start", "index": 0, "content_block": block}, "content_block_start"),
        sse_event({"type": "ping"}, "ping"),
    ]
    events = [
        sse_event({"type": "content_block_delta", "index": 0, "delta": d}, "content_block_delta")
        for d in deltas
    ]
    closing = [
        sse_event({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        sse_event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": final["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": reply.completion_tokens},
            },
            "message_delta",
        ),
        _STOP_EVENT,
    ]
    if events:
        events[0] = b"".join(opening) + events[0]
    else:
        closing = opening + closing
    return events, closing


async def _send_error(call: Call) -> web.StreamResponse:
    """An ``http_error`` behaviour in Anthropic's error shape."""
    behavior = call.behavior
    message = behavior.message
    if message is None:
        if behavior.context_limit is not None:
            message = f"prompt is too long: {call.prompt_tokens} tokens > {behavior.context_limit} maximum"
        elif behavior.code == "model_not_found":
            message = f"model: {call.model or call.deployment}"
        else:
            message = default_message(behavior.status)
    payload = _error(behavior.status, message)
    return await send_error_body(
        call.request, call.record, call.deployment, behavior.status, payload, behavior.retry_after
    )


async def _answer(call: Call) -> web.StreamResponse:
    reply = build_reply(chat_view(call.body), call.deployment, call.behavior.text)
    if not call.stream:
        body = message_body(reply, number=call.number, model=call.model, input_tokens=call.prompt_tokens)
        return await send_json(call, body)
    events, closing = message_events(
        reply, number=call.number, model=call.model, input_tokens=call.prompt_tokens
    )
    return await send_events(call, events, closing, malformed=_MALFORMED, done=_STOP_EVENT)


class AnthropicEndpoints:
    """The Messages endpoint over the simulator's shared state (see module docs)."""

    def __init__(self, state: SimulatorState, active: set[asyncio.Task[Any]]) -> None:
        self._admissions = Admissions(state, active)

    def add_routes(self, app: web.Application) -> None:
        """Register ``POST /v1/messages`` and ``POST /{deployment}/v1/messages`` on ``app``."""
        app.router.add_post("/v1/messages", self.handle_messages)
        app.router.add_post("/{deployment}/v1/messages", self.handle_messages)

    async def handle_messages(self, request: web.Request) -> web.StreamResponse:
        """``POST .../v1/messages``: check, log and admit the request, then apply its behaviour."""
        return await self._admissions.serve(
            request, check=check_request, tokens_of=_tokens, answer=_answer, error=_send_error
        )
