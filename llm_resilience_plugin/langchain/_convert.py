"""Conversions between LangChain messages and the OpenAI/LiteLLM wire shapes the router speaks.

Kept free of any router state so they can be tested on their own.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    convert_to_openai_messages,
)
from langchain_core.messages.ai import InputTokenDetails, OutputTokenDetails, UsageMetadata
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.output_parsers.openai_tools import make_invalid_tool_call, parse_tool_call
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk

from llm_resilience_plugin.events import hidden_params_of

# Assistant content blocks that never go back to an OpenAI-compatible endpoint: tool calls go
# out as ``tool_calls``; provider reasoning/thinking blocks are rejected by most providers.
_DROPPED_ASSISTANT_BLOCKS = frozenset(
    {"tool_use", "tool_call", "tool_call_chunk", "thinking", "redacted_thinking", "reasoning"}
)


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if obj is None:
        return default
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def to_openai_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages (OpenAI, Anthropic or standard content blocks) -> OpenAI chat dicts."""
    out: list[dict[str, Any]] = []
    for msg in convert_to_openai_messages(list(messages)):
        if msg.get("role") == "assistant" and isinstance(msg.get("content"), list):
            blocks = [
                b
                for b in msg["content"]
                if not (isinstance(b, Mapping) and b.get("type") in _DROPPED_ASSISTANT_BLOCKS)
            ]
            if all(isinstance(b, Mapping) and b.get("type") == "text" for b in blocks):
                msg["content"] = "".join(str(b.get("text") or "") for b in blocks)
            else:
                msg["content"] = blocks
        out.append(msg)
    return out


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return None


def usage_metadata_from(usage: Any) -> UsageMetadata | None:
    """LiteLLM/OpenAI usage (object or dict) -> LangChain ``UsageMetadata`` with int counts."""
    if usage is None:
        return None
    prompt = _int(_get(usage, "prompt_tokens")) or 0
    completion = _int(_get(usage, "completion_tokens")) or 0
    total = _int(_get(usage, "total_tokens"))
    meta = UsageMetadata(
        input_tokens=prompt,
        output_tokens=completion,
        total_tokens=total if total is not None else prompt + completion,
    )
    pdet = _get(usage, "prompt_tokens_details")
    in_details = InputTokenDetails()
    cached = _int(_get(pdet, "cached_tokens"))
    if cached:
        in_details["cache_read"] = cached
    audio_in = _int(_get(pdet, "audio_tokens"))
    if audio_in:
        in_details["audio"] = audio_in
    cache_creation = _int(_get(usage, "cache_creation_input_tokens"))
    if cache_creation:
        in_details["cache_creation"] = cache_creation
    meta["input_token_details"] = in_details  # empty when none are reported, as ChatOpenAI gives it
    cdet = _get(usage, "completion_tokens_details")
    out_details = OutputTokenDetails()
    reasoning = _int(_get(cdet, "reasoning_tokens"))
    if reasoning:
        out_details["reasoning"] = reasoning
    audio_out = _int(_get(cdet, "audio_tokens"))
    if audio_out:
        out_details["audio"] = audio_out
    meta["output_token_details"] = out_details
    return meta


