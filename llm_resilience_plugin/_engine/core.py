"""The decision core: what a call does next, given its state and the outcome of an attempt.

No I/O here. The drivers (:mod:`._engine.drivers`) send attempts and sleep; these functions decide:
which options a call carries, which group to fail over to, whether a context overflow is trimmed,
and which error the caller finally sees.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import tenacity

from llm_resilience_plugin._engine.clock import Deadline
from llm_resilience_plugin.errors import (
    AllRoutesFailedError,
    ConfigError,
    DeadlineExceededError,
    ErrorClass,
    Failure,
    PacedOut,
    RateLimitWaitError,
    as_provider_error,
)
from llm_resilience_plugin.events import CallReport, Listener, attach_report
from llm_resilience_plugin.policy import EffectivePolicy, ResiliencePolicy, TierPolicy

BeforeRetry = Callable[[tenacity.RetryCallState], Awaitable[None] | None]

# Plugin options a caller may pass with LiteLLM's kwargs; taken out before LiteLLM sees the call.
OPTION_KEYS = frozenset(
    {
        "attempt_timeout",
        "first_chunk_timeout",
        "stream_idle_timeout",
        "idempotency_key",
        "idempotent",
        "priority",
        "scenario",
        "recover_streams",
        "recovered_by_caller",
        "avoid_deployments",
        "deadline_cap",
    }
)

# Failure classes raised to the caller as themselves: the provider's own error says it best.
RAISED_AS_THEMSELVES = (
    ErrorClass.BAD_REQUEST,
    ErrorClass.CONTEXT_WINDOW,
    ErrorClass.CONTENT_POLICY,
    ErrorClass.BUDGET,
    ErrorClass.UNKNOWN,
)


class DeadlineSkip(TimeoutError):
    """No time was left in the call's deadline for another attempt (nothing was sent)."""


@dataclass(frozen=True, slots=True)
class CallOptions:
    """Per-call overrides, taken out of the LiteLLM kwargs before anything is sent."""

    key: str | None = None
    idempotent: bool = True
    attempt_timeout: float | None = None
    first_chunk_timeout: float | None = None
    stream_idle_timeout: float | None = None
    priority: str | None = None
    scenario: str | None = None
    # True/False, or "answer" (recover by asking again without streaming); None: the policy decides
    recover_streams: bool | Literal["answer"] | None = None
    recovered_by_caller: bool = False  # the caller recovers a stream broken after content itself
    avoid: frozenset[str] = frozenset()  # deployment ids this call never sends to
    deadline_cap: float | None = None  # seconds an enclosing run has left: the call never outlives it


NO_OPTIONS = CallOptions()


