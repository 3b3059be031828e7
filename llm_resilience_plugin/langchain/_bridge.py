"""Router events -> LangChain callbacks: ``on_retry`` and one custom event per attempt, retry,
fallback and breaker transition, attributed to the LangChain run that made the call.

Custom event names are ``llm_resilience.<kind>`` (``attempt``, ``retry``, ``fallback``,
``breaker``); the data is the record's JSON-safe ``to_dict()``.

Delivery:

* sync runs (``invoke``/``stream``): the router runs its attempt loop on a private event-loop
  thread shared by every sync call of the router, so no sync callback may run there (a slow one
  would hold up every call). Records are queued and delivered on the caller's thread when the
  call (or a stream's next chunk) returns; before a retry sleep, the queued records and then
  ``on_retry`` are delivered on a worker thread while the retry waits. Records raised on the
  caller's own thread (sync runnables) are delivered at once;
* async runs (``ainvoke``/``astream``/``astream_events``): the router's listener is synchronous,
  so records are queued and delivered, in order, at the next await point: before each retry
  sleep (then ``on_retry``), before the first chunk of a stream, and when the call ends.

Breaker transitions come from the router-wide event bus; they are attributed to the call in
whose context they happened (a context variable, which ``asyncio`` and the router's private
loop both carry into the attempt).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import weakref
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from types import FrameType
from typing import Any, TypeVar

import tenacity
from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForChainRun,
    AsyncCallbackManagerForLLMRun,
    BaseCallbackManager,
    CallbackManager,
    CallbackManagerForChainRun,
    CallbackManagerForLLMRun,
)

from llm_resilience_plugin.events import (
    BreakerTransition,
    CallReport,
    Event,
    event_dict,
    event_name,
)

logger = logging.getLogger("llm_resilience")

EVENT_PREFIX = "llm_resilience."

SyncRunManager = CallbackManagerForLLMRun | CallbackManagerForChainRun
AsyncRunManager = AsyncCallbackManagerForLLMRun | AsyncCallbackManagerForChainRun
AnyRunManager = SyncRunManager | AsyncRunManager

_Manager = TypeVar("_Manager", bound=BaseCallbackManager)

_SINK: ContextVar[EventSink | None] = ContextVar("llm_resilience_langchain_sink", default=None)
_BRIDGED: weakref.WeakSet[Any] = weakref.WeakSet()


def custom_event_name(event: Event) -> str:
    return EVENT_PREFIX + event_name(event)


def forward_breaker(event: Event) -> None:
    """Deliver a breaker transition to the LangChain run whose call caused it (if any)."""
    if isinstance(event, BreakerTransition):
        sink = _SINK.get()
        if sink is not None:
            sink.on_event(event)


def bridge_router(router: Any) -> None:
    """Subscribe (once per router) the forwarder of breaker transitions to the current call."""
    if router in _BRIDGED:
        return
    router.subscribe(forward_breaker)
    _BRIDGED.add(router)


def find_run_manager(explicit: Any, *, frames: int = 3) -> Any:
    """The run manager of the LangChain run driving ``_stream``/``_astream``.

    langchain-core 1.8 stopped passing ``run_manager`` to ``_stream``/``_astream`` on its v1
    streaming paths (``stream``, ``astream``, and ``invoke`` with a streaming handler attached,
    which is how ``astream_events`` and LangGraph's "messages" mode drive a model), while it
    still opens the run and keeps the manager in a local named ``run_manager``. Without it a
    retry would be invisible to tracers, so the caller's frame is consulted. Must be called
    from the first line of the generator body (its caller is then the frame iterating it).
    """
    if explicit is not None:
        return explicit
    here = inspect.currentframe()  # this function's; its caller's caller iterates the generator
    frame: FrameType | None = here.f_back.f_back if here is not None and here.f_back is not None else None
    del here  # a frame referring to itself would wait for the cycle collector
    for _ in range(frames):
        if frame is None:
            break
        rm = frame.f_locals.get("run_manager")
        if isinstance(rm, CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun):
            return rm
        frame = frame.f_back
    return None


# What a callback manager for a run's custom events takes over from the run's manager.
_INHERITED = (
    "handlers",
    "inheritable_handlers",
    "tags",
    "inheritable_tags",
    "metadata",
    "inheritable_metadata",
)


def _child_manager(cls: type[_Manager], rm: AnyRunManager) -> _Manager:
    """A callback manager (sync or async) whose custom events land under ``rm``'s run."""
    return cls(parent_run_id=rm.run_id, **{name: getattr(rm, name) for name in _INHERITED})


class EventSink:
    """Delivers one call's router events to one LangChain run."""

    def __init__(self, run_manager: AnyRunManager | None, *, enabled: bool = True) -> None:
        self.run_manager = run_manager
        self.enabled = enabled and run_manager is not None
        self.is_async = isinstance(
            run_manager, AsyncCallbackManagerForLLMRun | AsyncCallbackManagerForChainRun
        )
        self.report: CallReport | None = None
        self.events: list[tuple[str, dict[str, Any]]] = []  # every event, in order
        self._pending: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._home = threading.get_ident()  # the caller's thread: sync callbacks run there
        self._sync_manager: CallbackManager | None = None
        self._async_manager: AsyncCallbackManager | None = None

    # -- the router's per-call listener and before_retry hook ---------------------------------

    def on_event(self, event: Event) -> None:
        if isinstance(event, CallReport):
            self.report = event
            return
        item = (custom_event_name(event), event_dict(event))
        self.events.append(item)
        if not self.enabled:
            return
        if self.is_async or threading.get_ident() != self._home:
            with self._lock:  # delivered later: aflush (async runs) or flush (sync runs)
                self._pending.append(item)
        else:
            self.flush()
            self._dispatch_sync(*item)

    def before_retry_sync(self, retry_state: tenacity.RetryCallState) -> None:
        """Before a retry sleep of a sync run: the queued records, then ``on_retry`` (any thread
        but the router's loop)."""
        rm = self.run_manager
        if rm is None or self.is_async:
            return
        self.flush()
        try:
            rm.on_retry(retry_state)  # type: ignore[union-attr]
        except Exception:
            logger.exception("on_retry callback failed")

    async def before_retry_offloop(self, retry_state: tenacity.RetryCallState) -> None:
        """The router's hook for a sync run: :meth:`before_retry_sync` on a worker thread, so a
        slow handler holds up this call only, not the loop every sync call of the router shares."""
        rm = self.run_manager
        if rm is None or self.is_async or not (rm.handlers or self._pending):
            return
        await asyncio.to_thread(self.before_retry_sync, retry_state)

    async def before_retry_async(self, retry_state: tenacity.RetryCallState) -> None:
        await self.aflush()
        rm = self.run_manager
        if rm is None:
            return
        try:
            if self.is_async:
                await rm.on_retry(retry_state)  # type: ignore[union-attr,misc]
            else:
                rm.on_retry(retry_state)  # type: ignore[union-attr]
        except Exception:
            logger.exception("on_retry callback failed")

    # -- delivery ------------------------------------------------------------------------------

    def _dispatch_sync(self, name: str, data: dict[str, Any]) -> None:
        rm = self.run_manager
        assert rm is not None
        if self._sync_manager is None:
            self._sync_manager = _child_manager(CallbackManager, rm)
        try:
            self._sync_manager.on_custom_event(name, data, run_id=rm.run_id)
        except Exception:
            logger.exception("custom event %s failed", name)

    def flush(self) -> None:
        """Deliver the queued records of a sync run, in order, on the calling thread."""
        if not self._pending or self.is_async:
            return
        with self._lock:
            items, self._pending = self._pending, []
        for name, data in items:
            self._dispatch_sync(name, data)

    async def aflush(self) -> None:
        if not self._pending or not self.is_async:
            return
        rm = self.run_manager
        assert rm is not None
        with self._lock:
            items, self._pending = self._pending, []
        if self._async_manager is None:
            self._async_manager = _child_manager(AsyncCallbackManager, rm)
        for name, data in items:
            try:
                await self._async_manager.on_custom_event(name, data, run_id=rm.run_id)
            except Exception:
                logger.exception("custom event %s failed", name)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Attribute router-wide events (breaker transitions) raised meanwhile to this call."""
        token = _SINK.set(self)
        try:
            yield
        finally:
            _SINK.reset(token)


def config_deadline(config: Mapping[str, Any] | None = None) -> float | None:
    """Seconds left for this run according to its RunnableConfig, if the caller set one.

    Looks at ``configurable`` then ``metadata`` for ``deadline`` / ``timeout`` (seconds from now)
    or ``deadline_at`` (an absolute epoch time, so a deadline set at the top of a chain shrinks as
    the chain runs). Without ``config``, the config of the run in progress is used.
    """
    import time

    from langchain_core.runnables.config import ensure_config

    cfg = ensure_config(config) if config is None else config
    found: list[float] = []
    for section in (cfg.get("configurable") or {}, cfg.get("metadata") or {}):
        for key in ("deadline", "timeout"):
            value = section.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                found.append(float(value))
        at = section.get("deadline_at")
        if isinstance(at, int | float) and not isinstance(at, bool):
            found.append(max(0.001, float(at) - time.time()))
    return min(found) if found else None
