"""Cost guard: price every attempt, reserve before it is sent, settle after, never overspend.

::

    guard = CostGuard(
        budgets=[Budget.per_request(0.50), Budget.daily(50), Budget.monthly(1000),
                 Budget.scoped("tenant", 5, period="day")],
        ledger="sqlite:///spend.db",
        alert_at=0.8,
    )
    router = ResilientRouter(model_list, guards=[guard])     # or the LangChain handler
    guard.report()                                            # spend by day, model, deployment, scope

Before every attempt (retries, fallbacks, hedges) the guard estimates its worst-case cost -
prompt tokens counted offline with LiteLLM's ``token_counter`` (plus ``prompt_margin``) times the
input price, plus ``max_tokens`` (or ``default_max_tokens``, or the model's maximum output) times
the output price, the maximum over the deployments that may serve it - and reserves it in the
ledger against every budget that applies, atomically. If it does not fit, the attempt is refused
with :class:`~llm_resilience_plugin.errors.BudgetExceededError` before any request is sent. After
the attempt the reservation is settled to the actual cost (the provider's reported
``response_cost`` when there is one, else usage x the serving deployment's prices), or released
when the attempt failed.

Prices come from LiteLLM's bundled price map (offline), overridden per deployment by
``input_cost_per_token`` / ``output_cost_per_token`` (``litellm_params`` or ``model_info``) or per
model by ``CostGuard(prices=...)``. A model with no known price is a :class:`ConfigError` unless
``unknown_model`` says otherwise (``"zero"`` or a fixed price) - never a silent $0.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from llm_resilience_plugin import _env  # noqa: F401  (offline price map before litellm loads)
from llm_resilience_plugin.cost._ledger import (
    BudgetKey,
    KeyUsage,
    Ledger,
    Reservation,
    SpendEntry,
    SpendReport,
    open_ledger,
)
from llm_resilience_plugin.cost._prices import (
    Candidate,
    Price,
    PriceBook,
    PriceLike,
    UnknownModelPolicy,
    coerce_price,
    is_number,
)
from llm_resilience_plugin.errors import BudgetExceededError, ConfigError, Failure
from llm_resilience_plugin.events import hidden_params_of

if TYPE_CHECKING:
    from llm_resilience_plugin.events import AttemptInfo, DeploymentInfo
    from llm_resilience_plugin.routing._router import ResilientRouter

logger = logging.getLogger("llm_resilience.cost")

Period = Literal["request", "run", "day", "month", "total"]
_PERIODS: tuple[str, ...] = ("request", "run", "day", "month", "total")
_SCOPED_PERIODS: tuple[str, ...] = ("day", "month", "total")


# -- budgets --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Budget:
    """A spending limit in dollars over a period, optionally per scope value.

    Build with :meth:`per_request`, :meth:`per_run`, :meth:`daily`, :meth:`monthly`,
    :meth:`total` or :meth:`scoped`. Days and months are calendar-aligned in the guard's
    timezone. A scoped budget applies to calls whose metadata (or tags, as ``"key:value"`` or
    ``"key=value"``) carry its key; each value (each tenant) has its own limit.
    """

    limit: float
    period: Period
    scope: str | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int | float):
            raise ConfigError("Budget.limit", f"must be a number of dollars, got {type(self.limit).__name__}")
        if not math.isfinite(self.limit) or self.limit <= 0:
            raise ConfigError(
                "Budget.limit",
                f"must be a positive number of dollars, got {self.limit!r} (to forbid spending, "
                "do not route to the model; to lift a limit, remove the budget)",
            )
        if self.period not in _PERIODS:
            raise ConfigError("Budget.period", f"{self.period!r} is not one of {', '.join(_PERIODS)}")
        if self.scope is not None:
            if not isinstance(self.scope, str) or not self.scope.strip():
                raise ConfigError(
                    "Budget.scope", "must be a non-empty metadata key such as 'tenant' or 'user'"
                )
            if self.period not in _SCOPED_PERIODS:
                raise ConfigError(
                    "Budget.period",
                    f"a scoped budget takes period 'day', 'month' or 'total', not {self.period!r}",
                )
        if not isinstance(self.name, str):
            raise ConfigError("Budget.name", "must be a string")
        if not self.name:
            default = (
                f"{self.scope}/{self.period}"
                if self.scope
                else {
                    "request": "per_request",
                    "run": "per_run",
                    "day": "daily",
                    "month": "monthly",
                    "total": "total",
                }[self.period]
            )
            object.__setattr__(self, "name", default)
        if "\x1f" in self.name:
            raise ConfigError("Budget.name", "must not contain control characters")

    @classmethod
    def per_request(cls, limit: float, *, name: str = "") -> Budget:
        """All attempts of one logical request (router call / LangChain LLM run)."""
        return cls(limit, "request", None, name)

    @classmethod
    def per_run(cls, limit: float, *, name: str = "") -> Budget:
        """All LLM calls under one root LangChain run (e.g. one agent run); for router calls,
        the calls sharing ``metadata={"run_id": ...}`` (else one call)."""
        return cls(limit, "run", None, name)

    @classmethod
    def daily(cls, limit: float, *, name: str = "") -> Budget:
        return cls(limit, "day", None, name)

    @classmethod
    def monthly(cls, limit: float, *, name: str = "") -> Budget:
        return cls(limit, "month", None, name)

    @classmethod
    def total(cls, limit: float, *, name: str = "") -> Budget:
        """A lifetime limit (no window)."""
        return cls(limit, "total", None, name)

    @classmethod
    def scoped(cls, key: str, limit: float, *, period: str = "day", name: str = "") -> Budget:
        """Per value of metadata/tag ``key`` (``"tenant"``, ``"user"``, ``"feature"``)."""
        return cls(limit, period, key, name)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class BudgetAlert:
    """A budget crossed ``threshold`` (a fraction of its limit) in one window and scope."""

    budget: str
    scope: str | None
    window: str
    threshold: float
    spent: float
    limit: float
    at: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "scope": self.scope,
            "window": self.window,
            "threshold": self.threshold,
            "spent": self.spent,
            "limit": self.limit,
            "at": self.at,
        }


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


@dataclass(slots=True)
class _Call:
    """What the guard remembers of one recent request (for logs and metrics)."""

    estimate: float = 0.0
    cost: float = 0.0
    attempts: dict[int, float] = field(default_factory=dict)
    remaining: float | None = None
    remaining_budget: str | None = None


TokenCounter = Callable[[str, list[dict[str, Any]]], int]
PriceResolver = Callable[[str], Any]


class CostGuard:
    """Budgets, reserve-then-settle accounting and alerts; an :class:`AttemptGuard` for
    :class:`~llm_resilience_plugin.ResilientRouter` and the engine behind
    :class:`~llm_resilience_plugin.callbacks.CostGuardCallbackHandler`.

    Args:
        budgets: the :class:`Budget` list (names must be unique).
        ledger: ``"memory"`` (default), ``"sqlite:///spend.db"``, or a :class:`Ledger`.
        alert_at: fraction(s) of a day/month/total limit at which to alert once per window and
            scope (default 0.8; ``None`` or ``()`` for none).
        on_alert: called with each :class:`BudgetAlert` (also logged as ``budget_alert``).
        timezone: IANA name or ``tzinfo`` for calendar days/months (default UTC).
        now: clock returning epoch seconds or an aware ``datetime`` (tests inject a fake).
        prices: per-model overrides ``{"my-model": (input, output)}`` (dollars per token).
        unknown_model: ``"error"`` (default), ``"zero"`` or a fixed price ``(input, output)``.
        price_resolver: ``f(model_name) -> Price | (input, output) | list of them | None`` for
            names LiteLLM does not know (e.g. a model group), or a ``ResilientRouter``.
        router: a ``ResilientRouter`` whose groups the LangChain handler may see as model names;
            its deployments are priced now (unknown price -> ``ConfigError``).
        models: model names to validate now (configuration-time ``ConfigError``).
        default_max_tokens: output tokens assumed when a request sets no ``max_tokens`` (else
            the model's maximum output from the price map). It is an estimate, not enforced.
        prompt_margin: extra fraction on counted prompt tokens (default 0.1).
        token_counter: ``f(model, messages) -> int`` instead of LiteLLM's ``token_counter``.
        reservation_ttl: seconds after which an unsettled reservation is reaped (a crashed
            process must not hold budget forever).
        on_cancel: what a router attempt cancelled in flight (a hedge that lost the race, a
            stream closed early) costs when no usage is known: ``"estimate"`` (default - the
            request was sent and the provider may bill it) or ``"release"``.
    """

    def __init__(
        self,
        budgets: Sequence[Budget] = (),
        *,
        ledger: Ledger | str | None = None,
        alert_at: float | Sequence[float] | None = 0.8,
        on_alert: Callable[[BudgetAlert], Any] | None = None,
        timezone: str | tzinfo = "UTC",
        now: Callable[[], float | datetime] | None = None,
        prices: Mapping[str, PriceLike] | None = None,
        unknown_model: UnknownModelPolicy = "error",
        price_resolver: PriceResolver | ResilientRouter | None = None,
        router: ResilientRouter | None = None,
        models: Iterable[str] = (),
        default_max_tokens: int | None = None,
        prompt_margin: float = 0.1,
        token_counter: TokenCounter | None = None,
        reservation_ttl: float = 900.0,
        on_cancel: Literal["estimate", "release"] = "estimate",
    ) -> None:
        if isinstance(budgets, Budget) or not isinstance(budgets, Sequence):
            raise ConfigError("budgets", "expected a list of Budget objects, e.g. [Budget.daily(50)]")
        seen: set[str] = set()
        for b in budgets:
            if not isinstance(b, Budget):
                raise ConfigError("budgets", f"expected Budget objects (Budget.daily(50), ...), got {b!r}")
            if b.name in seen:
                raise ConfigError(
                    "budgets", f"two budgets are named {b.name!r}; pass name=... to tell them apart"
                )
            seen.add(b.name)
        self.budgets: tuple[Budget, ...] = tuple(budgets)
        self.alert_at = self._check_alert_at(alert_at)
        if on_alert is not None and not callable(on_alert):
            raise ConfigError("on_alert", "must be a callable taking a BudgetAlert")
        self.on_alert = on_alert
        self.tz = self._check_tz(timezone)
        if now is not None and not callable(now):
            raise ConfigError("now", "must be a callable returning epoch seconds or a datetime")
        self._now_fn = now or time.time
        if default_max_tokens is not None and (
            isinstance(default_max_tokens, bool)
            or not isinstance(default_max_tokens, int)
            or default_max_tokens <= 0
        ):
            raise ConfigError("default_max_tokens", "must be a positive integer number of tokens")
        self.default_max_tokens = default_max_tokens
        if not is_number(prompt_margin) or prompt_margin < 0:
            raise ConfigError("prompt_margin", "must be a non-negative fraction such as 0.1")
        self.prompt_margin = float(prompt_margin)
        if token_counter is not None and not callable(token_counter):
            raise ConfigError("token_counter", "must be a callable (model, messages) -> int")
        self._token_counter = token_counter
        if not is_number(reservation_ttl) or reservation_ttl <= 0:
            raise ConfigError("reservation_ttl", "must be a positive number of seconds")
        self.reservation_ttl = float(reservation_ttl)
        if on_cancel not in ("estimate", "release"):
            raise ConfigError("on_cancel", "expected 'estimate' (conservative, default) or 'release'")
        self.on_cancel = on_cancel
        self.prices = PriceBook(prices, unknown_model)
        self.ledger = open_ledger(ledger)
        self._router: ResilientRouter | None = None
        self._resolver: PriceResolver | None = None
        if price_resolver is not None:
            if hasattr(price_resolver, "deployments") and hasattr(price_resolver, "model_groups"):
                router = router or price_resolver  # type: ignore[assignment]
            elif callable(price_resolver):
                self._resolver = price_resolver
            else:
                raise ConfigError(
                    "price_resolver", "expected a callable model -> price, or a ResilientRouter"
                )
        if isinstance(models, str):
            models = [models]
        for m in models:
            self.prices.for_model(m)
        if router is not None:
            self.bind_router(router)
        self._lock = threading.Lock()
        self._calls: OrderedDict[str, _Call] = OrderedDict()
        self._alerted: OrderedDict[tuple[str, float], None] = OrderedDict()

    # -- configuration ---------------------------------------------------------------------------

    @staticmethod
    def _check_alert_at(alert_at: Any) -> tuple[float, ...]:
        if alert_at is None:
            return ()
        values = [alert_at] if not isinstance(alert_at, list | tuple) else list(alert_at)
        for v in values:
            if not is_number(v) or not 0 < v <= 1:
                raise ConfigError("alert_at", f"thresholds are fractions of a limit in (0, 1], got {v!r}")
        return tuple(sorted({float(v) for v in values}))

    @staticmethod
    def _check_tz(timezone: Any) -> tzinfo:
        if isinstance(timezone, tzinfo):
            return timezone
        if isinstance(timezone, str):
            try:
                return ZoneInfo(timezone)
            except (ZoneInfoNotFoundError, ValueError):
                raise ConfigError(
                    "timezone", f"unknown IANA timezone {timezone!r} (e.g. 'UTC', 'Europe/Paris')"
                ) from None
        raise ConfigError("timezone", "expected an IANA timezone name or a tzinfo")

    def bind_router(self, router: ResilientRouter) -> None:
        """Price every deployment of ``router`` now (``ConfigError`` for an unknown price under
        ``unknown_model="error"``) and let the LangChain handler map its group names to them."""
        for d in router.deployments():
            self.prices.for_deployment(d)
        self._router = router

    # -- time ------------------------------------------------------------------------------------

    def now(self) -> float:
        v = self._now_fn()
        if isinstance(v, datetime):
            if v.tzinfo is None:
                v = v.replace(tzinfo=self.tz)
            return v.timestamp()
        return float(v)

    def _windows(self, ts: float) -> tuple[str, str]:
        dt = datetime.fromtimestamp(ts, self.tz)
        return dt.date().isoformat(), f"{dt.year:04d}-{dt.month:02d}"

    def window_bounds(self, period: str, ts: float | None = None) -> tuple[float, float]:
        """Start and end (epoch seconds) of the ``"day"`` or ``"month"`` window holding ``ts``."""
        dt = datetime.fromtimestamp(self.now() if ts is None else ts, self.tz)
        if period == "day":
            start = dt.date()
            end = start + timedelta(days=1)
        elif period == "month":
            start = date(dt.year, dt.month, 1)
            end = date(dt.year + (dt.month == 12), dt.month % 12 + 1, 1)
        else:
            raise ConfigError("period", "window_bounds takes 'day' or 'month'")
        return (
            datetime.combine(start, datetime.min.time(), self.tz).timestamp(),
            datetime.combine(end, datetime.min.time(), self.tz).timestamp(),
        )

    # -- scopes and keys -------------------------------------------------------------------------

    @staticmethod
    def scope_value(key: str, metadata: Mapping[str, Any] | None, tags: Iterable[str] | None) -> str | None:
        v = (metadata or {}).get(key)
        if isinstance(v, str) and v:
            return v
        if isinstance(v, int | float) and not isinstance(v, bool):
            return str(v)
        for t in tags or ():
            if isinstance(t, str) and len(t) > len(key) + 1 and t.startswith(key) and (t[len(key)] in ":="):
                return t[len(key) + 1 :]
        return None

    def _keys(
        self,
        ts: float,
        metadata: Mapping[str, Any] | None,
        tags: Iterable[str] | None,
        request_id: str,
        run_id: str | None,
    ) -> tuple[list[BudgetKey], dict[str, str]]:
        day, month = self._windows(ts)
        keep = ts + max(86400.0, 2 * self.reservation_ttl)
        keys: list[BudgetKey] = []
        scopes: dict[str, str] = {}
        tags = list(tags or ())
        for b in self.budgets:
            if b.period == "request":
                keys.append(BudgetKey(b.name, f"request={request_id}", "request", b.limit, keep))
                continue
            if b.period == "run":
                keys.append(BudgetKey(b.name, f"run={run_id or request_id}", "run", b.limit, keep))
                continue
            window = {"day": day, "month": month, "total": "all"}[b.period]
            scope = ""
            if b.scope is not None:
                value = self.scope_value(b.scope, metadata, tags)
                if value is None:
                    continue  # the budget does not apply to calls without that key
                scopes[b.scope] = value
                scope = f"{b.scope}={value}"
            keys.append(BudgetKey(b.name, scope, window, b.limit))
        return keys, scopes

    # -- estimating ------------------------------------------------------------------------------

    def count_prompt_tokens(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]] | None = None,
        *,
        text: str | None = None,
        tools: Any = None,
    ) -> int:
        """Prompt tokens, offline: the injected counter, else LiteLLM's ``token_counter``
        (images at its default count - no download), else ``ceil(chars / 3)``."""
        msgs = [dict(m) for m in messages] if messages is not None else None
        if self._token_counter is not None and msgs is not None:
            return int(self._token_counter(model, msgs))
        import litellm

        try:
            if msgs is not None:
                return int(
                    litellm.token_counter(
                        model=model,
                        messages=msgs,
                        tools=tools or None,
                        use_default_image_token_count=True,
                    )
                )
            return int(litellm.token_counter(model=model, text=text or ""))
        except Exception:
            import json

            raw = json.dumps(msgs, default=str) if msgs is not None else (text or "")
            return math.ceil(len(raw) / 3) + 8

    def _output_tokens(self, max_tokens: Any, n: Any, price: Price, model: str | None) -> int:
        if is_number(max_tokens) and max_tokens > 0:
            out = int(max_tokens)
        elif self.default_max_tokens is not None:
            out = self.default_max_tokens
        elif price.max_output_tokens:
            out = price.max_output_tokens
        else:
            raise ConfigError(
                "max_tokens",
                f"cannot bound the output of {model or 'this model'!r}: set max_tokens on the "
                "request or CostGuard(default_max_tokens=...)",
            )
        copies = int(n) if is_number(n) and n >= 1 else 1
        return out * copies

    def estimate(
        self,
        candidates: Sequence[Candidate],
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        text: str | None = None,
        tools: Any = None,
        max_tokens: Any = None,
        n: Any = None,
        prompt_tokens: int | None = None,
    ) -> tuple[float, int, int, str]:
        """Worst-case cost over ``candidates`` = ``(key, model, price)``; returns
        ``(dollars, prompt_tokens, output_tokens, key of the worst candidate)``."""
        counted: dict[str, int] = {}
        worst: tuple[float, int, int, str] | None = None
        for key, model, price in candidates:
            if prompt_tokens is not None:
                pt = prompt_tokens
            else:
                if model not in counted:
                    counted[model] = self.count_prompt_tokens(model, messages, text=text, tools=tools)
                pt = math.ceil(counted[model] * (1 + self.prompt_margin))
            out = self._output_tokens(max_tokens, n, price, model)
            cost = price.cost(pt, out)
            if worst is None or cost > worst[0]:
                worst = (cost, pt, out, key)
        if worst is None:
            raise ConfigError("model", "no deployment or model to price")
        return worst

    # -- reserve / settle / release ----------------------------------------------------------

    def reserve(
        self,
        candidates: Sequence[Candidate],
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        text: str | None = None,
        tools: Any = None,
        max_tokens: Any = None,
        n: Any = None,
        prompt_tokens: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        tags: Iterable[str] | None = None,
        request_id: str | None = None,
        run_id: str | None = None,
        model_group: str | None = None,
    ) -> Ticket:
        """Reserve the worst-case estimate against every applicable budget, or raise
        :class:`BudgetExceededError` (nothing reserved). ``candidates`` are
        ``(deployment id or model, model, Price)`` - see :meth:`candidates_for_model`."""
        amount, pt, out, worst = self.estimate(
            candidates,
            messages=messages,
            text=text,
            tools=tools,
            max_tokens=max_tokens,
            n=n,
            prompt_tokens=prompt_tokens,
        )
        ts = self.now()
        rid = request_id or uuid.uuid4().hex
        keys, scopes = self._keys(ts, metadata, tags, rid, run_id)
        prices = {k: p for k, _m, p in candidates}
        fallback = prices[worst]
        worst_model = next(m for k, m, _p in candidates if k == worst)
        try:
            reservation = self.ledger.reserve(keys, amount, now=ts, ttl=self.reservation_ttl)
        except BudgetExceededError as err:
            logger.info(
                "budget_refused",
                extra={
                    "llm_event_name": "budget_refused",
                    "llm_event": {
                        "budget": err.budget,
                        "spent": err.spent,
                        "reservation": err.reservation,
                        "limit": err.limit,
                        "request_id": rid,
                        "model": worst_model,
                        "model_group": model_group,
                        **{f"scope_{k}": v for k, v in scopes.items()},
                    },
                },
            )
            raise
        day, month = self._windows(ts)
        ticket = Ticket(
            reservation=reservation,
            request_id=rid,
            estimate=reservation.amount,
            prompt_tokens=pt,
            max_tokens=out,
            prices=prices,
            fallback_price=fallback,
            model=worst_model,
            model_group=model_group,
            scopes=scopes,
            started_at=ts,
            day=day,
            month=month,
        )
        with self._lock:
            call = self._call(rid)
            call.estimate += reservation.amount
        return ticket

    def settle(
        self,
        ticket: Ticket,
        *,
        cost: float | None = None,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        deployment_id: str | None = None,
        model: str | None = None,
        attempt: int | None = None,
    ) -> float:
        """Settle to ``cost`` if given (the provider's figure), else usage x the serving
        deployment's price, else the estimate (nothing known: conservative). Returns the cost."""
        with self._lock:
            if ticket.done:
                return ticket.cost or 0.0
            ticket.done = True
        price = ticket.prices.get(deployment_id or "") or ticket.fallback_price
        estimated = False
        pt = int(prompt_tokens or 0)
        ct = int(completion_tokens or 0)
        has_usage = prompt_tokens is not None or completion_tokens is not None
        computed = price.cost(pt, ct) if has_usage else None
        free = price.input_cost_per_token == 0 and price.output_cost_per_token == 0
        # A reported 0 is believed only when our own figure agrees (LiteLLM reports 0 for a
        # model it cannot price - e.g. under a fixed unknown_model price).
        if (
            cost is not None
            and is_number(cost)
            and cost >= 0
            and (cost > 0 or computed == 0 or (computed is None and free))
        ):
            actual = float(cost)
        elif computed is not None:
            actual = computed
        else:
            actual = ticket.estimate
            estimated = True
        ticket.cost = actual
        entry = SpendEntry(
            ts=ticket.started_at,
            day=ticket.day,
            month=ticket.month,
            cost=actual,
            model=model or price.model or ticket.model,
            model_group=ticket.model_group,
            deployment_id=deployment_id,
            scopes=ticket.scopes,
            prompt_tokens=pt,
            completion_tokens=ct,
            request_id=ticket.request_id,
            estimated=estimated,
        )
        usages = self.ledger.settle(ticket.reservation, actual, entry)
        self._after_settle(ticket, usages, actual, attempt)
        return actual

    def release(self, ticket: Ticket) -> None:
        """The attempt cost nothing (it failed before generating): drop the reservation."""
        with self._lock:
            if ticket.done:
                return
            ticket.done = True
        self.ledger.release(ticket.reservation)

    def _after_settle(
        self, ticket: Ticket, usages: list[KeyUsage], actual: float, attempt: int | None
    ) -> None:
        tightest: KeyUsage | None = None
        for u in usages:
            if tightest is None or u.remaining < tightest.remaining:
                tightest = u
        with self._lock:
            call = self._call(ticket.request_id)
            call.cost += actual
            if attempt is not None:
                call.attempts[attempt] = actual
            if tightest is not None:
                call.remaining = tightest.remaining
                call.remaining_budget = tightest.label
        if not self.alert_at:
            return
        keys = {k.id: k for k in ticket.reservation.keys}
        for u in usages:
            key = keys.get(BudgetKey(u.budget, u.scope, u.window, u.limit).id)
            if key is None or u.limit <= 0 or key.window in ("request", "run"):
                continue  # alerts are for calendar/total windows, not for each request or run
            for threshold in self.alert_at:
                if u.spent < threshold * u.limit - 1e-12:
                    break
                marker = (key.id, threshold)
                with self._lock:
                    if marker in self._alerted:
                        continue
                    self._alerted[marker] = None
                    while len(self._alerted) > 10_000:
                        self._alerted.popitem(last=False)
                if self.ledger.mark_alert(key, threshold):  # once across processes too
                    self._fire(
                        BudgetAlert(
                            budget=u.budget,
                            scope=u.scope or None,
                            window=u.window,
                            threshold=threshold,
                            spent=u.spent,
                            limit=u.limit,
                            at=self.now(),
                        )
                    )

    def _fire(self, alert: BudgetAlert) -> None:
        logger.warning(
            "budget_alert",
            extra={"llm_event_name": "budget_alert", "llm_event": alert.to_dict()},
        )
        if self.on_alert is not None:
            try:
                self.on_alert(alert)
            except Exception:
                logger.exception("on_alert callback failed")

    def _call(self, rid: str) -> _Call:
        call = self._calls.get(rid)
        if call is None:
            call = self._calls[rid] = _Call()
            while len(self._calls) > 10_000:
                self._calls.popitem(last=False)
        else:
            self._calls.move_to_end(rid)
        return call

    def call_info(self, request_id: str) -> dict[str, Any] | None:
        """Cost, estimate and tightest remaining budget of a recent request (router call id or
        LangChain run id), for logs and metrics."""
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

    # -- candidates (what may serve a call, with its price) ------------------------------------

    def candidates_for_deployments(self, deployments: Iterable[DeploymentInfo]) -> list[Candidate]:
        out = []
        for d in deployments:
            params = d.params or {}
            model = str(params.get("base_model") or d.model)
            out.append((d.id, model, self.prices.for_deployment(d)))
        return out

    def candidates_for_model(self, model: str, *, provider: str | None = None) -> list[Candidate]:
        """What a model name (as a LangChain model reports it) costs: the ``price_resolver``,
        then a bound router's group of that name, then the price book."""
        if self._resolver is not None:
            got = self._resolver(model)
            if got is not None:
                items = got if isinstance(got, list) else [got]
                out = []
                for i, item in enumerate(items):
                    if hasattr(item, "params") and hasattr(item, "model_group"):
                        out.extend(self.candidates_for_deployments([item]))
                    else:
                        p = coerce_price(item, "price_resolver", source="resolver", model=model)
                        out.append((model if len(items) == 1 else f"{model}#{i}", model, p))
                if out:
                    return out
        router = self._router
        if router is not None and model in router.model_groups:
            return self.candidates_for_deployments(router.deployments(model))
        return [(model, model, self.prices.for_model(model, provider=provider))]

    # -- the router's AttemptGuard protocol ----------------------------------------------------

    def before_attempt(self, info: AttemptInfo) -> Ticket:
        kwargs = info.kwargs
        md = info.metadata
        tags = md.get("tags")
        max_tokens = kwargs.get("max_tokens")
        if max_tokens is None:
            max_tokens = kwargs.get("max_completion_tokens")
        run_id = md.get("run_id") or md.get("root_run_id")
        return self.reserve(
            self.candidates_for_deployments(info.deployments),
            messages=info.messages,
            tools=kwargs.get("tools"),
            max_tokens=max_tokens,
            n=kwargs.get("n"),
            metadata=md,
            tags=tags if isinstance(tags, list | tuple) else None,
            request_id=info.call_id,
            run_id=str(run_id) if run_id else None,
            model_group=info.model_group,
        )

    def after_attempt(
        self,
        token: Any,
        *,
        deployment_id: str | None,
        response: Any | None,
        usage: Mapping[str, int] | None,
        failure: Failure | None,
    ) -> None:
        if not isinstance(token, Ticket):
            return
        if failure is not None:
            self.release(token)
            return
        if response is None and not usage and self.on_cancel == "release":
            self.release(token)  # cancelled in flight, and told to trust that it cost nothing
            return
        hidden = hidden_params_of(response) or {}
        reported = hidden.get("response_cost")
        pt = ct = None
        if usage:
            pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
        elif response is not None and getattr(response, "usage", None) is not None:
            pt = getattr(response.usage, "prompt_tokens", None)
            ct = getattr(response.usage, "completion_tokens", None)
        self.settle(
            token,
            cost=reported if is_number(reported) else None,
            prompt_tokens=pt,
            completion_tokens=ct,
            deployment_id=deployment_id,
            model=getattr(response, "model", None) if response is not None else None,
        )

    # -- queries ---------------------------------------------------------------------------------

    def usage(
        self,
        metadata: Mapping[str, Any] | None = None,
        tags: Iterable[str] | None = None,
        *,
        request_id: str | None = None,
        run_id: str | None = None,
    ) -> list[KeyUsage]:
        """Current-window usage of every budget that would apply to a call with this
        metadata/tags (per-request and per-run budgets only when their id is given)."""
        keys, _ = self._keys(self.now(), metadata, tags, request_id or "", run_id)
        keys = [
            k
            for k in keys
            if (k.window != "request" or request_id is not None) and (k.window != "run" or run_id is not None)
        ]
        return self.ledger.usage(keys)

    def remaining(
        self, metadata: Mapping[str, Any] | None = None, tags: Iterable[str] | None = None
    ) -> float | None:
        """Dollars left in the tightest applicable budget now (None: no budget applies)."""
        us = self.usage(metadata, tags)
        return min((u.remaining for u in us), default=None)

    def headroom(self, metadata: Mapping[str, Any] | None = None) -> float | None:
        """Fraction (0..1) left of the tightest day/month/total budget that applies to a call
        with this metadata (tags under ``metadata["tags"]``); None when none applies. The
        router sheds low-priority tiers when it falls below their ``shed_below``."""
        md = metadata or {}
        tags = md.get("tags")
        us = self.usage(md, tags if isinstance(tags, list | tuple) else None)
        fractions = [u.remaining / u.limit for u in us if u.limit > 0]
        return min(fractions) if fractions else None

    def report(self, since: float | None = None, until: float | None = None) -> SpendReport:
        """Settled spend by day, month, model, group, deployment and scope, plus every budget's
        current window (scoped budgets: one row per scope value seen this window)."""
        rep = self.ledger.report(since, until)
        ts = self.now()
        day, month = self._windows(ts)
        rows: list[KeyUsage] = []
        for b in self.budgets:
            if b.period in ("request", "run"):
                continue
            window = {"day": day, "month": month, "total": "all"}[b.period]
            if b.scope is None:
                rows.extend(self.ledger.usage([BudgetKey(b.name, "", window, b.limit)]))
            else:
                rows.extend(self.ledger.list_usage(budget=b.name, window=window))
        rep.budgets = rows
        return rep

    def close(self) -> None:
        self.ledger.close()

    def __repr__(self) -> str:
        names = ", ".join(f"{b.name}=${b.limit:g}" for b in self.budgets)
        return f"CostGuard([{names}], ledger={self.ledger!r})"


__all__ = [
    "Budget",
    "BudgetAlert",
    "BudgetExceededError",
    "CostGuard",
    "Price",
    "PriceBook",
    "Ticket",
    "coerce_price",
]
