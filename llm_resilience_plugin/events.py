"""Structured records: one per attempt, one per call, one per breaker transition and retry.

Records are frozen dataclasses, except :class:`CallReport`, which the call fills in as it runs;
:func:`event_dict` gives any of them as a JSON-safe dict (no secrets, no message content).
Listeners subscribe on the router; the ``llm_resilience`` logger gets every record too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, Protocol

from llm_resilience_plugin._litellm import hidden_params_of
from llm_resilience_plugin.errors import ErrorClass, Failure

logger = logging.getLogger("llm_resilience")

Outcome = Literal["success", "failure", "cancelled", "skipped"]


@dataclass(frozen=True, slots=True)
class BreakerTransition:
    """A breaker changed state (emitted once per transition)."""

    deployment_id: str
    model_group: str
    old_state: str
    new_state: str
    at: float
    fail_counter: int


@dataclass(frozen=True, slots=True)
class DeploymentInfo:
    """What the plugin knows of one deployment (never its API key)."""

    id: str
    model_group: str
    model: str
    api_base: str | None
    params: Mapping[str, Any] = field(default_factory=dict)  # litellm_params without secrets

    @property
    def supports_prefill(self) -> bool:
        """Can this deployment continue an assistant message (assistant prefill)?"""
        flag = self.params.get("supports_assistant_prefill")
        if flag is not None:
            return bool(flag)
        # LiteLLM's model map (only asked when a stream must be continued; keeps this module
        # light): capability ``prefill_lookup`` of the LiteLLM seam.
        from llm_resilience_plugin._litellm import supports_assistant_prefill

        provider = self.params.get("custom_llm_provider")
        return supports_assistant_prefill(self.model, provider if isinstance(provider, str) else None)


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    """What an :class:`AttemptGuard` sees before an attempt (no API keys)."""

    call_id: str
    attempt: int
    model_group: str
    fallback_level: int
    deployments: tuple[DeploymentInfo, ...]
    messages: list[dict[str, Any]]
    kwargs: Mapping[str, Any]
    metadata: Mapping[str, Any]
    stream: bool
    idempotency_key: str | None = None
    operation: str = "completion"  # LiteLLM's call; ``messages`` is its payload when not chat


class AttemptGuard(Protocol):
    """Consulted before every attempt (retries and fallbacks too) and told its outcome.

    ``before_attempt`` may raise (e.g. ``BudgetExceededError``) to refuse the attempt before any
    request is sent; it returns a token handed back to exactly one ``after_attempt`` call.
    """

    def before_attempt(self, info: AttemptInfo) -> Any: ...

    def after_attempt(
        self,
        token: Any,
        *,
        deployment_id: str | None,
        response: Any | None,
        usage: Mapping[str, int] | None,
        failure: Failure | None,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One attempt (or one skipped route) of a logical call."""

    call_id: str
    attempt: int
    model_group: str
    deployment_id: str | None
    fallback_level: int
    outcome: Outcome
    error_class: ErrorClass | None
    status: int | None
    error_message: str | None
    started_at: float
    latency_s: float
    wait_before_s: float
    breaker_state: str | None = None
    ttft_s: float | None = None
    probe: bool = False
    served_model: str | None = None  # the model the provider says answered (successes)
    usage: dict[str, int] | None = None  # the attempt's token usage, when known
    cost: float | None = None  # what the provider (LiteLLM's price map) says the attempt cost
    operation: str = "completion"  # LiteLLM's call (see CallStarted.operation)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["error_class"] = str(self.error_class) if self.error_class else None
        return d


@dataclass(frozen=True, slots=True)
class CallStarted:
    """A call was accepted (validated, nothing sent yet): what observers need to know of it.

    ``metadata`` is the caller's scalar metadata without secrets; ``messages`` the request's
    messages (the caller's own objects: log them only when content logging is on).
    """

    call_id: str
    requested_group: str
    stream: bool
    idempotency_key: str | None
    metadata: dict[str, Any]
    tags: list[str]
    messages: Any = None
    operation: str = "completion"  # LiteLLM's call: completion (chat), embedding, responses, ...

    def to_dict(self) -> dict[str, Any]:
        out = {
            "call_id": self.call_id,
            "requested_group": self.requested_group,
            "stream": self.stream,
            "idempotency_key": self.idempotency_key,
            "metadata": self.metadata,
            "tags": self.tags,
        }
        if self.operation != "completion":
            out["operation"] = self.operation
        return out


