"""The plugin's exceptions, the error classes (:class:`ErrorClass`) and :class:`Failure`.

Every exception LiteLLM, openai, httpx and aiohttp raise is mapped to a class once, in the
engine's taxonomy; the router acts on the class, never on exception types, so a new provider quirk
is fixed in one place. The class -> action table lives in :mod:`llm_resilience_plugin.policy`
(``classes``) and in docs/policy.md ("Error classes and actions").
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llm_resilience_plugin.events import AttemptRecord, CallReport


class ErrorClass(enum.StrEnum):
    """What kind of failure an attempt met; the router's action depends only on this."""

    RATE_LIMIT = "rate_limit"
    SERVER = "server"
    TIMEOUT = "timeout"
    CONNECTION = "connection"
    CONTEXT_WINDOW = "context_window"
    CONTENT_POLICY = "content_policy"
    AUTH = "auth"
    BAD_REQUEST = "bad_request"
    BUDGET = "budget"
    CIRCUIT_OPEN = "circuit_open"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value


# Classes that say the caller's request is at fault, not the deployment: they never count
# against a deployment's breaker.
CALLER_ERRORS = frozenset(
    {
        ErrorClass.BAD_REQUEST,
        ErrorClass.CONTEXT_WINDOW,
        ErrorClass.CONTENT_POLICY,
        ErrorClass.BUDGET,
        ErrorClass.UNKNOWN,
    }
)


class ResilienceError(Exception):
    """Base class of every error this package raises itself."""


class ConfigError(ResilienceError, ValueError):
    """Invalid configuration or arguments, raised before any request is sent."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class UnknownModelGroupError(ConfigError):
    """The requested model group is not in the router's model_list."""

    def __init__(self, group: str, known: Sequence[str]) -> None:
        self.group = group
        self.known = list(known)
        super().__init__(
            "model",
            f"unknown model group {group!r}; known groups: {', '.join(sorted(known)) or '(none)'}",
        )


class CircuitOpenError(ResilienceError):
    """Every deployment that could serve the request has an open circuit breaker."""

    def __init__(self, group: str, deployments: Sequence[str]) -> None:
        self.group = group
        self.deployments = list(deployments)
        super().__init__(
            f"model group {group!r}: no deployment admitted (open breakers: {', '.join(deployments)})"
        )


class LoadShedError(ResilienceError):
    """The call's priority tier is shed while the retry or cost budget runs low (nothing sent)."""

    def __init__(self, tier: str, budget: str, fraction: float, threshold: float) -> None:
        self.tier = tier
        self.budget = budget
        self.fraction = fraction
        self.threshold = threshold
        super().__init__(
            f"priority tier {tier!r} shed: {budget} at {fraction:.0%} of capacity, "
            f"below the tier's shed_below {threshold:.0%}; retry later or raise the call's priority"
        )


class BudgetExceededError(ResilienceError):
    """A reservation did not fit a budget; raised before any request is sent.

    A ledger's refusal also says which budget key refused (``budget_name``, ``scope``,
    ``window``) and splits ``spent`` into ``settled`` and ``in_flight`` (reservations); each is
    ``None`` when the error was raised without them."""

    budget_name: str | None
    scope: str | None
    window: str | None
    settled: float | None
    in_flight: float | None

    def __init__(
        self,
        budget: str,
        spent: float,
        reservation: float,
        limit: float,
        *,
        budget_name: str | None = None,
        scope: str | None = None,
        window: str | None = None,
        settled: float | None = None,
        in_flight: float | None = None,
    ) -> None:
        self.budget = budget
        self.spent = spent
        self.reservation = reservation
        self.limit = limit
        self.budget_name = budget_name
        self.scope = scope
        self.window = window
        self.settled = settled
        self.in_flight = in_flight
        super().__init__(
            f"budget {budget!r} exceeded: spent ${spent:.6f} + reservation ${reservation:.6f}"
            f" > limit ${limit:.6f}"
        )


