"""CallRunner: one router's call machinery, the seam between :class:`ResilientRouter` and its
endpoints (``_operations``).

It opens a call (validation, plugin options, tier and load shedding, the report and the call's
state), runs it to a response (with the idempotency store and single-flight when configured) or
to a stream, checks model group names, and runs coroutines on the router's private loop for the
blocking twins. The router owns one and exposes it as ``calls``; chat and every other operation
go through the same methods, so they validate, key and replay calls alike.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import uuid
import weakref
from collections.abc import Coroutine, Mapping
from typing import Any

import litellm

from llm_resilience_plugin._engine.clock import Deadline, call_budget
from llm_resilience_plugin._engine.core import (
    NO_OPTIONS,
    OPTION_KEYS,
    BeforeRetry,
    CallOptions,
    CallState,
    positive_seconds,
    split_options,
    validate_request,
)
from llm_resilience_plugin._engine.drivers import SyncRunner, walk_routes
from llm_resilience_plugin._engine.engine import Engine
from llm_resilience_plugin._engine.idempotency import (
    DEFAULT_SCOPE_KEYS,
    IdempotencyStore,
    SingleFlight,
    check_content,
    fingerprint,
    scope_of,
    scoped_key,
)
from llm_resilience_plugin._redaction import SecretHold, credential_values, is_call_secret, safe_metadata
from llm_resilience_plugin.errors import (
    ConfigError,
    DeadlineExceededError,
    ErrorClass,
    LoadShedError,
    RouterClosedError,
    UnknownModelGroupError,
)
from llm_resilience_plugin.events import (
    CallReport,
    CallStarted,
    Listener,
    attach_report,
    fill_from_response,
    usage_of,
)
from llm_resilience_plugin.policy import ResiliencePolicy, RouterSpec, TierPolicy
from llm_resilience_plugin.routing._shutdown import Shutdown, closed_error, cut_error
from llm_resilience_plugin.routing._streams import ResilientStream, StaticStream

__all__ = ["CallRunner", "response_type"]

# Call ids: a random per-process prefix and a counter (uuid4 costs an urandom syscall per call).
_CALL_PREFIX = f"{uuid.uuid4().hex[:8]}-"
_CALL_IDS = itertools.count(1)


class CallRunner:
    """Opens and runs one router's calls (any operation) on its engine; see the module docs.

    ``store``/``ttl``: the idempotency store (None: off) and how long its answers are kept;
    ``scope_keys``: the metadata keys (or ``key:value`` tags) that scope a key, e.g. the tenant.
    """

    def __init__(self, engine: Engine, spec: RouterSpec, sync: SyncRunner) -> None:
        self.engine = engine
        self.spec = spec
        self.policy: ResiliencePolicy = spec.policy
        self.sync = sync  # the private loop thread the blocking twins run on
        self.store: IdempotencyStore | None = None
        self.ttl = 600.0
        self.scope_keys: tuple[str, ...] = DEFAULT_SCOPE_KEYS
        self._single_flight = SingleFlight()
        self.shutdown = Shutdown()  # close()/aclose(): refuse new calls, drain, cancel the rest

    def check_group(self, group: str) -> None:
        """Raise :class:`UnknownModelGroupError` unless ``group`` is one of the router's groups."""
        if not isinstance(group, str):
            raise UnknownModelGroupError(repr(group), list(self.engine.group_deployments))
        if group not in self.engine.group_deployments:
            raise UnknownModelGroupError(group, list(self.engine.group_deployments))

    def run_sync(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the router's private loop and wait for its result (blocking twins)."""
        return self.sync.run(coro)

    def budget(self, model: str, deadline: float | None, kwargs: Mapping[str, Any]) -> float:
        """The seconds a call to ``model`` with these arguments may take, by the rule every call
        follows (:func:`call_budget`): for work made of several calls under one deadline."""
        deadline = positive_seconds("deadline", deadline)
        opts, _ = split_options(kwargs) if kwargs else (NO_OPTIONS, {})
        tier = None
        if opts.priority is not None or self.policy.default_tier is not None:
            tier = _tier_of(self.policy, opts.priority)[1]
        return self._budget(model, deadline, tier, opts)

    def _budget(
        self, model: str, deadline: float | None, tier: TierPolicy | None, opts: CallOptions
    ) -> float:
        """The :func:`call_budget` rule for a call to ``model``: its own deadline, its tier's, the
        group's policy's, capped by its ``deadline_cap``."""
        pol = self.engine.policies[model].deadline
        return call_budget(deadline, tier.deadline if tier is not None else None, pol, cap=opts.deadline_cap)

    def open_call(
        self,
        model: str,
        messages: Any,
        stream: bool,
        deadline: float | None,
        listener: Listener | None,
        before_retry: BeforeRetry | None,
        kwargs: Mapping[str, Any],
        operation: str = "completion",
    ) -> tuple[CallState, dict[str, Any]]:
        """Validate the call (nothing is sent on bad input) and split plugin options from kwargs;
        ``operation``: which LiteLLM call (its payload is checked by the caller when not chat)."""
        if self.shutdown.closed:
            raise closed_error()
        if type(model) is not str or model not in self.engine.group_deployments:
            self.check_group(model)
        if operation == "completion":
            validate_request(messages, kwargs)
        if deadline is not None:
            deadline = positive_seconds("deadline", deadline)
        if kwargs and (not OPTION_KEYS.isdisjoint(kwargs) or "timeout" in kwargs):
            opts, clean = split_options(kwargs)
        else:  # the common case: LiteLLM's own arguments only
            opts, clean = NO_OPTIONS, dict(kwargs)
        if opts.priority is None and self.policy.default_tier is None:
            priority, tier = None, None  # the common case, without a call
        else:
            priority, tier = _tier_of(self.policy, opts.priority)
        if priority is not None and tier is not None and tier.shed_below > 0:
            self._shed_check(model, priority, tier, clean)
        call_id = f"{_CALL_PREFIX}{next(_CALL_IDS):x}"
        # Positional, the defaults left alone: a dataclass's __init__ takes keywords measurably slower
        report = CallReport(call_id, model, stream, self.engine.clock.wall())
        if priority is not None:
            report.priority = priority
        if operation != "completion":
            report.operation = operation
        keyed = model if operation == "completion" else f"{operation}:{model}"
        if opts.key is not None:
            report.idempotency_key = opts.key
        elif self.store is not None:
            report.idempotency_key = fingerprint(keyed, messages, clean)
        else:  # hashed only if read (a list is copied: appending to it later changes nothing)
            snapshot = list(messages) if isinstance(messages, list) else messages
            report.key_from(fingerprint, (keyed, snapshot, clean))
        budget_s = self._budget(model, deadline, tier, opts)
        clock = self.engine.clock
        deadline_at = Deadline(clock, clock.monotonic() + budget_s)  # Deadline.after, inline
        ctx = CallState(call_id, report, deadline_at, stream, listener, before_retry)  # as the report
        if opts is not NO_OPTIONS:
            ctx.opts = opts
        if tier is not None:
            ctx.tier = tier
        if operation != "completion":
            ctx.operation = operation
        if opts.avoid:  # deployments the caller knows just failed this request (never sent to)
            ctx.failed = ctx.failed | frozenset(opts.avoid)
            ctx.never_again = ctx.never_again | frozenset(opts.avoid)
        events = self.engine.events
        if events.active:  # for observers (logs, metrics); a call's own listener sees attempts on
            events.emit(_started(ctx, messages, clean))
        return ctx, clean

    def _shed_check(self, group: str, name: str, tier: TierPolicy, kwargs: Mapping[str, Any]) -> None:
        """Refuse a low tier while the group's retry budget (or a guard's budget) runs low."""
        budget = self.engine.budgets[group]
        if budget.policy.enabled and budget.fraction < tier.shed_below:
            raise LoadShedError(name, f"retry budget of {group!r}", budget.fraction, tier.shed_below)
        metadata = kwargs.get("metadata") or {}
        for guard in self.engine.guards:
            headroom = getattr(guard, "headroom", None)
            fraction = headroom(metadata) if callable(headroom) else None
            if fraction is not None and fraction < tier.shed_below:
                raise LoadShedError(name, type(guard).__name__, fraction, tier.shed_below)

    @staticmethod
    def brings_secrets(kwargs: Mapping[str, Any]) -> bool:
        """Does the call carry its own credentials (held while it runs, see :meth:`complete`)?"""
        return bool(kwargs) and any(map(is_call_secret, kwargs))

    async def _follow(self, ctx: CallState, leader: asyncio.Future[Any]) -> Any:
        """Wait for the identical call in flight (same idempotency key), within this call's own
        deadline; its stored entry, or None when it failed (this call then goes itself)."""
        try:
            return await asyncio.wait_for(asyncio.shield(leader), timeout=ctx.deadline.remaining())
        except TimeoutError:
            r = ctx.report
            r.outcome, r.error_class = "failure", ErrorClass.TIMEOUT
            r.total_latency_s = self.engine.clock.wall() - r.started_at
            self.engine.emit(ctx, r)
            raise DeadlineExceededError(
                f"deadline exceeded while an identical call (idempotency key {r.idempotency_key!r}) "
                "was still in flight",
                r.attempts,
                r,
            ) from None

    async def complete(self, ctx: CallState, group: str, messages: Any, kwargs: dict[str, Any]) -> Any:
        """A non-stream call, with the idempotency store and single-flight when configured (the
        key scoped to the call's tenant, operation and group, bound to the request's content); one
        the router's shutdown cancels raises :class:`RouterClosedError` (its report: cancelled)."""
        hold = _call_secrets(kwargs)
        shutdown = self.shutdown
        task = shutdown.enter()
        try:
            return await self._complete(ctx, group, messages, kwargs)
        except asyncio.CancelledError:
            if shutdown.was_cut(task):
                raise self._cut_short(ctx) from None
            raise
        finally:
            shutdown.leave(task)
            if hold is not None:
                hold.release()

    def _cut_short(self, ctx: CallState) -> RouterClosedError:
        """A call cancelled by the shutdown: its report published as cancelled, the error."""
        r = ctx.report
        r.outcome = "cancelled"
        r.total_latency_s = self.engine.clock.wall() - r.started_at
        self.engine.emit(ctx, r)
        return cut_error(r)

    async def _complete(self, ctx: CallState, group: str, messages: Any, kwargs: dict[str, Any]) -> Any:
        store = self.store
        if store is None or ctx.operation in _NOT_STORED:
            return await walk_routes(self.engine, ctx, group, messages, kwargs)
        given = ctx.report.idempotency_key
        assert given is not None  # set in open_call whenever a store is configured
        keyed = group if ctx.operation == "completion" else f"{ctx.operation}:{group}"
        content = given if ctx.opts.key is None else fingerprint(keyed, messages, kwargs)
        key = scoped_key(scope_of(kwargs.get("metadata"), self.scope_keys), ctx.operation, group, given)
        stored = store.get(key)
        if stored is not None:
            self._check_content(ctx, given, stored, content)
            return self._replay(ctx, stored)
        inflight = self._single_flight.join(key)
        if inflight is not None:
            self._check_content(ctx, given, {"fingerprint": inflight[1]}, content)
            shared = await self._follow(ctx, inflight[0])
            if shared is not None:
                return self._replay(ctx, shared)
        fut = self._single_flight.lead(key, content)
        entry: dict[str, Any] | None = None
        try:
            resp = await walk_routes(self.engine, ctx, group, messages, kwargs)
            r = ctx.report
            entry = {
                "response": resp.model_dump(),
                "served_group": r.served_group,
                "deployment_id": r.deployment_id,
                "call_id": r.call_id,
                "stored_at": self.engine.clock.wall(),
                "operation": ctx.operation,
                "fingerprint": content,
            }
            if not r.degraded:
                store.put(key, entry, self.ttl)
            return resp
        finally:
            self._single_flight.done(key)
            fut.set_result(entry)  # followers replay it, or (None) make their own call

    def _check_content(self, ctx: CallState, given: str, entry: Mapping[str, Any], content: str) -> None:
        """A key reused with other content: the call ends as the caller's error (published)."""
        try:
            check_content(given, entry, content)
        except ConfigError as err:
            r = ctx.report
            r.outcome, r.error_class = "failure", ErrorClass.BAD_REQUEST
            r.total_latency_s = self.engine.clock.wall() - r.started_at
            attach_report(err, r)
            self.engine.emit(ctx, r)
            raise

    def _replay(self, ctx: CallState, entry: Mapping[str, Any]) -> Any:
        resp = rebuilt(response_type(entry.get("operation", "completion")), entry["response"])
        r = ctx.report
        r.replayed = True
        r.outcome = "success"
        r.served_group = entry.get("served_group")
        r.deployment_id = entry.get("deployment_id")
        fill_from_response(r, resp, usage_of(resp))
        r.response_cost = 0.0  # nothing was paid for this answer
        r.total_latency_s = self.engine.clock.wall() - r.started_at
        attach_report(resp, r)
        self.engine.emit(ctx, r)
        return resp

    async def stream(
        self, ctx: CallState, group: str, messages: Any, kwargs: dict[str, Any]
    ) -> ResilientStream | StaticStream:
        """A stream call: the first route's :class:`ResilientStream` (or a static answer's),
        watched by the router's shutdown until it ends; the call's own credentials stay held for
        scrubbing until then (its last chunk, its error, ``aclose()``, or a cut by the shutdown,
        which raises :class:`RouterClosedError`)."""
        hold = _call_secrets(kwargs)
        shutdown = self.shutdown
        task = shutdown.enter()
        release = hold.release if hold is not None else None
        try:
            result = await walk_routes(self.engine, ctx, group, messages, kwargs)
            assert isinstance(result, ResilientStream | StaticStream)
            if isinstance(result, ResilientStream):  # watched until it ends (then the hold goes)
                result.watch = shutdown.watch(result, release)
            elif release is not None:  # a static answer: one chunk, nothing sent
                weakref.finalize(result, release)
        except asyncio.CancelledError:
            if release is not None:
                release()
            if shutdown.was_cut(task):
                raise self._cut_short(ctx) from None
            raise
        except BaseException:
            if release is not None:
                release()
            raise
        finally:
            shutdown.leave(task)
        return result


# Operations whose answers the idempotency store cannot keep (speech: audio bytes, no JSON).
_NOT_STORED = frozenset({"speech"})


def _call_secrets(kwargs: Mapping[str, Any]) -> SecretHold | None:
    """The call's own credentials (a per-call ``api_key``, ``aws_*``, header values), held for
    scrubbing from its errors, reports and logs while it runs; None when it brings none."""
    values = credential_values(kwargs) if kwargs else ()
    return SecretHold(values) if values else None


def response_type(operation: str) -> Any:
    """LiteLLM's response class of an operation (a stored answer is replayed as one)."""
    from litellm.types.llms.openai import OpenAIModerationResponse, ResponsesAPIResponse
    from litellm.types.rerank import RerankResponse

    return {
        "embedding": litellm.EmbeddingResponse,
        "text_completion": litellm.TextCompletionResponse,
        "image_generation": litellm.ImageResponse,
        "responses": ResponsesAPIResponse,
        "transcription": litellm.TranscriptionResponse,
        "moderation": OpenAIModerationResponse,
        "rerank": RerankResponse,
    }.get(operation, litellm.ModelResponse)


def rebuilt(cls: Any, data: Mapping[str, Any]) -> Any:
    """A stored answer as LiteLLM's class again; an older release's ``__init__`` that takes fewer
    fields (1.105's ``TranscriptionResponse(text)``) gets the rest set as attributes, as LiteLLM does."""
    try:
        return cls(**data)
    except TypeError:
        params = inspect.signature(cls.__init__).parameters
        obj = cls(**{k: v for k, v in data.items() if k in params})
        for k, v in data.items():
            if k not in params:
                setattr(obj, k, v)
        return obj


def _tier_of(policy: ResiliencePolicy, asked: str | None) -> tuple[str | None, TierPolicy | None]:
    """The call's priority (the policy's default tier when it names none) and that tier."""
    priority = asked if asked is not None else policy.default_tier
    if priority is None:
        return None, None
    tier = policy.tiers.get(priority)
    if tier is None:
        raise ConfigError("priority", f"unknown tier {priority!r}; configured tiers: {sorted(policy.tiers)}")
    return priority, tier


def _started(ctx: CallState, messages: Any, clean: Mapping[str, Any]) -> CallStarted:
    """The event observers see when a call starts (metadata made safe, chat messages only)."""
    md = clean.get("metadata")
    tags = md.get("tags") if isinstance(md, Mapping) else None
    report = ctx.report
    return CallStarted(
        ctx.call_id,
        report.requested_group,
        ctx.stream,
        report.idempotency_key,
        safe_metadata(md if isinstance(md, Mapping) else None),
        [str(x) for x in tags] if isinstance(tags, list | tuple) else [],
        messages if ctx.operation == "completion" else None,
        ctx.operation,
    )
