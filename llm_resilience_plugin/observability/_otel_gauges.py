"""OpenTelemetry observable gauges read at collection time: retry-budget tokens and capacity per
model group, and each cost budget's spent / remaining / limit dollars in its current window.

The SDK keeps the callbacks of the first registration of an instrument name on a meter, so the
gauges are registered once per meter provider (the global proxy one included, which hands out a
new proxy meter per request) and report every router instrumented through it (held weakly: a
router that is gone, or detached, stops reporting).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from llm_resilience_plugin.observability import _semconv as sc
from llm_resilience_plugin.observability._gauges import budget_rows, pace_rows, retry_budget_rows


class ObservedRouter:
    """One instrumented router as the gauges see it (``scope_values``: a series per scope value)."""

    def __init__(self, router: Any, scope_values: bool) -> None:
        self.router = router
        self.scope_values = scope_values


class ObservedRouters:
    """The routers one meter's gauges report, and the gauges themselves."""

    def __init__(self, meter: Meter) -> None:
        self._routers: weakref.WeakSet[ObservedRouter] = weakref.WeakSet()
        meter.create_observable_gauge(
            f"{sc.NS}.retry_budget.tokens",
            [self._retry_tokens],
            unit="{token}",
            description="Retry-budget tokens left per model group (retries stop below min_fraction)",
        )
        meter.create_observable_gauge(
            f"{sc.NS}.retry_budget.capacity",
            [self._retry_capacity],
            unit="{token}",
            description="Retry-budget capacity per model group",
        )
        meter.create_observable_gauge(
            f"{sc.NS}.budget.spent",
            [self._spent],
            unit="USD",
            description="Dollars a cost budget has spent in its current window",
        )
        meter.create_observable_gauge(
            f"{sc.NS}.budget.remaining",
            [self._remaining],
            unit="USD",
            description="Dollars left in a cost budget's current window (reservations counted)",
        )
        meter.create_observable_gauge(
            f"{sc.NS}.budget.limit", [self._limit], unit="USD", description="A cost budget's limit"
        )
        meter.create_observable_gauge(
            f"{sc.NS}.pacing.queued",
            [self._pace("queued")],
            unit="{call}",
            description="Calls waiting for a rate-limit slot per deployment",
        )
        meter.create_observable_gauge(
            f"{sc.NS}.pacing.limit",
            [self._pace("limit_rpm")],
            unit="{request}/min",
            description="A deployment's paced limit in requests a minute (0: none known)",
        )
        meter.create_observable_counter(
            f"{sc.NS}.pacing.granted",
            [self._pace("granted")],
            unit="{request}",
            description="Requests admitted by a deployment's pace (its rate against pacing.limit)",
        )

    def _pace(self, field: str) -> Any:
        def read(options: CallbackOptions) -> Iterable[Observation]:
            return [
                Observation(
                    getattr(row, field),
                    {f"{sc.NS}.model_group": row.group, f"{sc.NS}.deployment_id": row.deployment},
                )
                for o in list(self._routers)
                for row in pace_rows(o.router)
            ]

        return read

    def add(self, observed: ObservedRouter) -> None:
        self._routers.add(observed)

    def discard(self, observed: ObservedRouter) -> None:
        self._routers.discard(observed)

    def _retry_rows(self) -> Iterable[Any]:
        for o in list(self._routers):
            yield from retry_budget_rows(o.router)

    def _budget_rows(self) -> Iterable[Any]:
        for o in list(self._routers):
            yield from budget_rows(o.router, scope_values=o.scope_values)

    def _retry_tokens(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(r.tokens, {f"{sc.NS}.model_group": r.group}) for r in self._retry_rows()]

    def _retry_capacity(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(r.capacity, {f"{sc.NS}.model_group": r.group}) for r in self._retry_rows()]

    def _spent(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(r.spent, budget_attributes(r)) for r in self._budget_rows()]

    def _remaining(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(r.remaining, budget_attributes(r)) for r in self._budget_rows()]

    def _limit(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(r.limit, budget_attributes(r)) for r in self._budget_rows()]


def budget_attributes(row: Any) -> dict[str, str]:
    """The attributes of one budget row: name, period and scope (``""`` for a global budget)."""
    return {
        f"{sc.NS}.budget": row.budget,
        f"{sc.NS}.budget.period": row.period,
        f"{sc.NS}.budget.scope": row.scope,
    }


_BY_PROVIDER: weakref.WeakKeyDictionary[Any, ObservedRouters] = weakref.WeakKeyDictionary()
_BY_PROVIDER_LOCK = threading.Lock()


def observe(provider: Any, meter: Meter, router: Any, *, scope_values: bool = False) -> ObservedRouter:
    """Report ``router`` through the gauges of ``provider`` (made on ``meter``, one of its meters,
    on first use); keep the returned handle alive as long as it should report, and pass it to
    :func:`unobserve` to stop."""
    with _BY_PROVIDER_LOCK:
        routers = _BY_PROVIDER.get(provider)
        if routers is None:
            routers = _BY_PROVIDER[provider] = ObservedRouters(meter)
    handle = ObservedRouter(router, scope_values)
    routers.add(handle)
    return handle


def unobserve(provider: Any, handle: ObservedRouter) -> None:
    """Stop reporting the router of ``handle``."""
    with _BY_PROVIDER_LOCK:
        routers = _BY_PROVIDER.get(provider)
    if routers is not None:
        routers.discard(handle)
