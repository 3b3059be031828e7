"""Structured JSON logs: a stdlib ``logging`` formatter and router-event log records.

Every record this package logs carries its payload in ``record.llm_event`` (a dict) and its
kind in ``record.llm_event_name``; :class:`JsonFormatter` turns any record into one JSON line -
those fields merged at the top level, plus ``ts``, ``level``, ``logger``, ``message`` and
anything passed as ``extra=`` - so it joins an existing log pipeline::

    import logging
    from llm_resilience_plugin.observability import JsonFormatter, attach_router_logging

    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.getLogger("llm_resilience").addHandler(handler)
    logging.getLogger("llm_resilience").setLevel(logging.INFO)
    detach = attach_router_logging(router)         # attempt / retry / fallback / breaker / call

Secrets never appear: values under secret-looking keys (``api_key``, ``authorization``, ...)
are replaced, every API key of an attached router is scrubbed from every string, and strings
that look like provider keys (``sk-...``) are masked. Message content is logged only when asked
(``include_content=True``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from llm_resilience_plugin._redaction import is_secret_key, redact, register_secret, safe_metadata
from llm_resilience_plugin.events import (
    AttemptRecord,
    BreakerTransition,
    CallReport,
    CallStarted,
    Event,
    FallbackTaken,
    RetryScheduled,
)

if TYPE_CHECKING:
    from llm_resilience_plugin.cost._guard import CostGuard, PriceBook
    from llm_resilience_plugin.events import DeploymentInfo
    from llm_resilience_plugin.routing._router import ResilientRouter


def iso_ts(ts: float) -> str:
    """Epoch seconds as an ISO-8601 UTC timestamp with milliseconds."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


