"""Where the cost guard keeps its money: reservations, settled spend, alerts, a spend log.

A :class:`Ledger` knows nothing about budgets, periods or prices. It keeps, per *budget key*
(one budget x one scope value x one window, e.g. ``tenant`` / ``tenant=acme`` / ``2026-11-30``),
two sums - ``spent`` and ``reserved`` - and offers five operations:

* :meth:`Ledger.reserve` - add ``amount`` to ``reserved`` of N keys at once, atomically, or
  refuse with :class:`~llm_resilience_plugin.errors.BudgetExceededError` (nothing changes) if
  ``spent + reserved + amount > limit`` for any of them;
* :meth:`Ledger.settle` - turn a reservation into actual spend (and log a :class:`SpendEntry`);
* :meth:`Ledger.release` - drop a reservation (the attempt cost nothing);
* :meth:`Ledger.usage` / :meth:`Ledger.list_usage` / :meth:`Ledger.entries` - queries;
* :meth:`Ledger.mark_alert` - "has this alert fired for this key?" as an atomic test-and-set.

Money is kept as integer nano-dollars (1e-9 $) so sums are exact whatever the order of
additions; the API speaks float dollars. Reservations carry an expiry: a process that dies
between reserve and settle does not hold budget forever. The next reserve *reaps* it - settles
it at its reserved amount (the request may have been sent and billed), logged as a
:class:`SpendEntry` marked ``reaped`` and ``estimated`` - never silently drops it. If the
reservation's own settle or release arrives after all, it replaces that estimate (the reaped
entry is taken back) for :data:`REAPED_MEMORY` seconds after the reaping.

This module holds the interface, the records and :class:`MemoryLedger` (one process). The other
backends build on it in their own modules: ``SQLiteLedger`` in ``_sqlite_ledger`` (WAL, ``BEGIN
IMMEDIATE``: atomic across threads and processes on one machine, survives restarts) and
``RedisLedger`` in ``_redis_ledger`` (a Lua script for ``reserve``/``settle``/``release``);
``open_ledger`` (``_open``) picks one from a spec.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from llm_resilience_plugin.errors import BudgetExceededError

NANO = 1_000_000_000
REAPED_MEMORY = 86400.0  # seconds a reaped reservation is remembered, so a late settle replaces it
REAPED_REMEMBERED = 100_000  # reaped reservations the in-memory ledger remembers at most

logger = logging.getLogger("llm_resilience.cost")


def to_nano(dollars: float) -> int:
    """Dollars -> integer nano-dollars, rounded up (reservations and spend are never understated).

    The value is first rounded to 1e-3 nano-dollars so float noise (``13 * 1.5e-7`` is
    ``1.9500000000000002e-06``) does not round a whole nano-dollar up.
    """
    return math.ceil(round(float(dollars) * NANO, 3))


def from_nano(units: int) -> float:
    """Integer nano-dollars -> dollars."""
    return units / NANO


@dataclass(frozen=True, slots=True)
class BudgetKey:
    """One budget x one scope value x one window: the unit the ledger counts.

    ``scope`` is ``""`` for a global budget, ``"tenant=acme"`` for a scoped one, ``"request=<id>"``
    or ``"run=<id>"`` for per-request / per-run budgets. ``window`` is ``"2026-11-30"`` (a day),
    ``"2026-11"`` (a month), ``"all"`` (no period) or ``"request"`` / ``"run"``.
    ``expires_at`` (epoch seconds) lets the ledger forget the key once it is idle past that time
    (``None``: kept forever).
    """

    budget: str
    scope: str
    window: str
    limit: float
    expires_at: float | None = None

    @property
    def id(self) -> str:
        return f"{self.budget}\x1f{self.scope}\x1f{self.window}"

    @property
    def label(self) -> str:
        """Human name, e.g. ``tenant/day[tenant=acme] 2026-11-30``, ``daily 2026-11-30``,
        ``per_run[run=<id>]`` or ``per_request``."""
        if self.window == "request":
            return self.budget
        scope = f"[{self.scope}]" if self.scope else ""
        window = "" if self.window in ("all", "request", "run") else f" {self.window}"
        return f"{self.budget}{scope}{window}"


@dataclass(frozen=True, slots=True)
class KeyUsage:
    """Spend and outstanding reservations of one key (dollars)."""

    budget: str
    scope: str
    window: str
    spent: float
    reserved: float
    limit: float

    @property
    def remaining(self) -> float:
        return max(0.0, self.limit - self.spent - self.reserved)

    @property
    def label(self) -> str:
        return BudgetKey(self.budget, self.scope, self.window, self.limit).label

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "scope": self.scope or None,
            "window": self.window,
            "spent": self.spent,
            "reserved": self.reserved,
            "limit": self.limit,
            "remaining": self.remaining,
        }


@dataclass(frozen=True, slots=True)
class Reservation:
    """A reserved amount held against ``keys`` until settled or released."""

    id: str
    keys: tuple[BudgetKey, ...]
    amount: float
    created_at: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class SpendEntry:
    """One settled attempt, for reports (spend by day, model, deployment, scope)."""

    ts: float
    day: str
    month: str
    cost: float
    model: str | None = None
    model_group: str | None = None
    deployment_id: str | None = None
    scopes: Mapping[str, str] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    request_id: str | None = None
    estimated: bool = False  # settled at the estimate (no usage known)
    reaped: bool = False  # its process never settled it: the ledger settled it at its reservation

    def to_dict(self) -> dict[str, Any]:
        """The entry as a JSON-ready dict (what the Redis ledger logs and the CLI prints)."""
        return {
            "ts": self.ts,
            "day": self.day,
            "month": self.month,
            "cost": self.cost,
            "model": self.model,
            "model_group": self.model_group,
            "deployment_id": self.deployment_id,
            "scopes": dict(self.scopes),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "request_id": self.request_id,
            "estimated": self.estimated,
            "reaped": self.reaped,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SpendEntry:
        """The entry :meth:`to_dict` wrote (``cost_nano``, when present, wins over ``cost``)."""
        cost = from_nano(int(d["cost_nano"])) if d.get("cost_nano") is not None else float(d["cost"])
        return cls(
            ts=float(d["ts"]),
            day=str(d["day"]),
            month=str(d["month"]),
            cost=cost,
            model=d.get("model"),
            model_group=d.get("model_group"),
            deployment_id=d.get("deployment_id"),
            scopes=d.get("scopes") or {},
            prompt_tokens=int(d.get("prompt_tokens") or 0),
            completion_tokens=int(d.get("completion_tokens") or 0),
            request_id=d.get("request_id"),
            estimated=bool(d.get("estimated")),
            reaped=bool(d.get("reaped")),
        )


def reaped_entry(reservation: Reservation, entry: SpendEntry | None) -> SpendEntry:
    """What the spend log records for a reaped reservation: the entry its guard gave at reserve
    time (else one dated by the reservation, in UTC), at the reserved amount, marked reaped."""
    if entry is None:
        t = time.gmtime(reservation.created_at)
        entry = SpendEntry(
            ts=reservation.created_at,
            day=time.strftime("%Y-%m-%d", t),
            month=time.strftime("%Y-%m", t),
            cost=0.0,
        )
    return replace(entry, cost=reservation.amount, estimated=True, reaped=True)


def log_reaped(reservation_id: str, amount: float, entry: SpendEntry | None, keys: Iterable[str]) -> None:
    """Log one reaped reservation as ``reservation_reaped`` (a process died or a call outlived
    ``reservation_ttl``: its reservation became spend at the estimate)."""
    logger.warning(
        "reservation_reaped",
        extra={
            "llm_event_name": "reservation_reaped",
            "llm_event": {
                "reservation_id": reservation_id,
                "amount": amount,
                "request_id": entry.request_id if entry is not None else None,
                "model": entry.model if entry is not None else None,
                "budgets": sorted(keys),
            },
        },
    )


@dataclass(slots=True)
class SpendReport:
    """Settled spend aggregated from the spend log, plus the current state of budgets."""

    total: float = 0.0
    calls: int = 0
    reaped: int = 0  # of the calls, those settled by reaping (at their reserved estimate)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    by_day: dict[str, float] = field(default_factory=dict)
    by_month: dict[str, float] = field(default_factory=dict)
    by_model: dict[str, float] = field(default_factory=dict)
    by_model_group: dict[str, float] = field(default_factory=dict)
    by_deployment: dict[str, float] = field(default_factory=dict)
    by_scope: dict[str, float] = field(default_factory=dict)
    budgets: list[KeyUsage] = field(default_factory=list)

    @classmethod
    def from_entries(cls, entries: Iterable[SpendEntry]) -> SpendReport:
        nano: dict[str, dict[str, int]] = {
            k: {} for k in ("day", "month", "model", "group", "deployment", "scope")
        }
        total = 0
        rep = cls()

        def add(kind: str, key: str | None, units: int) -> None:
            if key is None:
                return
            d = nano[kind]
            d[key] = d.get(key, 0) + units

        for e in entries:
            units = to_nano(e.cost)
            total += units
            rep.calls += 1
            rep.reaped += int(e.reaped)
            rep.prompt_tokens += e.prompt_tokens
            rep.completion_tokens += e.completion_tokens
            add("day", e.day, units)
            add("month", e.month, units)
            add("model", e.model, units)
            add("group", e.model_group, units)
            add("deployment", e.deployment_id, units)
            for k, v in e.scopes.items():
                add("scope", f"{k}={v}", units)
        rep.total = from_nano(total)

        def dollars(kind: str) -> dict[str, float]:
            return {k: from_nano(v) for k, v in sorted(nano[kind].items())}

        rep.by_day = dollars("day")
        rep.by_month = dollars("month")
        rep.by_model = dollars("model")
        rep.by_model_group = dollars("group")
        rep.by_deployment = dollars("deployment")
        rep.by_scope = dollars("scope")
        return rep

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "calls": self.calls,
            "reaped": self.reaped,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "by_day": self.by_day,
            "by_month": self.by_month,
            "by_model": self.by_model,
            "by_model_group": self.by_model_group,
            "by_deployment": self.by_deployment,
            "by_scope": self.by_scope,
            "budgets": [b.to_dict() for b in self.budgets],
        }

    def __str__(self) -> str:
        lines = [f"total ${self.total:.6f} over {self.calls} settled call(s)"]
        if self.reaped:
            lines[0] += f", {self.reaped} reaped at their estimate (their process never settled them)"
        for title, table in (
            ("by day", self.by_day),
            ("by model", self.by_model),
            ("by deployment", self.by_deployment),
            ("by scope", self.by_scope),
        ):
            if table:
                lines.append(f"{title}:")
                lines.extend(f"  {k:<32} ${v:.6f}" for k, v in table.items())
        if self.budgets:
            lines.append("budgets (current windows):")
            for b in self.budgets:
                lines.append(
                    f"  {b.label:<32} spent ${b.spent:.6f} reserved ${b.reserved:.6f}"
                    f" of ${b.limit:.6f} (remaining ${b.remaining:.6f})"
                )
        return "\n".join(lines)


def refusal(key: BudgetKey, spent: int, reserved: int, amount: int) -> BudgetExceededError:
    """The refusal every ledger raises when a reservation does not fit ``key``'s limit."""
    return BudgetExceededError(
        key.label,
        from_nano(spent + reserved),
        from_nano(amount),
        float(key.limit),
        budget_name=key.budget,
        scope=key.scope,
        window=key.window,
        settled=from_nano(spent),
        in_flight=from_nano(reserved),
    )