def positive_seconds(name: str, value: Any) -> float | None:
    """``value`` as a positive float of seconds (None stays None); a ConfigError naming ``name``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 or math.isinf(value):
        raise ConfigError(name, f"must be a positive, finite number of seconds, got {value!r}")
    return float(value)


# LiteLLM's numeric request arguments and what each accepts.
_NUMBERS: dict[str, tuple[type, float | None, float | None]] = {
    "max_tokens": (int, 1, None),
    "max_completion_tokens": (int, 1, None),
    "n": (int, 1, 128),
    "temperature": (float, 0, 2),
    "top_p": (float, 0, 1),
    "presence_penalty": (float, -2, 2),
    "frequency_penalty": (float, -2, 2),
    "seed": (int, None, None),
    "top_logprobs": (int, 0, 20),
}


def _check_text(field_name: str, value: Any) -> None:
    if isinstance(value, bytes | bytearray):
        raise ConfigError(field_name, "is bytes; pass text (str), e.g. value.decode('utf-8')")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ConfigError(
                field_name,
                f"is not valid UTF-8 text (a lone surrogate at position {e.start}); clean the string",
            ) from None


def validate_request(messages: Any, kwargs: Mapping[str, Any]) -> None:
    """Refuse a request LiteLLM could not send, before any attempt: each message must be a
    mapping with a string ``role`` and text (or content parts) that encodes as UTF-8; LiteLLM's
    numeric arguments must be finite numbers in range. The error names the field and the fix."""
    if not isinstance(messages, list) or not messages:
        raise ConfigError("messages", "expected a non-empty list of chat messages")
    for i, m in enumerate(messages):
        # Fast path: a plain dict with a role string and text that encodes needs nothing more
        # checked (ASCII without encoding it; a lone surrogate goes on to the checks below).
        if type(m) is dict:
            role, content = m.get("role"), m.get("content")
            if type(role) is str and role and type(content) is str:
                if content.isascii():
                    continue
                try:
                    content.encode("utf-8")
                    continue
                except UnicodeEncodeError:
                    pass
        where = f"messages[{i}]"
        if not isinstance(m, Mapping):
            raise ConfigError(
                where, f"expected a mapping like {{'role': 'user', 'content': '...'}}, got {type(m).__name__}"
            )
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise ConfigError(
                f"{where}.role", "expected a role string ('system', 'user', 'assistant', 'tool')"
            )
        content = m.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, Mapping):
                    raise ConfigError(
                        f"{where}.content[{j}]",
                        "expected a content part mapping, e.g. {'type': 'text', 'text': '...'}",
                    )
                for key, value in part.items():
                    _check_text(f"{where}.content[{j}].{key}", value)
        elif content is not None and not isinstance(content, str):
            if isinstance(content, bytes | bytearray):
                _check_text(f"{where}.content", content)
            raise ConfigError(
                f"{where}.content", f"expected text or a list of content parts, got {type(content).__name__}"
            )
        else:
            _check_text(f"{where}.content", content)
    if not kwargs or _NUMBERS.keys().isdisjoint(kwargs):
        return
    for name, (kind, low, high) in _NUMBERS.items():
        value = kwargs.get(name)
        if value is None:
            continue
        ok = not isinstance(value, bool) and isinstance(value, int if kind is int else int | float)
        if ok and kind is float:
            ok = math.isfinite(value)
        if ok and ((low is not None and value < low) or (high is not None and value > high)):
            ok = False
        if not ok:
            span = (
                f" between {low} and {high}"
                if low is not None and high is not None
                else (f" >= {low}" if low is not None else "")
            )
            raise ConfigError(
                name, f"expected a finite {'whole ' if kind is int else ''}number{span}, got {value!r}"
            )


def split_options(kwargs: Mapping[str, Any]) -> tuple[CallOptions, dict[str, Any]]:
    """Validate the plugin's per-call options and take them out of LiteLLM's kwargs."""
    clean = {k: v for k, v in kwargs.items() if k not in OPTION_KEYS}
    timeout = clean.pop("timeout", None)
    attempt_timeout = positive_seconds("attempt_timeout", kwargs.get("attempt_timeout"))
    if attempt_timeout is None and isinstance(timeout, int | float) and not isinstance(timeout, bool):
        attempt_timeout = positive_seconds("timeout", timeout)
    key = kwargs.get("idempotency_key")
    if key is not None and (not isinstance(key, str) or not key):
        raise ConfigError("idempotency_key", "must be a non-empty string")
    priority = kwargs.get("priority")
    if priority is not None and not isinstance(priority, str):
        raise ConfigError("priority", "must be a string naming a configured tier")
    scenario = kwargs.get("scenario")
    if scenario is not None and not isinstance(scenario, str):
        raise ConfigError("scenario", "must be a string naming a configured static answer")
    recover = kwargs.get("recover_streams")
    if recover is not None and not isinstance(recover, bool) and recover != "answer":
        raise ConfigError(
            "recover_streams",
            "must be True, False or 'answer' (ask again without streaming); None: as the policy says",
        )
    by_caller = kwargs.get("recovered_by_caller", False)
    if not isinstance(by_caller, bool):
        raise ConfigError("recovered_by_caller", "must be True or False")
    avoid = kwargs.get("avoid_deployments") or ()
    if not isinstance(avoid, list | tuple | set | frozenset) or not all(isinstance(d, str) for d in avoid):
        raise ConfigError("avoid_deployments", "must be a collection of deployment ids (strings)")
    opts = CallOptions(
        key=key,
        idempotent=bool(kwargs.get("idempotent", True)),
        attempt_timeout=attempt_timeout,
        first_chunk_timeout=positive_seconds("first_chunk_timeout", kwargs.get("first_chunk_timeout")),
        stream_idle_timeout=positive_seconds("stream_idle_timeout", kwargs.get("stream_idle_timeout")),
        priority=priority,
        scenario=scenario,
        recover_streams=recover,
        recovered_by_caller=by_caller,
        avoid=frozenset(avoid),
        deadline_cap=positive_seconds("deadline_cap", kwargs.get("deadline_cap")),
    )
    return opts, clean


def streams_recovered(call: CallState, asked: EffectivePolicy) -> bool:
    """Would ``call``'s stream be recovered if it broke after content now - by the router (the
    call's ``recover_streams``, else ``asked``, the requested group's policy, while its restart
    cap is not reached) or by its caller (``recovered_by_caller``)? Only then may its idle limit
    be learned below the default: otherwise a cut would end the caller's answer."""
    return call.opts.recovered_by_caller or router_resumes(call, asked)