@dataclass(frozen=True, slots=True)
class RetryScheduled:
    """The router is about to sleep before retrying in the same model group."""

    call_id: str
    model_group: str
    retry_number: int
    sleep_s: float
    error_class: ErrorClass
    deployment_id: str | None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["error_class"] = str(self.error_class)
        return d


@dataclass(frozen=True, slots=True)
class Paced:
    """An attempt waited for a slot in a deployment's rate-limit queue, then went out."""

    call_id: str
    model_group: str
    deployment_id: str
    waited_s: float
    priority: str | None
    queued: int  # calls still waiting in that deployment's queue

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class FallbackTaken:
    """The call moved to another model group."""

    call_id: str
    from_group: str
    to_group: str
    fallback_level: int
    reason: ErrorClass

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["reason"] = str(self.reason)
        return d


@dataclass(frozen=True, slots=True)
class HedgeSent:
    """A hedge request was sent because the first attempt had not answered within ``delay_s``."""

    call_id: str
    model_group: str
    delay_s: float
    first_deployment: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class StreamRestart:
    """A broken stream goes on another route (opt-in), also yielded in-band by the stream.

    ``mode="restart"``: the answer starts over, discard what you have (``discarded_text``).
    ``mode="continue"``: the next chunks continue ``discarded_text`` (assistant prefill); keep it.
    ``mode="resume"``: the new route repeated ``discarded_text`` word for word, so the stream
    simply goes on after it (nothing to do; this mode is an event only, never yielded in-band).
    ``mode="answer"`` (``recover_streams="answer"``): the call was answered again without
    streaming; the whole answer is ``response`` and the stream ends after this marker.
    """

    call_id: str
    model_group: str
    discarded_text: str
    error_class: ErrorClass
    mode: Literal["restart", "continue", "resume", "answer"] = "restart"
    response: Any = field(default=None, repr=False, compare=False)
    """The whole answer (``mode="answer"`` only; never in :meth:`to_dict`)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "model_group": self.model_group,
            "error_class": str(self.error_class),
            "mode": self.mode,
            "discarded_chars": len(self.discarded_text),
        }


BreakEnd = Literal["continued", "replayed", "diverged", "given_up"]


@dataclass(frozen=True, slots=True)
class StreamBreak:
    """How one break of a stream after content ended under seamless recovery (published as an
    event and kept in :attr:`CallReport.stream_breaks`).

    ``continued``: another route continued the text by assistant prefill; ``replayed``: a route
    answered again from scratch, its text matched what was shown, and only the rest was
    streamed; ``diverged``: a replay's text differed from what was shown and was discarded (the
    call moved on); ``given_up``: no way on was left (the caller gets
    :class:`~llm_resilience_plugin.StreamInterruptedError`, with the replacement answer when
    one was had). ``extra_tokens``: tokens this way cost beyond the answer the caller kept
    (the prompt sent again, text generated again or discarded), when known - for a diverged
    replay, closed before its usage came, an estimate counted from the text sent and received;
    ``extra_cost`` the same in dollars, where a cost was reported; ``wait_s``: how long the
    caller waited after the break for its next chunk.
    """

    call_id: str
    model_group: str
    error_class: ErrorClass
    end: BreakEnd
    broken_deployment: str | None
    deployment_id: str | None = None
    shown_chars: int = 0
    extra_tokens: int | None = None
    extra_cost: float | None = None
    wait_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["error_class"] = str(self.error_class)
        return d


@dataclass(slots=True, repr=False)
class CallReport:
    """What happened in one logical call; reach it with :func:`llm_resilience_plugin.get_report`."""

    call_id: str
    requested_group: str
    stream: bool
    started_at: float
    # Read through ``attempts``. The last attempt's record may wait as its field values until
    # then: when no listener takes records as they happen, most calls never build one.
    _attempts: list[AttemptRecord] | None = None  # made on first read (most calls: never)
    _pending: tuple[Any, ...] | None = field(default=None, compare=False)
    served_group: str | None = None
    deployment_id: str | None = None
    served_model: str | None = None
    fallback_level: int = 0
    outcome: Outcome | None = None
    error_class: ErrorClass | None = None
    total_latency_s: float = 0.0
    ttft_s: float | None = None
    usage: dict[str, int] | None = None
    response_cost: float | None = None
    priority: str | None = None
    # Read and changed through ``degraded``; None until then (most calls never degrade).
    _degraded: list[str] | None = None
    hedged: bool = False
    replayed: bool = False
    stream_restarts: int = 0
    skipped_stream_events: int = 0  # invalid SSE events dropped in place (the stream went on)
    # How each break after content ended under seamless recovery; None until the first one.
    _stream_breaks: list[StreamBreak] | None = None
    operation: str = "completion"  # LiteLLM's call: completion (chat), embedding, responses, ...
    queued_s: float = 0.0  # seconds the call waited for a rate-limit slot (pacing), all attempts
    paced: int = 0  # attempts that waited in a deployment's rate-limit queue before sending
    # The key, or how to compute it: the content fingerprint is hashed on first read when nothing
    # needed it during the call, so calls without a store, guard or listener never pay for it.
    _idempotency_key: str | None = field(default=None, repr=False)
    _key_source: Callable[..., str] | None = field(default=None, repr=False, compare=False)
    _key_args: tuple[Any, ...] = field(default=(), repr=False, compare=False)

    @property
    def attempts(self) -> list[AttemptRecord]:
        """Every attempt (and skipped route) of the call, in order."""
        attempts = self._attempts
        if attempts is None:
            attempts = self._attempts = []
        if self._pending is not None:
            pending, self._pending = self._pending, None
            attempts.append(AttemptRecord(*pending))
        return attempts

    @property
    def stream_breaks(self) -> list[StreamBreak]:
        """How each break of the stream after content ended (seamless recovery), in order."""
        if self._stream_breaks is None:
            self._stream_breaks = []
        return self._stream_breaks

    @property
    def degraded(self) -> list[str]:
        """How the answer was degraded to be had (context trimmed, a fallback level's limits, a
        static answer), in order; empty when it was not."""
        if self._degraded is None:
            self._degraded = []
        return self._degraded

    @degraded.setter
    def degraded(self, value: list[str]) -> None:
        self._degraded = value

    def defer_attempt(self, values: tuple[Any, ...]) -> None:
        """Add an attempt as :class:`AttemptRecord`'s field values, built when first read."""
        if self._pending is not None:
            self.attempts  # noqa: B018 - builds the one before
        self._pending = values

    def __repr__(self) -> str:
        shown = (
            f.name.lstrip("_")
            for f in fields(self)
            if f.name in ("_degraded", "_stream_breaks") or not f.name.startswith("_")
        )
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in shown)
        return f"CallReport({inner}, attempts={self.attempts!r})"

    @property
    def idempotency_key(self) -> str | None:
        """Your ``idempotency_key=``, or the content fingerprint (``fp-…``) of the request."""
        if self._idempotency_key is None and self._key_source is not None:
            self._idempotency_key = self._key_source(*self._key_args)
            self._key_source, self._key_args = None, ()
        return self._idempotency_key

    @idempotency_key.setter
    def idempotency_key(self, value: str | None) -> None:
        self._idempotency_key, self._key_source, self._key_args = value, None, ()

    def key_from(self, source: Callable[..., str], args: tuple[Any, ...] = ()) -> None:
        """Compute the idempotency key as ``source(*args)`` on first read (a fingerprint nobody
        may need; the arguments in a tuple, not a ``partial``: one object fewer per call)."""
        self._idempotency_key, self._key_source, self._key_args = None, source, args

    @property
    def upstream_requests(self) -> int:
        """Attempts that sent a request (skipped routes sent nothing)."""
        return sum(1 for a in self.attempts if a.outcome != "skipped")

    @property
    def retries(self) -> int:
        return max(0, self.upstream_requests - 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "requested_group": self.requested_group,
            "stream": self.stream,
            "served_group": self.served_group,
            "deployment_id": self.deployment_id,
            "served_model": self.served_model,
            "fallback_level": self.fallback_level,
            "outcome": self.outcome,
            "error_class": str(self.error_class) if self.error_class else None,
            "total_latency_s": self.total_latency_s,
            "ttft_s": self.ttft_s,
            "upstream_requests": self.upstream_requests,
            "usage": self.usage,
            "response_cost": self.response_cost,
            "idempotency_key": self.idempotency_key,
            "priority": self.priority,
            "degraded": list(self._degraded or ()),
            "hedged": self.hedged,
            "replayed": self.replayed,
            "stream_restarts": self.stream_restarts,
            "skipped_stream_events": self.skipped_stream_events,
            "stream_breaks": [b.to_dict() for b in self._stream_breaks or ()],
            "operation": self.operation,
            "queued_s": self.queued_s,
            "paced": self.paced,
            "attempts": [a.to_dict() for a in self.attempts],
        }


