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
``response_cost`` when there is one, else usage x the serving deployment's prices, else the
estimate when the attempt may have been billed without an answer), or released when the
attempt cannot have cost anything (docs/spend-semantics.md). A provider that bills more output
than the request's ``max_tokens`` is recorded as billed and raises a ``budget_overrun`` alert.

Prices (``_prices.py``), budgets and their windows (``_budgets.py``), the estimate
(``_estimate.py``), alerts (``_alerts.py``), tickets (``_tickets.py``) and the router's hooks
(``_hooks.py``) live in their own modules; this one holds the reserve/settle orchestration that
ties them to a ledger.
"""

from __future__ import annotations

import inspect
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING, Any, Literal

from llm_resilience_plugin.cost._alerts import BudgetAlert, BudgetAlerts, Overrun
from llm_resilience_plugin.cost._budgets import (
    Budget,
    BudgetCalendar,
    BudgetSet,
    check_budgets,
    scope_value,
)
from llm_resilience_plugin.cost._estimate import CostEstimator, PriceResolver, TokenCounter
from llm_resilience_plugin.cost._hooks import RouterHooks, check_reservation_ttl
from llm_resilience_plugin.cost._ledger import (
    KeyUsage,
    Ledger,
    SpendEntry,
    SpendReport,
)
from llm_resilience_plugin.cost._open import open_ledger
from llm_resilience_plugin.cost._prices import (
    Candidate,
    Price,
    PriceBook,
    PriceLike,
    UnknownModelPolicy,
    coerce_price,
    is_number,
    settled_cost,
)
from llm_resilience_plugin.cost._tickets import RecentCalls, Ticket
from llm_resilience_plugin.errors import BudgetExceededError, ConfigError

if TYPE_CHECKING:
    from llm_resilience_plugin.events import DeploymentInfo
    from llm_resilience_plugin.routing._router import ResilientRouter

logger = logging.getLogger("llm_resilience.cost")


def _takes_entry(ledger: Ledger) -> bool:
    """Does ``ledger.reserve`` take the ``entry`` to log if the reservation is reaped? (A
    ledger written before it did still works; its reaped reservations log a bare entry.)"""
    try:
        params = inspect.signature(ledger.reserve).parameters
    except (TypeError, ValueError):
        return False
    return "entry" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _positive_int(value: Any) -> int | None:
    """``value`` as a positive int (a request's ``max_tokens`` or ``n``), else None."""
    return int(value) if is_number(value) and value >= 1 else None


def _log_refusal(
    err: BudgetExceededError, request_id: str, model: str, model_group: str | None, scopes: dict[str, str]
) -> None:
    """Log a refused reservation as ``budget_refused`` (which budget, how far over, for whom)."""
    logger.info(
        "budget_refused",
        extra={
            "llm_event_name": "budget_refused",
            "llm_event": {
                "budget": err.budget,
                "spent": err.spent,
                "reservation": err.reservation,
                "limit": err.limit,
                "request_id": request_id,
                "model": model,
                "model_group": model_group,
                **{f"scope_{k}": v for k, v in scopes.items()},
            },
        },
    )


class CostGuard(RouterHooks):
    """Reserve-then-settle accounting against budgets, with alerts; an :class:`AttemptGuard` for
    :class:`~llm_resilience_plugin.ResilientRouter` and the engine behind
    :class:`~llm_resilience_plugin.langchain.CostGuardCallbackHandler`.

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
        reservation_ttl: seconds after which an unsettled reservation is reaped - settled at its
            estimate (a crashed process must not hold budget forever, nor lose its spend). A
            router refuses one shorter than its longest deadline.
        on_cancel: what a router attempt cancelled in flight (a hedge that lost the race, a
            stream closed before any content reached the caller) costs when no usage is known:
            ``"estimate"`` (default - the request was sent and the provider may bill it) or
            ``"release"``. Timeouts, dropped connections and streams cut or closed after
            content always settle the usage known, else the estimate.
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
        checked = check_budgets(budgets)
        self.alerts = BudgetAlerts(alert_at, on_alert)
        self.calendar = BudgetCalendar(timezone, now)
        self.estimator = CostEstimator(
            prices=prices,
            unknown_model=unknown_model,
            default_max_tokens=default_max_tokens,
            prompt_margin=prompt_margin,
            token_counter=token_counter,
        )
        self.budget_set = BudgetSet(checked, self.calendar, reservation_ttl)
        if on_cancel not in ("estimate", "release"):
            raise ConfigError("on_cancel", "expected 'estimate' (conservative, default) or 'release'")
        self.on_cancel = on_cancel
        self.ledger = open_ledger(ledger)
        self._ledger_takes_entry = _takes_entry(self.ledger)
        if router is not None:
            check_reservation_ttl(self.budget_set.reservation_ttl, router)
        self.estimator.set_sources(price_resolver=price_resolver, router=router, models=models)
        self._lock = threading.Lock()  # a ticket is settled or released once
        self._recent = RecentCalls()

    # -- configuration (held by the collaborators) -------------------------------------------------

    @property
    def budgets(self) -> tuple[Budget, ...]:
        """The budgets, in the order given."""
        return self.budget_set.budgets

    @property
    def reservation_ttl(self) -> float:
        """Seconds after which an unsettled reservation is reaped."""
        return self.budget_set.reservation_ttl

    @property
    def prices(self) -> PriceBook:
        """The price book every deployment and model is priced from."""
        return self.estimator.prices

    @property
    def alert_at(self) -> tuple[float, ...]:
        """Alert thresholds, as sorted fractions of a limit."""
        return self.alerts.thresholds

    @property
    def on_alert(self) -> Callable[[BudgetAlert], Any] | None:
        """The callback each :class:`BudgetAlert` is passed to."""
        return self.alerts.on_alert

    @property
    def tz(self) -> tzinfo:
        """The timezone calendar days and months are cut in."""
        return self.calendar.tz

    @property
    def default_max_tokens(self) -> int | None:
        """Output tokens assumed when a request sets no ``max_tokens``."""
        return self.estimator.default_max_tokens

    @property
    def prompt_margin(self) -> float:
        """Extra fraction added to counted prompt tokens."""
        return self.estimator.prompt_margin

    # -- time and scopes ---------------------------------------------------------------------------

    def now(self) -> float:
        """Epoch seconds from the guard's clock."""
        return self.calendar.now()

    def _windows(self, ts: float) -> tuple[str, str]:
        """The day and month window names holding ``ts``."""
        return self.calendar.windows(ts)

    def window_bounds(self, period: str, ts: float | None = None) -> tuple[float, float]:
        """Start and end (epoch seconds) of the ``"day"`` or ``"month"`` window holding ``ts``."""
        return self.calendar.window_bounds(period, ts)

    @staticmethod
    def scope_value(key: str, metadata: Mapping[str, Any] | None, tags: Iterable[str] | None) -> str | None:
        """The value of scope ``key`` carried by a call's metadata or tags, if any."""
        return scope_value(key, metadata, tags)

    # -- estimating (see CostEstimator) ------------------------------------------------------------

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
        return self.estimator.count_prompt_tokens(model, messages, text=text, tools=tools)

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
        return self.estimator.estimate(
            candidates,
            messages=messages,
            text=text,
            tools=tools,
            max_tokens=max_tokens,
            n=n,
            prompt_tokens=prompt_tokens,
        )

    def candidates_for_deployments(self, deployments: Iterable[DeploymentInfo]) -> list[Candidate]:
        """Each deployment as ``(id, model, its price)``."""
        return self.estimator.candidates_for_deployments(deployments)

    def candidates_for_model(self, model: str, *, provider: str | None = None) -> list[Candidate]:
        """What a model name (as a LangChain model reports it) costs: the ``price_resolver``,
        then a bound router's group of that name, then the price book."""
        return self.estimator.candidates_for_model(model, provider=provider)

    # -- reserve / settle / release ----------------------------------------------------------------

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
        keys, scopes = self.budget_set.keys(ts, metadata, tags, rid, run_id)
        prices = {k: p for k, _m, p in candidates}
        fallback = prices[worst]
        worst_model = next(m for k, m, _p in candidates if k == worst)
        day, month = self._windows(ts)
        extra: dict[str, Any] = {}
        if self._ledger_takes_entry:  # what the spend log says if this reservation is reaped
            extra["entry"] = SpendEntry(
                ts=ts, day=day, month=month, cost=amount, model=worst_model, model_group=model_group,
                scopes=scopes, prompt_tokens=pt, request_id=rid, estimated=True, reaped=True,
            )  # fmt: skip
        try:
            reservation = self.ledger.reserve(keys, amount, now=ts, ttl=self.reservation_ttl, **extra)
        except BudgetExceededError as err:
            _log_refusal(err, rid, worst_model, model_group, scopes)
            raise
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
            requested_max_tokens=_positive_int(max_tokens),
            copies=_positive_int(n) or 1,
        )
        self._recent.reserved(rid, reservation.amount)
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
        deployment's price, else the estimate (nothing known: conservative). Returns the cost.
        More completion tokens than the request's ``max_tokens`` raises a ``budget_overrun``
        alert (the spend is recorded as billed)."""
        with self._lock:
            if ticket.done:
                return ticket.cost or 0.0
            ticket.done = True
        price = ticket.prices.get(deployment_id or "") or ticket.fallback_price
        actual, estimated = settled_cost(
            price,
            reported=cost,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            estimate=ticket.estimate,
        )
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
            prompt_tokens=int(prompt_tokens or 0),
            completion_tokens=int(completion_tokens or 0),
            request_id=ticket.request_id,
            estimated=estimated,
        )
        usages = self.ledger.settle(ticket.reservation, actual, entry)
        self._recent.settled(ticket.request_id, actual, attempt, usages)
        limit = ticket.requested_max_tokens
        if (
            limit is not None
            and completion_tokens is not None
            and entry.completion_tokens > limit * ticket.copies
        ):
            over = Overrun(
                deployment_id, entry.model, ticket.request_id, limit * ticket.copies,
                entry.completion_tokens, actual, ticket.estimate,
            )  # fmt: skip
            self.alerts.overrun(over, usages, self.now())
        self.alerts.check(ticket.reservation.keys, usages, ledger=self.ledger, now=self.now)
        return actual

    def release(self, ticket: Ticket) -> None:
        """The attempt cost nothing (it failed before generating): drop the reservation."""
        with self._lock:
            if ticket.done:
                return
            ticket.done = True
        self.ledger.release(ticket.reservation)

    def call_info(self, request_id: str) -> dict[str, Any] | None:
        """Cost, estimate and tightest remaining budget of a recent request (router call id or
        LangChain run id), for logs and metrics."""
        return self._recent.info(request_id)

    # -- queries -----------------------------------------------------------------------------------

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
        return self.budget_set.usage(self.ledger, metadata, tags, request_id, run_id)

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
        rep.budgets = self.budget_set.window_usage(self.ledger)
        return rep

    def close(self) -> None:
        """Close the ledger."""
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