def _json_safe(value: Any) -> Any:
    """``value`` if it round-trips through JSON, else its string form (nested)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


def json_safe(value: Any) -> Any:
    return _json_safe(value)


def _raw_tool_call(tc: Any) -> dict[str, Any]:
    fn = _get(tc, "function")
    return {
        "id": _get(tc, "id"),
        "type": _get(tc, "type") or "function",
        "function": {"name": _get(fn, "name"), "arguments": _get(fn, "arguments") or ""},
    }


def ai_message_from_choice(
    choice: Any,
    *,
    usage: UsageMetadata | None,
    response_metadata: dict[str, Any],
    message_id: str | None,
) -> AIMessage:
    """One non-streamed LiteLLM choice -> ``AIMessage`` (tool calls parsed, invalid ones kept)."""
    message = _get(choice, "message")
    content = _get(message, "content") or ""
    tool_calls = []
    invalid_tool_calls = []
    for raw in _get(message, "tool_calls") or []:
        rt = _raw_tool_call(raw)
        try:
            parsed = parse_tool_call(rt, return_id=True)
        except Exception as e:  # malformed arguments stay visible as an invalid call
            invalid_tool_calls.append(make_invalid_tool_call(rt, str(e)))
            continue
        if parsed:
            tool_calls.append(parsed)
    additional: dict[str, Any] = {}
    reasoning = _get(message, "reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        additional["reasoning_content"] = reasoning
    refusal = _get(message, "refusal")
    if isinstance(refusal, str) and refusal:
        additional["refusal"] = refusal
    kwargs: dict[str, Any] = {}
    if message_id:
        kwargs["id"] = message_id
    return AIMessage(
        content=content,
        additional_kwargs=additional,
        tool_calls=tool_calls,
        invalid_tool_calls=invalid_tool_calls,
        usage_metadata=usage,
        response_metadata=response_metadata,
        **kwargs,
    )


def generations_from_response(
    resp: Any, response_metadata: dict[str, Any]
) -> tuple[list[ChatGeneration], UsageMetadata | None]:
    """A LiteLLM ``ModelResponse`` -> chat generations (one per choice) and its usage."""
    usage = usage_metadata_from(_get(resp, "usage"))
    gens: list[ChatGeneration] = []
    choices = _get(resp, "choices") or []
    # The provider's response id and fingerprint, as ChatOpenAI reports them.
    provider_md = {k: v for k in ("id", "system_fingerprint") if isinstance(v := _get(resp, k), str) and v}
    for i, choice in enumerate(choices):
        finish = _get(choice, "finish_reason")
        raw_logprobs = _get(choice, "logprobs")
        logprobs = _json_safe(
            raw_logprobs.model_dump() if hasattr(raw_logprobs, "model_dump") else raw_logprobs
        )
        meta = {**response_metadata, **provider_md, "finish_reason": finish, "logprobs": logprobs}
        if i > 0:  # usage and cost describe the whole response: report them on one message
            meta.pop("response_cost", None)
        msg = ai_message_from_choice(
            choice,
            usage=usage if i == 0 else None,
            response_metadata=meta,
            message_id=_get(resp, "id") if len(choices) == 1 else None,
        )
        gen_info: dict[str, Any] = {"finish_reason": finish}
        if logprobs is not None:
            gen_info["logprobs"] = logprobs
        gens.append(ChatGeneration(message=msg, generation_info=gen_info))
    return gens, usage


class StreamAssembler:
    """Turns LiteLLM stream chunks into ``ChatGenerationChunk`` s.

    Text and tool-call deltas become chunks as they arrive; the finish reason, usage and cost are
    remembered and reported once, on the closing chunk built by :meth:`final_chunk`.
    """

    def __init__(self) -> None:
        self.finish_reason: str | None = None
        self.usage: UsageMetadata | None = None
        self.response_cost: float | None = None
        self.model: str | None = None
        self.system_fingerprint: str | None = None

    def feed(self, chunk: Any) -> ChatGenerationChunk | None:
        model = _get(chunk, "model")
        if isinstance(model, str) and model and self.model is None:
            self.model = model
        fp = _get(chunk, "system_fingerprint")
        if isinstance(fp, str) and fp:
            self.system_fingerprint = fp
        usage = _get(chunk, "usage")
        if usage is not None and _int(_get(usage, "total_tokens")):
            self.usage = usage_metadata_from(usage)
        hidden = hidden_params_of(chunk)
        if hidden is not None:
            cost = hidden.get("response_cost")
            if isinstance(cost, int | float) and not isinstance(cost, bool) and math.isfinite(cost):
                self.response_cost = float(cost)
        choices = _get(chunk, "choices") or []
        content_parts: list[str] = []
        tool_chunks = []
        additional: dict[str, Any] = {}
        for choice in choices:
            if (_get(choice, "index") or 0) != 0:
                continue  # n > 1 is not streamed
            finish = _get(choice, "finish_reason")
            if finish:
                self.finish_reason = finish
            delta = _get(choice, "delta")
            if delta is None:
                continue
            text = _get(delta, "content")
            if isinstance(text, str) and text:
                content_parts.append(text)
            reasoning = _get(delta, "reasoning_content")
            if isinstance(reasoning, str) and reasoning:
                additional["reasoning_content"] = reasoning
            for tc in _get(delta, "tool_calls") or []:
                fn = _get(tc, "function")
                tool_chunks.append(
                    tool_call_chunk(
                        name=_get(fn, "name"),
                        args=_get(fn, "arguments"),
                        id=_get(tc, "id"),
                        index=_get(tc, "index"),
                    )
                )
        if not content_parts and not tool_chunks and not additional:
            return None
        return ChatGenerationChunk(
            message=AIMessageChunk(
                content="".join(content_parts),
                tool_call_chunks=tool_chunks,
                additional_kwargs=additional,
            )
        )

    def final_chunk(self, response_metadata: dict[str, Any]) -> ChatGenerationChunk:
        meta = dict(response_metadata)
        meta["finish_reason"] = self.finish_reason
        if self.system_fingerprint:
            meta["system_fingerprint"] = self.system_fingerprint
        return ChatGenerationChunk(
            message=AIMessageChunk(
                content="",
                usage_metadata=self.usage,
                response_metadata=meta,
                chunk_position="last",
            ),
            generation_info={"finish_reason": self.finish_reason},
        )