class Ledger(ABC):
    """Storage for the cost guard. Implementations must make :meth:`reserve` atomic over all
    keys it is given (check every key, then add to every key, or change nothing)."""

    @abstractmethod
    def reserve(
        self,
        keys: Sequence[BudgetKey],
        amount: float,
        *,
        now: float,
        ttl: float,
        entry: SpendEntry | None = None,
    ) -> Reservation:
        """Hold ``amount`` against every key or raise ``BudgetExceededError`` naming the first
        key it does not fit (its label, spend incl. in-flight reservations, amount, limit).

        Reservations past their expiry are reaped first: each becomes spend at its reserved
        amount, logged as its ``entry`` (see :func:`reaped_entry`). ``entry`` is what to log
        for this reservation if it is reaped in turn."""

    @abstractmethod
    def settle(
        self, reservation: Reservation, actual: float, entry: SpendEntry | None = None
    ) -> list[KeyUsage]:
        """Replace the reservation by ``actual`` spend on its keys; returns their new usage.

        Settling a reservation that was already reaped replaces the reaped estimate (its spend
        and its log entry) by ``actual``, once, within :data:`REAPED_MEMORY` seconds."""

    @abstractmethod
    def release(self, reservation: Reservation) -> None:
        """Drop the reservation (idempotent); one already reaped takes its reaped spend back."""

    @abstractmethod
    def usage(self, keys: Sequence[BudgetKey]) -> list[KeyUsage]:
        """Current usage of ``keys`` (zero for keys never seen)."""

    @abstractmethod
    def list_usage(self, budget: str | None = None, window: str | None = None) -> list[KeyUsage]:
        """Every key the ledger holds, optionally filtered by budget name and window."""

    @abstractmethod
    def entries(self, since: float | None = None, until: float | None = None) -> list[SpendEntry]:
        """The spend log between ``since`` (inclusive) and ``until`` (exclusive), by time."""

    @abstractmethod
    def mark_alert(self, key: BudgetKey, threshold: float) -> bool:
        """Record that the ``threshold`` alert fired for ``key``; False if it already had."""

    def report(self, since: float | None = None, until: float | None = None) -> SpendReport:
        return SpendReport.from_entries(self.entries(since, until))

    def prune(self, now: float) -> None:  # noqa: B027 - optional
        """Forget idle keys past their ``expires_at`` and reap expired reservations."""

    def close(self) -> None:  # noqa: B027 - optional
        """Release resources (connections)."""

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- in memory ------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Row:
    key: BudgetKey
    spent: int = 0
    reserved: int = 0