def usage_of(obj: Any) -> dict[str, int] | None:
    """Token usage of a LiteLLM response or chunk as plain ints, or None when it has none."""
    extra = getattr(obj, "__pydantic_extra__", None)  # where LiteLLM's responses keep ``usage``
    usage = (
        extra["usage"]
        if (type(extra) is dict or isinstance(extra, dict)) and "usage" in extra
        else getattr(obj, "usage", None)
    )
    if usage is None:
        return None
    # A dict's keys or the object's attributes (no per-call closure: this runs on every answer).
    if isinstance(usage, dict):
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        total = usage.get("total_tokens")
        if prompt is None and completion is None:  # the Responses API's names
            prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
    else:
        prompt = getattr(usage, "prompt_tokens", None)
        completion = getattr(usage, "completion_tokens", None)
        total = getattr(usage, "total_tokens", None)
        if prompt is None and completion is None:
            prompt, completion = getattr(usage, "input_tokens", None), getattr(usage, "output_tokens", None)
    return {
        "prompt_tokens": int(prompt or 0),
        "completion_tokens": int(completion or 0),
        "total_tokens": int(total or 0),
    }


Event = (
    CallStarted
    | AttemptRecord
    | RetryScheduled
    | Paced
    | FallbackTaken
    | HedgeSent
    | StreamRestart
    | StreamBreak
    | BreakerTransition
    | CallReport
)
Listener = Callable[[Event], None]

