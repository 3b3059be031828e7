"""Helpers of the drop-in parity suite: one deployment served by a plain ``litellm.Router`` and by
a ``ResilientRouter`` (same model_list), and a structural view of what a caller sees.

The allow-list of fields that legitimately differ is explicit here, each with its reason; every
other field must be equal, value for value.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import litellm
from litellm.integrations.custom_logger import CustomLogger

from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin.events import hidden_params_of
from llm_resilience_plugin.testing._simulator import ProviderSimulator
from tests.conftest import FAST_POLICY, deployment

# Fields whose values differ between any two requests, so between the two routers too: the
# comparison checks their shape (the regex), never their value.
VOLATILE: dict[str, tuple[str, str]] = {
    # the simulator numbers its responses (chatcmpl-sim-<n>): two requests, two ids
    "id": (r"chatcmpl-sim-\d+", "per-request counter of the provider"),
    # seconds since the epoch at which each response was made
    "created": (r"\d{10}", "wall-clock time of each response"),
    # tool call ids are numbered per request by the simulator (call_sim_<n>), as a provider's are
    "tool_call_id": (r"call_sim_\d+", "per-request id of a tool call"),
}

# _hidden_params keys a caller (LangChain, cost tracking, logging) reads: present in both, equal.
HIDDEN_READ = (
    "custom_llm_provider",
    "model_id",
    "api_base",
    "response_cost",
    "litellm_model_name",
    "provider_response_model",
    "region_name",
)
# Present in both, values measured per request (latency, LiteLLM's overhead, a uuid).
HIDDEN_VOLATILE = ("_response_ms", "litellm_overhead_time_ms", "callback_duration_ms", "litellm_call_id")
# Keys only the plugin's answer has; a caller of a plain Router never reads them.
HIDDEN_PLUGIN_ONLY = {
    "llm_resilience_report": "the plugin's CallReport (get_report reads it)",
    # LiteLLM's OpenAI handler stores the raw response headers (set_provider_response_headers_in_
    # hidden_params) on the plugin's path and not on a plain Router's; which kwarg selects that
    # path is not pinned down (not timeout, httpx.Timeout or metadata alone). Additive only.
    "headers": "the provider's raw response headers, kept by LiteLLM on the plugin's path",
}


def router_pair(sim: ProviderSimulator, **plugin_kwargs: Any) -> tuple[litellm.Router, ResilientRouter]:
    """A plain Router (its own retries off, so one error is one request) and a ResilientRouter
    over the same single deployment ``a`` of group ``g``: no fallbacks, both see the same error."""
    model_list = [deployment(sim, "g", "a")]
    plain = litellm.Router(model_list=[dict(d) for d in model_list], num_retries=0)
    policy = {**FAST_POLICY, **plugin_kwargs.pop("policy", {})}
    resilient = ResilientRouter(model_list=model_list, policy=policy, seed=7, **plugin_kwargs)
    return plain, resilient


def _volatile(key: str, value: Any) -> str:
    pattern, _ = VOLATILE[key]
    assert re.fullmatch(pattern, str(value)), f"{key}={value!r} is not shaped like {pattern}"
    return f"<{key}>"


def normalize(obj: Any, key: str | None = None) -> Any:
    """``obj`` as plain data with every volatile value replaced by its (checked) shape."""
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump()
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in ("id", "created") and key != "function":
                is_tool_call = key == "tool_calls"
                out[k] = (
                    _volatile("tool_call_id" if is_tool_call and k == "id" else k, v)
                    if v is not None
                    else None
                )
            else:
                out[k] = normalize(v, "tool_calls" if k == "tool_calls" else k)
        return out
    if isinstance(obj, list):
        return [normalize(v, key) for v in obj]
    return obj


def hidden_view(obj: Any) -> dict[str, Any]:
    """The _hidden_params a caller reads (values) and the measured ones (presence only)."""
    hidden = dict(hidden_params_of(obj) or {})
    for name in HIDDEN_PLUGIN_ONLY:
        hidden.pop(name, None)
    view: dict[str, Any] = {k: hidden.pop(k, "<missing>") for k in HIDDEN_READ}
    view.update(
        {k: "<measured>" if hidden.pop(k, None) is not None else "<missing>" for k in HIDDEN_VOLATILE}
    )
    view["others"] = sorted(hidden)  # anything else must be the same set of keys
    return view


def usage_only(chunk: Any) -> bool:
    """The usage-only last chunk: ``choices == []`` (LiteLLM 1.109 on), or one choice with an
    empty delta and no finish reason beside the usage (1.105-1.108)."""
    if not chunk.choices:
        return True
    return getattr(chunk, "usage", None) is not None and all(
        c.finish_reason is None and not c.delta.content and not c.delta.tool_calls for c in chunk.choices
    )


def chunk_shapes(chunks: list[Any]) -> list[Any]:
    """The chunk sequence as normalized plain data."""
    return [normalize(c) for c in chunks]


def close_all(routers: Iterator[Any] | tuple[Any, ...]) -> None:
    """Close the plugin's routers (a plain Router has nothing to close)."""
    for r in routers:
        if isinstance(r, ResilientRouter):
            r.close()


class Events(CustomLogger):
    """A litellm.callbacks user: what success and failure logging report per attempt."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    async def async_log_success_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self.seen.append(("success", kwargs["standard_logging_object"]))

    async def async_log_failure_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self.seen.append(("failure", kwargs["standard_logging_object"]))