_STD_ATTRS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys()
    | {"message", "asctime", "llm_event", "llm_event_name", "taskName"}
)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts`` (UTC ISO-8601), ``level``, ``logger``, ``event``
    (``record.llm_event_name`` or the message), ``message`` (left out when it only repeats
    ``event``, as the router's records do), the ``record.llm_event`` fields,
    any other ``extra=`` fields, and ``exc_type``/``exc_message``/``exc_info`` for exceptions.
    Everything passes through :func:`redact`. ``static`` fields are added to every record
    (``service``, ``env``)."""

    def __init__(self, *, static: Mapping[str, Any] | None = None, sort_keys: bool = False) -> None:
        super().__init__()
        self.static = dict(static or {})
        self.sort_keys = sort_keys

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        out: dict[str, Any] = {
            "ts": iso_ts(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": getattr(record, "llm_event_name", None) or message,
        }
        if message != out["event"]:
            out["message"] = message
        out.update(self.static)
        payload = getattr(record, "llm_event", None)
        if isinstance(payload, Mapping):
            for k, v in payload.items():
                out[k if k not in ("level", "logger", "message") else f"event_{k}"] = v
        for k, v in vars(record).items():
            if k not in _STD_ATTRS and not k.startswith("_") and k not in out:
                out[k] = v
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            out["exc_type"] = type(exc).__name__
            out["exc_message"] = str(exc)[:1000]
            out["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(redact(out), default=str, sort_keys=self.sort_keys)


def configure_json_logging(
    level: int = logging.INFO,
    *,
    logger: str | logging.Logger = "llm_resilience",
    stream: Any = None,
    static: Mapping[str, Any] | None = None,
) -> logging.Handler:
    """Add a ``StreamHandler`` with :class:`JsonFormatter` to ``logger`` (default
    ``llm_resilience``, the parent of every logger this package uses); returns the handler."""
    lg = logging.getLogger(logger) if isinstance(logger, str) else logger
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter(static=static))
    lg.addHandler(handler)
    lg.setLevel(level)
    return handler


# -- router events --------------------------------------------------------------------------------


def provider_of(d: DeploymentInfo | None) -> str | None:
    """The LiteLLM provider of a deployment: ``custom_llm_provider`` or the model's prefix."""
    if d is None:
        return None
    p = (d.params or {}).get("custom_llm_provider")
    if isinstance(p, str) and p:
        return p
    return d.model.split("/", 1)[0] if "/" in d.model else None


def _ms(seconds: float | None) -> float | None:
    return round(seconds * 1000.0, 3) if seconds is not None else None


@dataclass(slots=True)
class _AttemptSeen:
    deployment_id: str | None = None
    served_model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: float | None = None


@dataclass(slots=True)
class _CallSeen:
    idempotency_key: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    messages: Any = None
    attempts: dict[int, _AttemptSeen] = field(default_factory=dict)


_OBSERVERS: weakref.WeakKeyDictionary[Any, RouterObserver] = weakref.WeakKeyDictionary()


class RouterObserver:
    """Remembers, per call, what later log records and metrics want beside the router's events:
    the idempotency key, metadata and tags (from :class:`CallStarted`), and each attempt's
    served model, tokens and cost (from :class:`AttemptRecord`, priced with ``prices`` when the
    provider reported no cost). An event subscriber, one per router, shared by
    :func:`attach_router_logging` and :class:`~llm_resilience_plugin.observability.MetricsCollector`."""

    def __init__(
        self,
        router: ResilientRouter,
        *,
        prices: PriceBook | None = None,
        include_content: bool = False,
        max_calls: int = 10_000,
    ) -> None:
        from llm_resilience_plugin.cost import PriceBook

        self.router = router
        self.prices = prices or PriceBook(unknown_model="zero")
        self.include_content = include_content
        self.max_calls = max_calls
        self.deployments: dict[str, DeploymentInfo] = {d.id: d for d in router.deployments()}
        self._calls: OrderedDict[str, _CallSeen] = OrderedDict()
        self._lock = threading.Lock()
        self.users = 0
        self._unsubscribe = router.subscribe(self.on_event)

    @classmethod
    def for_router(cls, router: ResilientRouter, *, prices: PriceBook | None = None) -> RouterObserver:
        """The router's observer (one per router), subscribed before whoever asks for it."""
        obs = _OBSERVERS.get(router)
        if obs is None:
            obs = _OBSERVERS[router] = cls(router, prices=prices)
        return obs

    def remove(self) -> None:
        """Stop observing the router."""
        self._unsubscribe()
        if _OBSERVERS.get(self.router) is self:
            del _OBSERVERS[self.router]

    def call(self, call_id: str, *, pop: bool = False) -> _CallSeen | None:
        with self._lock:
            return self._calls.pop(call_id, None) if pop else self._calls.get(call_id)

    def on_event(self, event: Event) -> None:
        """Keep what the logger and metrics read later (called for every router event)."""
        if isinstance(event, CallStarted):
            content = event.messages if self.include_content else None
            seen = _CallSeen(
                idempotency_key=event.idempotency_key,
                metadata=dict(event.metadata),
                tags=list(event.tags),
                messages=list(content) if content is not None else None,
            )
            with self._lock:
                self._calls[event.call_id] = seen
                while len(self._calls) > self.max_calls:
                    self._calls.popitem(last=False)
        elif isinstance(event, AttemptRecord):
            a = self._attempt_seen(event)
            with self._lock:
                known = self._calls.get(event.call_id)
                if known is not None:
                    known.attempts[event.attempt] = a

    def _attempt_seen(self, rec: AttemptRecord) -> _AttemptSeen:
        a = _AttemptSeen(deployment_id=rec.deployment_id, served_model=rec.served_model)
        usage = rec.usage
        if usage:
            a.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            a.completion_tokens = int(usage.get("completion_tokens") or 0)
        if rec.outcome != "success":
            a.cost = 0.0 if rec.outcome == "failure" else None
        elif rec.cost is not None and rec.cost > 0:
            a.cost = rec.cost
        elif usage and rec.deployment_id in self.deployments:
            price = self.prices.for_deployment(self.deployments[rec.deployment_id])
            if price.known:
                a.cost = price.cost(a.prompt_tokens or 0, a.completion_tokens or 0)
        return a

    def call_cost(self, call_id: str) -> float | None:
        seen = self.call(call_id)
        if seen is None:
            return None
        costs = [a.cost for a in seen.attempts.values() if a.cost is not None]
        return sum(costs) if costs else None


class RouterEventLogger:
    """Turns router events into log records (see :func:`attach_router_logging`)."""

    def __init__(
        self,
        router: ResilientRouter,
        observer: RouterObserver,
        logger: logging.Logger,
        *,
        level: int = logging.INFO,
        guard: CostGuard | None = None,
        include_content: bool = False,
    ) -> None:
        self.router = router
        self.observer = observer
        self.logger = logger
        self.level = level
        self.guard = guard
        self.include_content = include_content

    def __call__(self, event: Any) -> None:
        rec = self.record(event)
        if rec is None:
            return
        name, level, payload = rec
        if not self.logger.isEnabledFor(level):
            return
        self.logger.log(level, name, extra={"llm_event_name": name, "llm_event": redact(payload)})

    def _budget(self, call_id: str, out: dict[str, Any]) -> None:
        if self.guard is None:
            return
        info = self.guard.call_info(call_id)
        if info is not None:
            out["budget_remaining"] = info.get("budget_remaining")
            out["budget_tightest"] = info.get("budget_tightest")

    def record(self, event: Any) -> tuple[str, int, dict[str, Any]] | None:
        warn = max(self.level, logging.WARNING)
        if isinstance(event, AttemptRecord):
            return "llm_attempt", (self.level if event.outcome == "success" else warn), (self.attempt(event))
        if isinstance(event, CallReport):
            return "llm_call", (self.level if event.outcome == "success" else warn), (self.call(event))
        if isinstance(event, RetryScheduled):
            return (
                "llm_retry",
                self.level,
                {
                    "ts": iso_ts(self.router.clock.wall()),
                    "call_id": event.call_id,
                    "model_group": event.model_group,
                    "retry_number": event.retry_number,
                    "sleep_ms": _ms(event.sleep_s),
                    "error_class": str(event.error_class),
                    "deployment_id": event.deployment_id,
                    "idempotency_key": self._idem(event.call_id),
                },
            )
        if isinstance(event, FallbackTaken):
            return (
                "llm_fallback",
                warn,
                {
                    "ts": iso_ts(self.router.clock.wall()),
                    "call_id": event.call_id,
                    "from_group": event.from_group,
                    "to_group": event.to_group,
                    "fallback_level": event.fallback_level,
                    "reason": str(event.reason),
                    "idempotency_key": self._idem(event.call_id),
                },
            )
        if isinstance(event, BreakerTransition):
            level = warn if event.new_state == "open" else self.level
            return (
                "breaker_transition",
                level,
                {
                    "ts": iso_ts(event.at),
                    "deployment_id": event.deployment_id,
                    "model_group": event.model_group,
                    "old_state": event.old_state,
                    "new_state": event.new_state,
                    "fail_counter": event.fail_counter,
                    "provider": provider_of(self.observer.deployments.get(event.deployment_id)),
                },
            )
        return None

    def _idem(self, call_id: str) -> str | None:
        seen = self.observer.call(call_id)
        return seen.idempotency_key if seen else None

    def attempt(self, a: AttemptRecord) -> dict[str, Any]:
        seen = self.observer.call(a.call_id)
        got = seen.attempts.get(a.attempt) if seen else None
        dep = self.observer.deployments.get(a.deployment_id or "")
        tokens_total = None
        if got is not None and got.prompt_tokens is not None:
            tokens_total = (got.prompt_tokens or 0) + (got.completion_tokens or 0)
        out: dict[str, Any] = {
            "ts": iso_ts(a.started_at),
            "call_id": a.call_id,
            "attempt": a.attempt,
            "retry_number": a.attempt - 1,
            "model_group": a.model_group,
            "deployment_id": a.deployment_id,
            "provider": provider_of(dep),
            "model": dep.model if dep else None,
            "served_model": got.served_model if got else None,
            "fallback_level": a.fallback_level,
            "outcome": a.outcome,
            "error_class": str(a.error_class) if a.error_class else None,
            "status": a.status,
            "error_message": a.error_message,
            "latency_ms": _ms(a.latency_s),
            "ttft_ms": _ms(a.ttft_s),
            "wait_before_ms": _ms(a.wait_before_s),
            "breaker_state": a.breaker_state,
            "probe": a.probe,
            "prompt_tokens": got.prompt_tokens if got else None,
            "completion_tokens": got.completion_tokens if got else None,
            "total_tokens": tokens_total,
            "cost": got.cost if got else None,
            "idempotency_key": seen.idempotency_key if seen else None,
            "request_key": a.call_id,
            "operation": a.operation,
        }
        if seen is not None:
            out["metadata"] = seen.metadata
            if seen.tags:
                out["tags"] = seen.tags
        self._budget(a.call_id, out)
        return out

    def call(self, r: CallReport) -> dict[str, Any]:
        seen = self.observer.call(r.call_id)
        dep = self.observer.deployments.get(r.deployment_id or "")
        usage = r.usage or {}
        cost = r.response_cost
        if cost is None or (cost == 0 and self.observer.call_cost(r.call_id)):
            cost = self.observer.call_cost(r.call_id)
        out: dict[str, Any] = {
            "ts": iso_ts(r.started_at),
            "call_id": r.call_id,
            "requested_group": r.requested_group,
            "served_group": r.served_group,
            "deployment_id": r.deployment_id,
            "provider": provider_of(dep),
            "served_model": r.served_model,
            "stream": r.stream,
            "outcome": r.outcome,
            "error_class": str(r.error_class) if r.error_class else None,
            "latency_ms": _ms(r.total_latency_s),
            "ttft_ms": _ms(r.ttft_s),
            "attempts": len(r.attempts),
            "upstream_requests": r.upstream_requests,
            "retries": r.retries,
            "fallback_level": r.fallback_level,
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "total_tokens": usage.get("total_tokens"),
            "cost": cost,
            "idempotency_key": r.idempotency_key or (seen.idempotency_key if seen else None),
            "request_key": r.call_id,
            "operation": r.operation,
        }
        if r.skipped_stream_events:
            out["skipped_stream_events"] = r.skipped_stream_events
        if seen is not None:
            out["metadata"] = seen.metadata
            if seen.tags:
                out["tags"] = seen.tags
            if self.include_content and seen.messages is not None:
                out["input"] = seen.messages
        self._budget(r.call_id, out)
        return out


def attach_router_logging(
    router: ResilientRouter,
    logger: logging.Logger | str | None = None,
    *,
    level: int = logging.INFO,
    guard: CostGuard | None = None,
    include_content: bool = False,
) -> Callable[[], None]:
    """Log every attempt (``llm_attempt``), retry (``llm_retry``), fallback (``llm_fallback``),
    breaker transition (``breaker_transition``) and call (``llm_call``) of ``router`` as
    structured records on ``logger`` (default ``llm_resilience.router``). Failures, fallbacks and
    breakers opening log at WARNING. With ``guard=`` records carry ``budget_remaining``.

    The router's API keys are registered with :func:`register_secret`, so they are scrubbed from
    every record this module formats. Returns a function that detaches the logging.
    """
    lg = (
        logging.getLogger(logger or "llm_resilience.router")
        if not isinstance(logger, logging.Logger)
        else logger
    )
    for entry in router.spec.model_list:
        params = entry.get("litellm_params") or {}
        for k, v in params.items():
            if is_secret_key(str(k)) and isinstance(v, str):
                register_secret(v)
                if v.startswith("os.environ/"):  # LiteLLM's reference to an env variable
                    register_secret(os.environ.get(v[len("os.environ/") :]))
    observer = RouterObserver.for_router(router, prices=guard.prices if guard else None)
    if include_content:
        observer.include_content = True
    observer.users += 1
    ev_logger = RouterEventLogger(
        router, observer, lg, level=level, guard=guard, include_content=include_content
    )

    unsubscribe = router.subscribe(ev_logger)
    done = False

    def detach() -> None:
        nonlocal done
        if done:
            return
        done = True
        unsubscribe()
        observer.users -= 1
        if observer.users <= 0:
            observer.remove()

    return detach


__all__ = [
    "JsonFormatter",
    "RouterEventLogger",
    "RouterObserver",
    "attach_router_logging",
    "configure_json_logging",
    "iso_ts",
    "provider_of",
    "redact",
    "register_secret",
    "safe_metadata",
]
