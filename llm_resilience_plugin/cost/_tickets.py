"""What the cost guard hands out and remembers: the :class:`Ticket` of one reservation, and
:class:`RecentCalls`, the bounded memory of recent requests' estimates and costs."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from llm_resilience_plugin.cost._ledger import KeyUsage, Reservation
from llm_resilience_plugin.cost._prices import Price

_RECENT_CALLS = 10_000


@dataclass(slots=True)
class Ticket:
    """What :meth:`CostGuard.reserve` returns; hand it back to settle or release."""

    reservation: Reservation
    request_id: str
    estimate: float
    prompt_tokens: int
    max_tokens: int
    prices: dict[str, Price]  # by deployment id (or model name)
    fallback_price: Price
    model: str | None
    model_group: str | None
    scopes: dict[str, str]
    started_at: float
    day: str
    month: str
    done: bool = False
    cost: float | None = None
    requested_max_tokens: int | None = None  # the request's own max_tokens (None: not set)
    copies: int = 1  # choices asked for (n): the output limit is requested_max_tokens x copies


@dataclass(slots=True)
class _Call:
    """What the guard remembers of one recent request (for logs and metrics)."""

    estimate: float = 0.0
    cost: float = 0.0
    attempts: dict[int, float] = field(default_factory=dict)
    remaining: float | None = None
    remaining_budget: str | None = None


class RecentCalls:
    """What the guard remembers of its last requests (estimate, cost per attempt, tightest
    budget left), bounded, so logs and metrics can report a call's cost after it ends."""

    def __init__(self, limit: int = _RECENT_CALLS) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._calls: OrderedDict[str, _Call] = OrderedDict()

    def _touch(self, rid: str) -> _Call:
        call = self._calls.get(rid)
        if call is None:
            call = self._calls[rid] = _Call()
            while len(self._calls) > self._limit:
                self._calls.popitem(last=False)
        else:
            self._calls.move_to_end(rid)
        return call

    def reserved(self, request_id: str, amount: float) -> None:
        """Add a reservation's ``amount`` to the request's estimate."""
        with self._lock:
            self._touch(request_id).estimate += amount

    def settled(self, request_id: str, cost: float, attempt: int | None, usages: Iterable[KeyUsage]) -> None:
        """Add a settled attempt's ``cost`` and note the tightest budget left after it."""
        tightest: KeyUsage | None = None
        for u in usages:
            if tightest is None or u.remaining < tightest.remaining:
                tightest = u
        with self._lock:
            call = self._touch(request_id)
            call.cost += cost
            if attempt is not None:
                call.attempts[attempt] = cost
            if tightest is not None:
                call.remaining = tightest.remaining
                call.remaining_budget = tightest.label

    def info(self, request_id: str) -> dict[str, Any] | None:
        """The request's record as a dict, or None when it is unknown or forgotten."""
        with self._lock:
            call = self._calls.get(request_id)
            if call is None:
                return None
            return {
                "estimate": call.estimate,
                "cost": call.cost,
                "attempt_costs": dict(call.attempts),
                "budget_remaining": call.remaining,
                "budget_tightest": call.remaining_budget,
            }


__all__ = ["RecentCalls", "Ticket"]