class AllRoutesFailedError(ResilienceError):
    """Every route (deployments, retries, fallback groups) failed.

    ``attempts`` lists each attempt; ``__cause__`` is the first root cause; ``report`` is the
    whole call report.
    """

    def __init__(self, message: str, attempts: Sequence[AttemptRecord], report: CallReport) -> None:
        self.attempts = list(attempts)
        self.report = report
        lines = [message]
        for a in self.attempts:
            lines.append(
                f"  - [{a.fallback_level}] {a.model_group}/{a.deployment_id or '-'}: "
                f"{a.error_class} {a.status or ''} {a.error_message or ''}".rstrip()
            )
        super().__init__("\n".join(lines))


class DeadlineExceededError(AllRoutesFailedError, TimeoutError):
    """The call's deadline expired before any route answered."""


class RateLimitWaitError(AllRoutesFailedError):
    """Every route was rate-limited and the wait for a slot did not fit the call's deadline:
    ``wait_s`` is how long the shortest queue would have made it wait (nothing more was sent)."""

    wait_s: float

    def __init__(
        self, message: str, attempts: Sequence[AttemptRecord], report: CallReport, wait_s: float
    ) -> None:
        self.wait_s = wait_s
        super().__init__(
            f"{message}; the shortest rate-limit queue would have waited {wait_s:.2f} s", attempts, report
        )


class PacedOut(Exception):
    """An attempt not sent: the deployment's rate-limit queue would not admit it in time."""

    def __init__(self, group: str, wait_s: float, why: str) -> None:
        super().__init__(f"rate-limited: {why} (a slot in {wait_s:.2f} s): nothing sent")
        self.group = group
        self.wait_s = wait_s


_AS_PROVIDER_ERROR: dict[tuple[type, type], type] = {}


def as_provider_error(err: AllRoutesFailedError, root: BaseException) -> AllRoutesFailedError:
    """``err``, also an instance of ``root``'s LiteLLM/openai exception class (with its
    ``status_code``, ``message``, ``llm_provider`` ...), so a caller written for a plain
    ``litellm.Router`` (``except litellm.RateLimitError``) catches it; other roots leave it as is."""
    root_cls = type(root)
    if not root_cls.__module__.startswith(("litellm.", "openai.")) or isinstance(err, root_cls):
        return err
    key = (type(err), root_cls)
    combined = _AS_PROVIDER_ERROR.get(key)
    if combined is None:
        try:
            combined = type(
                type(err).__name__,
                (type(err), root_cls),
                # str() is the attempt list (the provider's __str__ would print only its message)
                {"__str__": BaseException.__str__, "__module__": __name__},
            )
        except TypeError:  # an incompatible layout: keep the plugin's error alone
            return err
        _AS_PROVIDER_ERROR[key] = combined
    try:
        err.__class__ = combined
    except TypeError:
        return err
    for name, value in vars(root).items():
        if name not in ("attempts", "report") and not name.startswith("__"):
            err.__dict__.setdefault(name, value)
    return err


class StreamInterruptedError(ResilienceError):
    """A stream failed after content reached the caller; carries the partial text and the cause."""

    def __init__(
        self, message: str, partial_text: str, cause: BaseException, report: CallReport | None
    ) -> None:
        self.partial_text = partial_text
        self.cause = cause
        self.report = report
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class Failure:
    """One classified failure."""

    error_class: ErrorClass
    status: int | None
    message: str
    retry_after: float | None
    exception: BaseException

    @property
    def counts_against_deployment(self) -> bool:
        """Whether this failure is evidence that the deployment is unhealthy."""
        return self.error_class not in CALLER_ERRORS and self.error_class is not (ErrorClass.CIRCUIT_OPEN)


# The public names; CALLER_ERRORS and as_provider_error serve the package itself.
__all__ = [
    "AllRoutesFailedError",
    "BudgetExceededError",
    "CircuitOpenError",
    "ConfigError",
    "DeadlineExceededError",
    "ErrorClass",
    "Failure",
    "LoadShedError",
    "RateLimitWaitError",
    "ResilienceError",
    "StreamInterruptedError",
    "UnknownModelGroupError",
]