def router_resumes(call: CallState, asked: EffectivePolicy) -> bool:
    """Does the router resume ``call``'s stream if it breaks after content now: recovery on
    (:func:`router_recovers_streams`) and ``asked``'s ``max_stream_restarts`` not reached?"""
    under_cap = call.report.stream_restarts < asked.max_stream_restarts
    return under_cap and router_recovers_streams(call.opts, asked)


def router_recovers_streams(opts: CallOptions, pol: EffectivePolicy) -> bool:
    """Does the router itself resume this call's stream when it breaks after content (the
    call's ``recover_streams``, else the policy's restart/prefill switches)?"""
    if opts.recover_streams is not None:
        return bool(opts.recover_streams)
    return pol.restart_broken_streams or pol.continue_streams_with_prefill


class Served(NamedTuple):
    """The last answer of a call, as its attempt read it (so the report is filled without re-reading)."""

    response: Any
    usage: dict[str, int] | None
    deployment_id: str | None


@dataclass(slots=True)
class CallState:
    """Everything one logical call carries across its attempts, retries and fallbacks."""

    call_id: str
    report: CallReport
    deadline: Deadline
    stream: bool
    listener: Listener | None
    before_retry: BeforeRetry | None
    # The deployments that failed this call and those it must not use again, and its failures in
    # order: immutable, shared empty values until the first failure (a healthy call allocates
    # none of them); change them with :meth:`add_failure`, :meth:`mark_failed`, :meth:`avoid`.
    failed: frozenset[str] = frozenset()
    never_again: frozenset[str] = frozenset()
    attempt_no: int = 0
    next_wait: float = 0.0
    failures: Sequence[Failure] = ()
    opts: CallOptions = NO_OPTIONS
    tier: TierPolicy | None = None
    require_prefill: bool = False
    tentative: bool = False  # a walk whose failure is not the call's end (a stream recovering)
    out_of_time: bool = False  # a retry or fallback was given up because it would not fit
    served: Served | None = None  # the last answer, as its attempt read it
    context: Any = None  # what the dispatcher needs for this call (e.g. a LangChain run's config)
    operation: str = "completion"  # which LiteLLM call each attempt makes (see _engine.dispatch)

    def add_failure(self, failure: Failure) -> None:
        """Count one more failure of this call (an attempt's, or a route skipped)."""
        self.failures = (*self.failures, failure)

    def mark_failed(self, dep: str) -> None:
        """``dep`` failed this call: prefer other deployments from now on."""
        if dep not in self.failed:
            self.failed = self.failed | {dep}

    def avoid(self, dep: str) -> None:
        """Never send this call to ``dep`` again."""
        if dep not in self.never_again:
            self.never_again = self.never_again | {dep}


def next_route(
    call: CallState,
    policy: ResiliencePolicy,
    group_policy: EffectivePolicy,
    chain: Sequence[str],
    failure: Failure,
    tried: Sequence[str],
    level: int = 0,
) -> str | None:
    """The fallback group to move to after ``failure`` exhausted a group, or None to stop.

    ``chain`` is the requested group's fallback chain for the failure's class; ``tried`` the
    groups already walked; ``level`` the current fallback level.
    """
    if group_policy.classes[failure.error_class].action == "fail":
        return None
    if call.deadline.remaining() <= policy.min_attempt_time:
        return None
    if len(tried) - 1 >= policy.max_fallbacks:
        return None
    if call.tier is not None and call.tier.max_fallback_level is not None:
        if level + 1 > call.tier.max_fallback_level:
            return None
    for g in chain:
        if g not in tried:
            return g
    return None


def wants_static_answer(call: CallState, failure: Failure, static_answers: Mapping[str, str]) -> str | None:
    """The configured static answer for this call's scenario, if the failure allows degrading to it."""
    scenario = call.opts.scenario
    if scenario is None or failure.error_class in (ErrorClass.BAD_REQUEST, ErrorClass.UNKNOWN):
        return None
    return static_answers.get(scenario)


def provider_error_as_itself(call: CallState, failure: Failure) -> bool:
    """The router's rule: a caller-side provider error (bad request, context window, content
    policy, budget, unknown) is raised as itself — no other route would have answered it."""
    return failure.error_class in RAISED_AS_THEMSELVES and not isinstance(failure.exception, DeadlineSkip)


