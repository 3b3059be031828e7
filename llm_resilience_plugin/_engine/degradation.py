"""Graceful degradation: trimmed context, capability limits per fallback level, static answers."""

from __future__ import annotations

import math
import re
import time
from typing import Any

from llm_resilience_plugin._litellm import set_hidden_params
from llm_resilience_plugin.policy import LevelDegradation

_LIMIT_RE = re.compile(r"(?:maximum context length|context window|limit) (?:is|of) (\d[\d,]*) tokens", re.I)


_USED_RE = re.compile(r"(?:resulted in|requested|you requested|prompt has) (\d[\d,]*) tokens", re.I)


def context_limit_from_error(message: str) -> int | None:
    """The token limit a context-window error states, e.g. "maximum context length is 8192 tokens"."""
    m = _LIMIT_RE.search(message)
    return int(m.group(1).replace(",", "")) if m else None


def prompt_tokens_from_error(message: str) -> int | None:
    """The prompt size the provider counted, e.g. "your messages resulted in 9000 tokens"."""
    m = _USED_RE.search(message)
    return int(m.group(1).replace(",", "")) if m else None


def count_tokens(model: str, messages: list[dict[str, Any]]) -> int:
    """Prompt tokens by LiteLLM's offline counter (falls back to ~4 characters a token)."""
    try:
        import litellm

        return int(litellm.token_counter(model=model, messages=messages))
    except Exception:
        return sum(4 + len(str(m.get("content") or "")) // 4 for m in messages) + 2


def count_text_tokens(model: str, text: str) -> int:
    """Tokens of plain ``text`` by LiteLLM's offline counter (falls back to ~4 characters a token)."""
    if not text:
        return 0
    try:
        import litellm

        return int(litellm.token_counter(model=model, text=text))
    except Exception:
        return math.ceil(len(text) / 4)


def trim_messages(
    messages: list[dict[str, Any]],
    limit: int,
    *,
    model: str,
    reserve_output: int = 0,
    keep_last: int = 2,
    provider_count: int | None = None,
) -> list[dict[str, Any]] | None:
    """Drop the oldest non-system turns until the prompt fits ``limit - reserve_output`` tokens.

    System messages and the last ``keep_last`` messages are always kept; a tool result is never
    separated from the assistant message that asked for it. Returns None when nothing can be
    dropped or the result still does not fit (the caller must not resend the same request).
    """
    ours = count_tokens(model, messages)
    # The provider's tokenizer may count more than ours: scale by the count it reported.
    scale = max(1.0, provider_count / ours) if provider_count and ours else 1.0
    budget = (limit - reserve_output) / scale
    system = [m for m in messages if m.get("role") == "system"]
    rest = [m for m in messages if m.get("role") != "system"]
    if ours <= budget:
        return None
    for start in range(1, max(1, len(rest) - keep_last + 1)):
        tail = rest[start:]
        while tail and tail[0].get("role") == "tool":  # keep tool results with their call
            tail = tail[1:]
        candidate = system + tail
        if len(tail) < keep_last:
            break
        if count_tokens(model, candidate) <= budget:
            return candidate
    return None


def apply_level(kwargs: dict[str, Any], level: LevelDegradation | None) -> tuple[dict[str, Any], list[str]]:
    """Kwargs for a fallback level, and what was changed (for the report and logs)."""
    if level is None:
        return kwargs, []
    out = dict(kwargs)
    changes: list[str] = []
    if level.max_tokens is not None:
        current = out.get("max_tokens")
        if current is None or current > level.max_tokens:
            out["max_tokens"] = level.max_tokens
            changes.append(f"max_tokens={level.max_tokens}")
    if level.drop_tools and ("tools" in out or "tool_choice" in out):
        out.pop("tools", None)
        out.pop("tool_choice", None)
        out.pop("parallel_tool_calls", None)
        changes.append("tools dropped")
    return out, changes


def static_response(text: str, group: str, scenario: str, messages: list[dict[str, Any]]) -> Any:
    """A LiteLLM ``ModelResponse`` carrying a configured answer, marked as degraded."""
    import litellm

    resp = litellm.ModelResponse(
        id=f"static-{scenario}-{int(time.time() * 1000)}",
        model=f"static:{scenario}",
        choices=[
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": text},
            }
        ],
        usage={"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    )
    set_hidden_params(resp, {"degraded": "static_answer", "scenario": scenario, "model_group": group})
    return resp
