"""ResilientRouter: LiteLLM's Router with the engine's retries, breakers, fallbacks and deadlines.

The plugin owns every retry, fallback and cooldown decision; the wrapped ``litellm.Router`` makes
exactly one attempt per call (``num_retries=0``, no fallbacks, cooldowns off) on a deployment that
LiteLLM's own routing strategy picks among the ones the engine admits. This module is the facade:
construction, introspection, per-call options, the idempotency store; the loop is in ``_engine``.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import os
import uuid
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import litellm

from llm_resilience_plugin._engine.breakers import DeploymentBreaker
from llm_resilience_plugin._engine.clock import Clock, Deadline
from llm_resilience_plugin._engine.core import (
    NO_OPTIONS,
    OPTION_KEYS,
    BeforeRetry,
    CallState,
    positive_seconds,
    split_options,
    validate_request,
)
from llm_resilience_plugin._engine.drivers import SyncRunner, walk_routes
from llm_resilience_plugin._engine.engine import Engine
from llm_resilience_plugin._engine.idempotency import IdempotencyStore, SingleFlight, fingerprint, open_store
from llm_resilience_plugin._engine.retry import RetryBudget
from llm_resilience_plugin._env import allow_loopback
from llm_resilience_plugin._redaction import mask_url, register_secret, safe_metadata, url_has_credentials
from llm_resilience_plugin.errors import ConfigError, LoadShedError, UnknownModelGroupError
from llm_resilience_plugin.events import (
    REPORT_KEY,
    AttemptGuard,
    CallReport,
    CallStarted,
    DeploymentInfo,
    Listener,
    attach_report,
    fill_from_response,
    hidden_params_of,
    usage_of,
)
from llm_resilience_plugin.observability import apply_observability
from llm_resilience_plugin.policy import (
    EffectivePolicy,
    ResiliencePolicy,
    RouterSpec,
    TierPolicy,
    build_spec,
    load_config,
    spec_from_mapping,
)
from llm_resilience_plugin.routing._clients import ClosingSyncRunner
from llm_resilience_plugin.routing._direct import dispatcher_for
from llm_resilience_plugin.routing._dispatch import RouterDispatcher
from llm_resilience_plugin.routing._operations import EndpointsMixin
from llm_resilience_plugin.routing._shared import SharedWiring
from llm_resilience_plugin.routing._streams import ResilientStream, StaticStream, SyncResilientStream

# Call ids: a random per-process prefix and a counter (uuid4 costs an urandom syscall per call).
_CALL_PREFIX = f"{uuid.uuid4().hex[:8]}-"
_CALL_IDS = itertools.count(1)


def _deployment_info(d: Mapping[str, Any]) -> DeploymentInfo:
    """What the plugin keeps of one of LiteLLM's deployment dicts: no key, secret or token, and
    no credentials in URLs (the keys are registered for scrubbing from every record)."""
    lp = d["litellm_params"]
    for name, value in lp.items():
        if isinstance(value, str) and (
            "key" in name or "secret" in name or "token" in name.replace("per_token", "")
        ):
            register_secret(
                os.environ.get(value[len("os.environ/") :]) if value.startswith("os.environ/") else value
            )
    params = {**(d.get("model_info") or {}), **lp}
    return DeploymentInfo(
        id=str((d.get("model_info") or {}).get("id")),
        model_group=d["model_name"],
        model=lp["model"],
        api_base=mask_url(lp.get("api_base")),
        params={
            k: (mask_url(v) if isinstance(v, str) else v)
            for k, v in params.items()
            if "key" not in k and "secret" not in k and "token" not in k.replace("per_token", "")
        },
    )


def _with_readable_ids(model_list: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of ``model_list`` where a deployment without ``model_info.id`` gets a readable one,
    ``group/model@host`` (``#2``, ``#3`` on repeats), instead of LiteLLM's 64-character hash - the
    name reports, logs and breakers show."""
    out = copy.deepcopy(model_list)
    taken = {str((d.get("model_info") or {}).get("id")) for d in out if (d.get("model_info") or {}).get("id")}
    for d in out:
        info = d.get("model_info")
        if info is None:
            info = d["model_info"] = {}
        if not isinstance(info, dict) or info.get("id"):
            continue
        lp = d.get("litellm_params") or {}
        host = urlsplit(str(lp.get("api_base") or "")).hostname
        port = urlsplit(str(lp.get("api_base") or "")).port if host else None
        base = f"{d.get('model_name')}/{lp.get('model')}" + (
            f"@{host}" + (f":{port}" if port else "") if host else ""
        )
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}#{n}"
        taken.add(name)
        info["id"] = name
    return out