def final_error(
    call: CallState,
    min_attempt_time: float,
    as_itself: Callable[[CallState, Failure], bool] = provider_error_as_itself,
) -> BaseException:
    """The most informative error: the first failure ``as_itself`` picks, raised as itself;
    otherwise one error listing every attempt (:class:`DeadlineExceededError` when time ran
    out), chained to the first root cause."""
    failures = call.failures
    report = call.report
    for f in failures:
        if as_itself(call, f):
            attach_report(f.exception, report)
            return f.exception
    real = [f for f in failures if not isinstance(f.exception, DeadlineSkip)]
    root = next((f for f in real if f.error_class is not ErrorClass.CIRCUIT_OPEN), None)
    root = root or (real[0] if real else None)
    n = report.upstream_requests
    paced_out = [f.exception.wait_s for f in real if isinstance(f.exception, PacedOut)]
    if paced_out and all(f.error_class is ErrorClass.RATE_LIMIT for f in real):
        return _rate_limit_wait(call, real, min(paced_out))
    out_of_time = call.out_of_time or call.deadline.remaining() <= min_attempt_time
    if out_of_time and failures:
        err: AllRoutesFailedError = DeadlineExceededError(
            f"deadline exceeded after {n} request(s) for {report.requested_group!r}",
            report.attempts,
            report,
        )
    else:
        err = AllRoutesFailedError(
            f"all routes failed for {report.requested_group!r} after {n} request(s)",
            report.attempts,
            report,
        )
    if root is not None:
        err.__cause__ = root.exception
        err = as_provider_error(err, root.exception)  # drop-in: caught as a plain Router's error
    return err


def _rate_limit_wait(call: CallState, real: Sequence[Failure], wait_s: float) -> BaseException:
    """Every route was at its rate limit and no slot came in time: a :class:`RateLimitWaitError`,
    also the provider's ``RateLimitError`` (its 429, or one made for it when nothing was sent), so
    a caller written for a plain Router catches it as one."""
    report = call.report
    group, n = report.requested_group, report.upstream_requests
    err: AllRoutesFailedError = RateLimitWaitError(
        f"rate-limited on every route for {group!r} after {n} request(s)",
        report.attempts,
        report,
        wait_s,
    )
    root = next((f.exception for f in real if f.status is not None), None)
    if root is None:
        import litellm

        try:
            root = litellm.RateLimitError(
                str(real[-1].exception), llm_provider="", model=report.requested_group
            )
        except Exception:  # another LiteLLM's constructor: the plugin's error alone
            return err
    err.__cause__ = root
    return as_provider_error(err, root)


def attempt_limit(
    call: CallState, pol: EffectivePolicy, *, elsewhere: bool = True, learned: float | None = None
) -> float:
    """The time limit of one attempt (to the first chunk for streams), before the deadline.

    A stream's first-chunk limit, unless the caller or the policy set one, is the learned value
    (or the short static default) while the call has ``elsewhere`` to go, and the whole attempt
    timeout when it has not: waiting is then better than failing.
    """
    attempt = call.opts.attempt_timeout or pol.attempt_timeout
    if not call.stream:
        return attempt
    explicit = call.opts.first_chunk_timeout or call.opts.attempt_timeout
    if explicit:
        return explicit
    if pol.learn_stream_timeouts:
        if not elsewhere:
            return attempt
        return min(attempt, learned) if learned is not None else pol.first_chunk_timeout
    return pol.first_chunk_timeout


def coarse_timeout(seconds: float, cap: float) -> float:
    """``seconds`` rounded up to a whole second (a tenth below one second), at most ``cap``."""
    step = 1.0 if seconds >= 1.0 else 0.1
    return min(cap, math.ceil(seconds / step) * step)


# attempt_timeouts' answers when the deadline leaves the whole limit: they depend on the limit and
# cap alone, which stay the same over many calls (cleared when full: a learned limit moves on).
_WHOLE_LIMIT: dict[tuple[float, float | None], tuple[float, float, float]] = {}


def attempt_timeouts(limit: float, remaining: float, cap: float | None = None) -> tuple[float, float, float]:
    """(exact timeout, the timeout sent to LiteLLM, the watchdog's hard bound) for one attempt.

    LiteLLM builds and caches an HTTP client (an SDK client with its own connection pool) per
    timeout value: the rest of a deadline is a new value every call, and so is a limit learned
    from answer times (``cap``: the configured timeout it stays under), so these get a coarse
    value (few values, cache hits) and the watchdog holds the exact bound. A configured attempt
    timeout goes through as it is.
    """
    whole = remaining >= limit
    if whole:  # the common case, computed once per (limit, cap)
        known = _WHOLE_LIMIT.get((limit, cap))
        if known is not None:
            return known
    timeout = min(limit, remaining)
    if cap is not None and limit != cap:  # a learned limit: new every few answers
        sent = coarse_timeout(timeout, cap)
    else:
        sent = timeout if timeout == limit else coarse_timeout(timeout, limit)
    bound = timeout if sent > timeout else timeout + 0.25
    if whole:
        if len(_WHOLE_LIMIT) >= 64:
            _WHOLE_LIMIT.clear()
        _WHOLE_LIMIT[(limit, cap)] = (timeout, sent, bound)
    return timeout, sent, bound
