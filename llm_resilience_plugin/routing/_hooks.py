"""LiteLLM's process-wide hooks, held only while some attempt needs them: the deployment filter
(breakers, holds, retry preference) and the pick hook (which deployment an attempt went to).

Requests that do not come from a ResilientRouter pass through untouched.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import litellm
from litellm.integrations.custom_logger import CustomLogger

from llm_resilience_plugin._engine.attempt import AttemptContext

META_KEY = "_llm_resilience_attempt"

# The attempts in flight that asked for a hook, by the token in their request metadata.
ATTEMPTS: dict[str, AttemptContext] = {}


def picked_in(metadata: Mapping[str, Any] | None) -> str | None:
    """The deployment LiteLLM's Router chose, as it records it in the request's metadata."""
    info = (metadata or {}).get("model_info")
    dep = info.get("id") if isinstance(info, Mapping) else None
    return str(dep) if dep is not None else None


class FilterHook(CustomLogger):
    """LiteLLM's deployment filter, registered only while some attempt needs it (a breaker not
    closed, a Retry-After hold, a retry or hedge that prefers another deployment): when every
    breaker is closed, LiteLLM skips its filter stage entirely. Requests that do not come from a
    ResilientRouter pass through untouched."""

    async def async_filter_deployments(  # type: ignore[override]
        self,
        model: str,
        healthy_deployments: list[dict[str, Any]],
        messages: Any,
        request_kwargs: dict[str, Any] | None = None,
        parent_otel_span: Any = None,
    ) -> list[dict[str, Any]]:
        kw = request_kwargs or {}
        token = (kw.get("metadata") or {}).get(META_KEY) or (kw.get("litellm_metadata") or {}).get(META_KEY)
        ctx = ATTEMPTS.get(token) if token is not None else None
        if ctx is None:
            return healthy_deployments
        return ctx.select(healthy_deployments)


class PickHook(CustomLogger):
    """Learns which deployment LiteLLM picked, just before the request is sent."""

    def log_pre_api_call(self, model: Any, messages: Any, kwargs: dict[str, Any]) -> None:
        params = kwargs.get("litellm_params") or {}
        md = params.get("metadata") or {}
        token = md.get(META_KEY)
        if token is None:  # LiteLLM's Responses path: its routing metadata is litellm_metadata
            md = params.get("litellm_metadata") or kwargs.get("litellm_metadata") or {}
            token = md.get(META_KEY) if isinstance(md, Mapping) else None
        ctx = ATTEMPTS.get(token) if token is not None else None
        if ctx is None:
            return
        dep = (md.get("model_info") or {}).get("id") or kwargs.get("model_id")
        if dep is not None:
            ctx.pick(str(dep))
        ctx.sent = True


class Registration:
    """A LiteLLM callback list entry held while its refcount is positive (thread-safe)."""

    _lock = threading.Lock()

    def __init__(self, hook: CustomLogger, callbacks: Callable[[], list[Any]]) -> None:
        self.hook = hook
        self._callbacks = callbacks
        self.users = 0

    def acquire(self) -> None:
        with self._lock:
            self.users += 1
            lst = self._callbacks()
            if not any(cb is self.hook for cb in lst):
                lst.append(self.hook)

    def release(self) -> None:
        with self._lock:
            self.users = max(0, self.users - 1)
            if self.users == 0:
                lst = self._callbacks()
                while any(cb is self.hook for cb in lst):
                    lst.remove(self.hook)


# Both hooks are held only by attempts that need them (a breaker not closed, a hold, a retry or
# hedge, a guard): with them registered LiteLLM does measurably more work per request, for every
# Router in the process.
PICK = Registration(PickHook(), lambda: litellm.input_callback)
FILTER = Registration(FilterHook(), lambda: litellm.callbacks)