def _refuse_url_credentials(model_list: list[dict[str, Any]]) -> None:
    """Credentials in ``api_base`` next to an ``api_key`` make the HTTP client refuse every request
    (it cannot send both): say so at construction, naming the deployment."""
    for i, d in enumerate(model_list):
        lp = d.get("litellm_params") or {}
        if url_has_credentials(lp.get("api_base")) and lp.get("api_key"):
            raise ConfigError(
                f"model_list[{i}].litellm_params.api_base",
                "has credentials before the host and the deployment also has an api_key; the HTTP "
                "client refuses to send both: remove the user:password@ part",
            )


def _release(sync: SyncRunner) -> None:
    sync.close()


class ResilientRouter(EndpointsMixin):
    """LiteLLM's Router with tenacity retries, per-deployment breakers, fallbacks and deadlines.

    Chat (``acompletion``) and, from :class:`EndpointsMixin`, ``aembedding``,
    ``atext_completion``, ``aimage_generation`` and ``aresponses`` with their blocking twins.

    Build it from the same arguments as ``litellm.Router`` (``model_list``, ``fallbacks``,
    ``routing_strategy``, ...) plus ``policy``; or :meth:`from_config` a LiteLLM proxy YAML.
    """

    def __init__(
        self,
        model_list: list[dict[str, Any]],
        *,
        policy: ResiliencePolicy | Mapping[str, Any] | None = None,
        fallbacks: Any = None,
        context_window_fallbacks: Any = None,
        content_policy_fallbacks: Any = None,
        default_fallbacks: Any = None,
        router_settings: Mapping[str, Any] | None = None,
        clock: Clock | None = None,
        seed: int | None = None,
        guards: list[AttemptGuard] | None = None,
        idempotency_store: str | IdempotencyStore | None = None,
        idempotency_ttl: float = 600.0,
        shared_state: Any = None,
        **litellm_router_kwargs: Any,
    ) -> None:
        spec = build_spec(
            model_list,
            router_settings={**litellm_router_kwargs, **(router_settings or {})},
            policy=policy,
            fallbacks=fallbacks,
            context_window_fallbacks=context_window_fallbacks,
            content_policy_fallbacks=content_policy_fallbacks,
            default_fallbacks=default_fallbacks,
        )
        self._init_from_spec(spec, clock=clock, seed=seed, guards=guards, shared_state=shared_state)
        self.set_idempotency_store(idempotency_store, ttl=idempotency_ttl)

    def set_idempotency_store(self, store: str | IdempotencyStore | None, *, ttl: float = 600.0) -> None:
        """Return stored results for repeated idempotency keys within ``ttl`` seconds.

        ``"memory"``, ``"sqlite:///path.db"``, any object with ``get``/``put``, or None (off).
        """
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or ttl <= 0:
            raise ConfigError("idempotency_ttl", "must be a positive number of seconds")
        self._idem_store = open_store(store)
        self._idem_ttl = float(ttl)

    @classmethod
    def from_spec(
        cls,
        spec: RouterSpec,
        *,
        clock: Clock | None = None,
        seed: int | None = None,
        guards: list[AttemptGuard] | None = None,
        shared_state: Any = None,
    ) -> ResilientRouter:
        """A router from a validated :class:`RouterSpec`; its ``cost:`` section, if any, becomes
        a :class:`~llm_resilience_plugin.cost.CostGuard` appended to ``guards``."""
        if spec.cost is not None:
            from llm_resilience_plugin.cost import cost_guard_from_config

            guards = [*(guards or []), cost_guard_from_config(spec.cost)]
        self = cls.__new__(cls)
        self._init_from_spec(spec, clock=clock, seed=seed, guards=guards, shared_state=shared_state)
        return self

    @classmethod
    def from_config(
        cls,
        config: str | Path | Mapping[str, Any],
        *,
        clock: Clock | None = None,
        seed: int | None = None,
        guards: list[AttemptGuard] | None = None,
        shared_state: Any = None,
    ) -> ResilientRouter:
        """From a LiteLLM proxy-style YAML path (or its parsed mapping) with a ``resilience:``
        section; a ``cost:`` section attaches a CostGuard (find it in ``router.guards``)."""
        spec = spec_from_mapping(config) if isinstance(config, Mapping) else load_config(config)
        return cls.from_spec(spec, clock=clock, seed=seed, guards=guards, shared_state=shared_state)

    def _init_from_spec(
        self,
        spec: RouterSpec,
        *,
        clock: Clock | None,
        seed: int | None,
        guards: list[AttemptGuard] | None = None,
        shared_state: Any = None,
    ) -> None:
        """``shared_state``: None (use ``router_settings.redis_url`` if set), a redis:// URL, a
        ``RedisSharedState``, or False (local state even with a redis_url)."""
        allow_loopback()
        self.spec = spec
        self.policy = spec.policy
        _refuse_url_credentials(spec.model_list)
        self._router = litellm.Router(
            model_list=_with_readable_ids(spec.model_list),
            **spec.router_settings,
            num_retries=0,
            disable_cooldowns=True,
            fallbacks=[],
            context_window_fallbacks=[],
            content_policy_fallbacks=[],
            default_fallbacks=None,
            retry_after=0,
        )
        deployments = {info.id: info for info in map(_deployment_info, self._router.registry().all())}
        # Shared state on Redis (docs/scaling-out.md): breakers and retry budgets fleet-wide.
        wiring = SharedWiring.for_router(spec, deployments, shared_state)
        self.shared_state: Any = wiring.shared
        shared_members = wiring.members
        self.engine = engine = Engine(
            spec,
            deployments,
            clock=clock or Clock(),
            seed=seed,
            guards=list(guards or []),
            backend_for=wiring.backend_for if wiring.shared is not None else None,
            bucket_for=wiring.bucket_for if wiring.shared is not None else None,
            shared_breakers=wiring.wanted,
        )
        # Direct dispatch where it is proven equivalent to the Router for this config (policy
        # ``dispatch``); the Router's dispatcher serves every other group and operation.
        via_router = RouterDispatcher(self._router, engine)
        engine.dispatcher, self._dispatch_plan = dispatcher_for(
            self._router, engine, via_router, spec.router_settings, spec.policy.dispatch
        )
        self.guards = engine.guards
        self.events = engine.events
        if self.shared_state is not None:
            self.shared_state.prime(shared_members)
        for guard in self.guards:  # e.g. a CostGuard prices every deployment now (ConfigError)
            bind = getattr(guard, "bind_router", None)
            if callable(bind):
                bind(self)
        self._idem_store = None
        self._idem_ttl = 600.0
        self._single_flight = SingleFlight()
        self._sync = ClosingSyncRunner()  # closes LiteLLM's clients of its loop too
        release: Callable[..., None] = _release
        release_args: tuple[Any, ...] = (self._sync,)
        if self.shared_state is not None:  # closing also stops syncing this router's keys
            release, release_args = self.shared_state.release_router, (_release, self._sync, shared_members)
        self._finalizer = weakref.finalize(self, release, *release_args)
        # The policy's `observability:` section (auto: on when installed); close() detaches it.
        try:
            self._detach_observability = apply_observability(self, self.policy.observability)
        except ConfigError:
            self._finalizer()
            raise

    # -- introspection ---------------------------------------------------------------------------

    @property
    def clock(self) -> Clock:
        """The clock every decision of this router reads."""
        return self.engine.clock

    @property
    def litellm_router(self) -> litellm.Router:
        """The wrapped ``litellm.Router`` (its retries, fallbacks and cooldowns are off)."""
        return self._router

    @property
    def model_groups(self) -> list[str]:
        """The model groups this router serves."""
        return list(self.engine.group_deployments)

    def deployments(self, group: str | None = None) -> list[DeploymentInfo]:
        """What the router knows of each deployment (of ``group``), never its API key."""
        engine = self.engine
        if group is None:
            return list(engine.deployments.values())
        return [engine.deployments[i] for i in engine.group_deployments.get(group, [])]

    def dispatch_plan(self) -> dict[str, dict[str, str]]:
        """Per model group, the dispatcher its attempts use (``direct`` or ``router``) and why."""
        return {g: {"dispatcher": p.dispatcher, "reason": p.reason} for g, p in self._dispatch_plan.items()}

    def breakers(self) -> dict[str, dict[str, Any]]:
        """State per deployment id: state, fail_counter, generation, probes in flight, retry_at."""
        return self.engine.breakers.snapshot()

    def breaker(self, deployment_id: str) -> DeploymentBreaker:
        """The circuit breaker of one deployment."""
        return self.engine.breakers[deployment_id]

    def retry_budget(self, group: str) -> RetryBudget:
        """The retry budget of one model group."""
        return self.engine.budgets[group]

    def effective_policy(self, group: str) -> EffectivePolicy:
        """The policy in force for ``group`` (global settings merged with its overrides)."""
        self._check_group(group)
        return self.engine.policies[group]

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Receive every event (attempts, retries, fallbacks, breaker transitions, calls)."""
        return self.events.subscribe(listener)

    def _check_group(self, group: str) -> None:
        if not isinstance(group, str):
            raise UnknownModelGroupError(repr(group), self.model_groups)
        if group not in self.engine.group_deployments:
            raise UnknownModelGroupError(group, self.model_groups)

    # -- public calls ----------------------------------------------------------------------------

    async def acompletion(
        self,
        model: str,
        messages: list[dict[str, Any]],
        *,
        stream: bool = False,
        deadline: float | None = None,
        listener: Listener | None = None,
        before_retry: BeforeRetry | None = None,
        **kwargs: Any,
    ) -> Any:
        """Like ``litellm.Router.acompletion``; streams return a :class:`ResilientStream`.

        Plugin options (all optional, taken out before LiteLLM sees the call): ``deadline``
        (seconds for the whole call), ``attempt_timeout`` (or LiteLLM's ``timeout``),
        ``first_chunk_timeout``, ``stream_idle_timeout``, ``idempotency_key`` (default: a content
        fingerprint), ``idempotent`` (False forbids hedging), ``priority`` (a tier name),
        ``scenario`` (key of a configured static answer), ``listener`` (this call's events) and
        ``before_retry`` (awaited before each retry sleep).
        """
        ctx, kwargs = self._new_call(model, messages, stream, deadline, listener, before_retry, kwargs)
        if stream:
            return await self._stream(ctx, model, messages, kwargs)
        if self._idem_store is None:  # one coroutine layer fewer on the common path
            return await walk_routes(self.engine, ctx, model, messages, kwargs)
        return await self._complete(ctx, model, messages, kwargs)

    def completion(
        self,
        model: str,
        messages: list[dict[str, Any]],
        *,
        stream: bool = False,
        deadline: float | None = None,
        listener: Listener | None = None,
        before_retry: BeforeRetry | None = None,
        **kwargs: Any,
    ) -> Any:
        """Blocking twin of :meth:`acompletion`, safe from any thread (the same async loop runs on
        a private event-loop thread; ``before_retry`` is awaited there)."""
        ctx, kwargs = self._new_call(model, messages, stream, deadline, listener, before_retry, kwargs)
        if stream:
            astream = self._sync.run(self._stream(ctx, model, messages, kwargs))
            return SyncResilientStream(astream, self._sync)
        return self._sync.run(self._complete(ctx, model, messages, kwargs))

    def close(self) -> None:
        """Release the private loop used by sync calls and, with the last router, LiteLLM's hook."""
        self._detach_observability()
        self._finalizer()

    # -- one call --------------------------------------------------------------------------------

    def _new_call(
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
        if type(model) is not str or model not in self.engine.group_deployments:
            self._check_group(model)
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
        elif self._idem_store is not None:
            report.idempotency_key = fingerprint(keyed, messages, clean)
        else:  # hashed only if read (a list is copied: appending to it later changes nothing)
            snapshot = list(messages) if isinstance(messages, list) else messages
            report.key_from(fingerprint, (keyed, snapshot, clean))
        budget_s = (
            deadline
            or (tier.deadline if tier and tier.deadline else None)
            or self.engine.policies[model].deadline
        )
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
        if self.events.active:  # for observers (logs, metrics); a call's own listener sees attempts on
            self.events.emit(_started(ctx, messages, clean))
        return ctx, clean

    def _shed_check(self, group: str, name: str, tier: TierPolicy, kwargs: Mapping[str, Any]) -> None:
        """Refuse a low tier while the group's retry budget (or a guard's budget) runs low."""
        budget = self.engine.budgets[group]
        if budget.policy.enabled and budget.fraction < tier.shed_below:
            raise LoadShedError(name, f"retry budget of {group!r}", budget.fraction, tier.shed_below)
        metadata = kwargs.get("metadata") or {}
        for guard in self.guards:
            headroom = getattr(guard, "headroom", None)
            fraction = headroom(metadata) if callable(headroom) else None
            if fraction is not None and fraction < tier.shed_below:
                raise LoadShedError(name, type(guard).__name__, fraction, tier.shed_below)

    async def _complete(
        self, ctx: CallState, group: str, messages: list[dict[str, Any]], kwargs: dict[str, Any]
    ) -> Any:
        """A non-stream call, with the idempotency store and single-flight when configured."""
        store = self._idem_store
        if store is None:
            return await walk_routes(self.engine, ctx, group, messages, kwargs)
        key = ctx.report.idempotency_key
        assert key is not None  # set in _new_call whenever a store is configured
        stored = store.get(key)
        if stored is not None:
            return self._replay(ctx, stored)
        leader = self._single_flight.join(key)
        if leader is not None:
            shared = await asyncio.shield(leader)
            if shared is not None:
                return self._replay(ctx, shared)
        fut = self._single_flight.lead(key)
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
            }
            if not r.degraded:
                store.put(key, entry, self._idem_ttl)
            return resp
        finally:
            self._single_flight.done(key)
            fut.set_result(entry)  # followers replay it, or (None) make their own call

    def _replay(self, ctx: CallState, entry: Mapping[str, Any]) -> Any:
        resp = response_type(entry.get("operation", "completion"))(**entry["response"])
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

    async def _stream(
        self, ctx: CallState, group: str, messages: list[dict[str, Any]], kwargs: dict[str, Any]
    ) -> ResilientStream | StaticStream:
        result = await walk_routes(self.engine, ctx, group, messages, kwargs)
        assert isinstance(result, ResilientStream | StaticStream)
        return result


def response_type(operation: str) -> Any:
    """LiteLLM's response class of an operation (a stored answer is replayed as one)."""
    from litellm.types.llms.openai import ResponsesAPIResponse

    return {
        "embedding": litellm.EmbeddingResponse,
        "text_completion": litellm.TextCompletionResponse,
        "image_generation": litellm.ImageResponse,
        "responses": ResponsesAPIResponse,
    }.get(operation, litellm.ModelResponse)


def get_report(obj: Any) -> CallReport | None:
    """The :class:`CallReport` of a response, a stream, or an error raised by the router."""
    if isinstance(obj, ResilientStream | SyncResilientStream | StaticStream):
        return obj.report
    hidden = hidden_params_of(obj)
    if hidden is not None and REPORT_KEY in hidden:
        return hidden[REPORT_KEY]  # type: ignore[no-any-return]
    rep = getattr(obj, REPORT_KEY, None) or getattr(obj, "report", None)
    return rep if isinstance(rep, CallReport) else None


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