class MemoryLedger(Ledger):
    """A ledger in this process's memory (thread-safe; lost on exit)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[str, _Row] = {}
        self._reservations: dict[str, tuple[Reservation, SpendEntry | None]] = {}
        self._entries: list[SpendEntry] = []
        self._alerts: set[tuple[str, float]] = set()
        # reaped reservations: id -> (the reservation, its reaped units, its log entry, reaped at)
        self._reaped: OrderedDict[str, tuple[Reservation, int, SpendEntry, float]] = OrderedDict()
        self._next_reap = 0.0

    def _row(self, key: BudgetKey) -> _Row:
        row = self._rows.get(key.id)
        if row is None:
            row = self._rows[key.id] = _Row(key)
            return row
        old = row.key
        exp = key.expires_at
        if exp is not None and old.expires_at is not None:
            exp = max(exp, old.expires_at)
        if old.limit != key.limit or old.expires_at != exp:
            row.key = BudgetKey(key.budget, key.scope, key.window, key.limit, exp)
        return row

    def reserve(
        self,
        keys: Sequence[BudgetKey],
        amount: float,
        *,
        now: float,
        ttl: float,
        entry: SpendEntry | None = None,
    ) -> Reservation:
        units = to_nano(amount)
        with self._lock:
            if now >= self._next_reap:
                self._reap(now)
            rows = [self._row(k) for k in keys]
            for k, row in zip(keys, rows, strict=True):
                if row.spent + row.reserved + units > to_nano(k.limit):
                    raise refusal(k, row.spent, row.reserved, units)
            for row in rows:
                row.reserved += units
            res = Reservation(uuid.uuid4().hex, tuple(keys), from_nano(units), now, now + ttl)
            self._reservations[res.id] = (res, entry)
            return res

    def _reap(self, now: float) -> None:
        """Settle every expired reservation at its reserved amount; forget idle keys."""
        self._next_reap = now + 1.0
        for rid, (res, entry) in list(self._reservations.items()):
            if res.expires_at <= now:
                units = self._drop(rid)
                for k in res.keys:
                    row = self._rows.get(k.id)
                    if row is not None:
                        row.spent += units
                logged = reaped_entry(res, entry)
                self._entries.append(logged)
                self._reaped[rid] = (res, units, logged, now)
                log_reaped(rid, res.amount, entry, (k.label for k in res.keys))
        while self._reaped and (
            len(self._reaped) > REAPED_REMEMBERED
            or next(iter(self._reaped.values()))[3] <= now - REAPED_MEMORY
        ):
            self._reaped.popitem(last=False)
        for kid, row in list(self._rows.items()):
            exp = row.key.expires_at
            if exp is not None and exp <= now and row.reserved == 0:
                del self._rows[kid]

    def _drop(self, rid: str) -> int:
        """Take a live reservation off its keys; returns its units (0: not held)."""
        held = self._reservations.pop(rid, None)
        if held is None:
            return 0
        units = to_nano(held[0].amount)
        for k in held[0].keys:
            row = self._rows.get(k.id)
            if row is not None:
                row.reserved = max(0, row.reserved - units)
        return units

    def _unreap(self, rid: str) -> int:
        """Take back a reaped reservation's log entry; returns the units it was settled at."""
        reaped = self._reaped.pop(rid, None)
        if reaped is None:
            return 0
        try:
            self._entries.remove(reaped[2])
        except ValueError:  # pragma: no cover - the log is append-only otherwise
            pass
        return reaped[1]

    def settle(
        self, reservation: Reservation, actual: float, entry: SpendEntry | None = None
    ) -> list[KeyUsage]:
        units = to_nano(actual)
        with self._lock:
            self._drop(reservation.id)
            back = self._unreap(reservation.id)
            out = []
            for k in reservation.keys:
                row = self._row(k)
                row.spent = max(0, row.spent + units - back)
                out.append(self._usage(row))
            if entry is not None:
                self._entries.append(entry)
            return out

    def release(self, reservation: Reservation) -> None:
        with self._lock:
            self._drop(reservation.id)
            back = self._unreap(reservation.id)
            if back:
                for k in reservation.keys:
                    row = self._rows.get(k.id)
                    if row is not None:
                        row.spent = max(0, row.spent - back)

    @staticmethod
    def _usage(row: _Row) -> KeyUsage:
        k = row.key
        return KeyUsage(k.budget, k.scope, k.window, from_nano(row.spent), from_nano(row.reserved), k.limit)

    def usage(self, keys: Sequence[BudgetKey]) -> list[KeyUsage]:
        with self._lock:
            out = []
            for k in keys:
                row = self._rows.get(k.id)
                out.append(
                    self._usage(row)
                    if row is not None
                    else KeyUsage(k.budget, k.scope, k.window, 0.0, 0.0, k.limit)
                )
            return out

    def list_usage(self, budget: str | None = None, window: str | None = None) -> list[KeyUsage]:
        with self._lock:
            return [
                self._usage(r)
                for r in self._rows.values()
                if (budget is None or r.key.budget == budget) and (window is None or r.key.window == window)
            ]

    def entries(self, since: float | None = None, until: float | None = None) -> list[SpendEntry]:
        with self._lock:
            return sorted(
                (
                    e
                    for e in self._entries
                    if (since is None or e.ts >= since) and (until is None or e.ts < until)
                ),
                key=lambda e: e.ts,
            )

    def mark_alert(self, key: BudgetKey, threshold: float) -> bool:
        with self._lock:
            marker = (key.id, float(threshold))
            if marker in self._alerts:
                return False
            self._alerts.add(marker)
            return True

    def prune(self, now: float) -> None:
        with self._lock:
            self._reap(now)


__all__ = [
    "NANO",
    "REAPED_MEMORY",
    "BudgetKey",
    "KeyUsage",
    "Ledger",
    "MemoryLedger",
    "Reservation",
    "SpendEntry",
    "SpendReport",
    "from_nano",
    "log_reaped",
    "reaped_entry",
    "refusal",
]
