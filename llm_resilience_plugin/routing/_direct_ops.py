"""Direct dispatch of the other operations: embeddings, text completions, image generations and the
Responses API sent through LiteLLM's own module functions with the kwargs the Router would send.

Each builder follows the Router core's attempt for the operation's endpoint (litellm 1.110,
``litellm/router_rust/invoke/endpoints.py``): ``prepare_request`` (trace id, requested group),
``attempt_call`` (the ``text``/``embedding``/``image`` branch, or ``_generic_attempt`` for
``aresponses``), then the walk's metadata (no retries, no fallbacks: the plugin's own). What the
Router does around the attempt for these endpoints and a direct attempt reproduces: the error
stamps of the endpoint's plan, and the response headers of ``finish_async``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import litellm

from llm_resilience_plugin import _litellm

# The plugin's operation -> LiteLLM's module function a direct attempt calls (the Router's host op).
OPERATION_FUNCTIONS: dict[str, str] = {
    "embedding": "aembedding",
    "text_completion": "atext_completion",
    "image_generation": "aimage_generation",
    "responses": "aresponses",
}
# The Router plans' ``splits_stream_timeout`` for the non-generic endpoints (``PLANS``).
_SPLITS_STREAM_TIMEOUT = {"embedding": False, "text_completion": True, "image_generation": False}
# Request keys only the Router's generic path reproduces (an endpoint path rewrite, a realtime
# session, a stored response's retrieval, a continuation re-shaped per deployment).
GENERIC_ROUTER_ONLY = frozenset({"endpoint", "session", "response_id", "_responses_continuation"})


def metadata_field(operation: str) -> str:
    """Where the Router keeps its routing metadata for ``operation`` (``litellm_metadata`` on the
    generic Responses path; ``metadata`` is then the caller's, sent to the provider)."""
    return "litellm_metadata" if operation == "responses" else "metadata"


def operation_kwargs(
    shaping: Any,
    store: Any,
    routing_keys: frozenset[str],
    operation: str,
    group: str,
    dep: Mapping[str, Any],
    payload: Any,
    kwargs: Mapping[str, Any],
    group_size: int,
    client: Any,
) -> dict[str, Any]:
    """The kwargs the Router's attempt for ``operation`` passes to LiteLLM's function for ``dep``."""
    from llm_resilience_plugin._engine.dispatch import PAYLOAD_KEYS

    found = _pieces()

    field = metadata_field(operation)
    request: dict[str, Any] = {k: v for k, v in kwargs.items() if k not in routing_keys}
    md = dict(request.get(field) or {})
    md["model_group"] = group
    md["model_group_alias"] = None
    request[field] = md
    request.setdefault("litellm_trace_id", str(uuid.uuid4()))
    data = dict(dep["litellm_params"])
    if operation == "responses":
        return _generic_kwargs(shaping, store, group, dep, data, payload, request, md, group_size)
    found.update_kwargs_with_deployment(
        shaping,
        dep,
        request,
        cache=store,
        splits_stream_timeout=_SPLITS_STREAM_TIMEOUT[operation],
    )
    _stamp_walk(md, group, group_size)
    final = {
        **data,
        PAYLOAD_KEYS[operation]: payload,
        "caching": shaping.cache_responses,
        "client": client,
        **request,
    }
    return found.without_router_only_kwargs(final)  # type: ignore[no-any-return]


def _pieces() -> Any:
    """LiteLLM's shaping functions (only called where direct dispatch is available)."""
    found = _litellm.internals().direct
    assert found is not None, "no group is direct without the direct_dispatch capability"
    return found


def _handler_name() -> str:
    """``invoked_handler_name``: the ``__name__`` of the function the Router's host calls."""
    name = getattr(litellm.aresponses, "__name__", None)
    return name if isinstance(name, str) else ""


def _generic_kwargs(
    shaping: Any,
    store: Any,
    group: str,
    dep: Mapping[str, Any],
    data: dict[str, Any],
    payload: Any,
    request: dict[str, Any],
    md: dict[str, Any],
    group_size: int,
) -> dict[str, Any]:
    """``_generic_attempt`` for ``aresponses`` (no endpoint path, session or stored response)."""
    found = _pieces()
    request["input"] = payload
    handler = _handler_name()
    surface = found.surface_for_call(handler)
    if surface is not None:  # ``arm_compaction_state`` at the top of the Router's walk
        request["_context_compaction_state"] = found.initialize_compaction_state(request, surface)
    found.update_kwargs_with_deployment(
        shaping,
        dep,
        request,
        cache=store,
        function_name="_ageneric_api_call_with_fallbacks",
        splits_stream_timeout=handler in found.stream_timeout_aware_generic_handlers,
        opens_responses_socket=False,
    )
    _stamp_walk(md, group, group_size)
    final: dict[str, Any] = {
        **data,
        "caching": shaping.cache_responses,
        **request,
        "model": str(data.get("model")),
    }
    provider = found.provider_for_generic_call(data)
    if provider is not None:
        final["custom_llm_provider"] = provider
    return final


def _stamp_walk(md: dict[str, Any], group: str, group_size: int) -> None:
    """The walk's metadata for the requested group's first attempt (the plugin retries itself)."""
    md.update(
        {
            "original_model_group": group,
            "attempted_fallbacks": 0,
            "attempted_retries": 0,
            "max_retries": 0,
            "model_group_size": group_size,
        }
    )


def stamp_operation_error(
    operation: str, error: BaseException, dep: Mapping[str, Any], sent: Mapping[str, Any]
) -> None:
    """What the endpoint's attempt helper stamps on the error it raises (``stamp_error`` with the
    plan's ``stamp``: ``retry_skip`` for embedding, text and image, ``deployment`` for Responses)."""
    found = _pieces()
    if operation == "responses":
        found.stamp_deployment_num_retries(error, dep)
        found.stamp_failed_deployment_id(error, sent.get("model_info") or dep.get("model_info"))
        return
    found.stamp_retry_skip_deployment_id(error, sent)
    found.stamp_failed_deployment_id(error, sent.get("model_info"))


__all__ = [
    "GENERIC_ROUTER_ONLY",
    "OPERATION_FUNCTIONS",
    "metadata_field",
    "operation_kwargs",
    "stamp_operation_error",
]