REPORT_KEY = "llm_resilience_report"


def fill_from_response(report: CallReport, resp: Any, usage: dict[str, int] | None) -> None:
    """The served model, cost and usage of the answer."""
    report.served_model = getattr(resp, "model", None)
    cost = (hidden_params_of(resp) or {}).get("response_cost")
    report.response_cost = float(cost) if isinstance(cost, int | float) else None
    report.usage = usage


def attach_report(obj: Any, report: CallReport) -> None:
    """Attach ``report`` to a response or an error, where :func:`get_report` finds it."""
    hidden = hidden_params_of(obj)
    if hidden is not None:
        hidden[REPORT_KEY] = report
        return
    try:
        setattr(obj, REPORT_KEY, report)
    except (AttributeError, TypeError):
        pass


_EVENT_NAMES: dict[type, str] = {
    CallStarted: "call_started",
    AttemptRecord: "attempt",
    RetryScheduled: "retry",
    FallbackTaken: "fallback",
    HedgeSent: "hedge",
    StreamRestart: "stream_restart",
    StreamBreak: "stream_break",
    BreakerTransition: "breaker",
    Paced: "paced",
    CallReport: "call",
}


def event_name(event: Event) -> str:
    return _EVENT_NAMES[type(event)]


def event_dict(event: Event) -> dict[str, Any]:
    if isinstance(event, BreakerTransition):
        return asdict(event)
    return event.to_dict()


class EventBus:
    """Fan-out of records to listeners; a failing listener is logged, never raised into a call."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Add ``listener``; returns a function that removes it."""
        self._listeners = [*self._listeners, listener]

        def unsubscribe() -> None:
            self._listeners = [x for x in self._listeners if x is not listener]

        return unsubscribe

    @property
    def active(self) -> bool:
        """Would :meth:`emit` reach anyone (a listener, or the logger at DEBUG)?"""
        return bool(self._listeners) or logger.isEnabledFor(logging.DEBUG)

    def emit(self, event: Event) -> None:
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("llm_resilience event listener failed")
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                event_name(event), extra={"llm_event": event_dict(event), "llm_event_name": event_name(event)}
            )


# The public names; the helpers above (usage_of, attach_report, ...) serve the package itself.
__all__ = [
    "AttemptGuard",
    "AttemptInfo",
    "AttemptRecord",
    "BreakerTransition",
    "CallReport",
    "CallStarted",
    "DeploymentInfo",
    "Event",
    "EventBus",
    "FallbackTaken",
    "HedgeSent",
    "Listener",
    "Outcome",
    "Paced",
    "RetryScheduled",
    "StreamBreak",
    "StreamRestart",
    "event_dict",
    "event_name",
]
