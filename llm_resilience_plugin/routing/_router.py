"""ResilientRouter: one attempt loop over LiteLLM's Router.

The plugin owns every retry, fallback and cooldown decision; the wrapped ``litellm.Router`` makes
exactly one attempt per call (``num_retries=0``, no fallbacks, cooldowns off) on a deployment that
LiteLLM's own routing strategy picks among the ones this plugin admits (a deployment filter).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import functools
import itertools
import math
import random
import threading
import uuid
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import litellm
import tenacity
from litellm.integrations.custom_logger import CustomLogger

from llm_resilience_plugin._engine.breakers import Admission, BreakerRegistry, DeploymentBreaker
from llm_resilience_plugin._engine.clock import Clock, Deadline
from llm_resilience_plugin._engine.degradation import (
    apply_level,
    context_limit_from_error,
    prompt_tokens_from_error,
    static_response,
    trim_messages,
)
from llm_resilience_plugin._engine.hedging import HedgeState
from llm_resilience_plugin._engine.idempotency import IdempotencyStore, SingleFlight, fingerprint, open_store
from llm_resilience_plugin._engine.retry import AttemptFailed, GroupRetryState, RetryBudget, build_retrying
from llm_resilience_plugin._engine.taxonomy import classify
from llm_resilience_plugin._engine.watchdog import AttemptWatchdog
from llm_resilience_plugin._env import allow_loopback
from llm_resilience_plugin.errors import (
    AllRoutesFailedError,
    CircuitOpenError,
    ConfigError,
    DeadlineExceededError,
    ErrorClass,
    Failure,
    LoadShedError,
    UnknownModelGroupError,
)
from llm_resilience_plugin.events import (
    AttemptGuard,
    AttemptInfo,
    AttemptRecord,
    BreakerTransition,
    CallReport,
    DeploymentInfo,
    Event,
    EventBus,
    FallbackTaken,
    HedgeSent,
    Listener,
    RetryScheduled,
    hidden_params_of,
    usage_of,
)
from llm_resilience_plugin.policy import (
    EffectivePolicy,
    ResiliencePolicy,
    RouterSpec,
    TierPolicy,
    build_spec,
    load_config,
    spec_from_mapping,
)
from llm_resilience_plugin.routing._streams import (
    ResilientStream,
    StaticStream,
    SyncResilientStream,
    prefetch_stream,
)
from llm_resilience_plugin.routing._streams import discard as _discard

_META_KEY = "_llm_resilience_attempt"
REPORT_KEY = "llm_resilience_report"

BeforeRetry = Callable[[tenacity.RetryCallState], Awaitable[None] | None]


# -- per-attempt context, shared with the process-wide LiteLLM hooks ------------------------------


@dataclass(slots=True)
class _AttemptContext:
    router: ResilientRouter
    call: _CallContext
    group: str
    exclude: frozenset[str] = frozenset()
    admission: Admission | None = None
    generations: dict[str, int] = field(default_factory=dict)
    picked: str | None = None
    sent: bool = False
    guard_tokens: list[tuple[AttemptGuard, Any]] = field(default_factory=list)

    def settle_guards(
        self, response: Any | None, usage: Mapping[str, int] | None, failure: Failure | None
    ) -> None:
        tokens, self.guard_tokens = self.guard_tokens, []
        for guard, token in tokens:
            try:
                guard.after_attempt(
                    token,
                    deployment_id=self.picked,
                    response=response,
                    usage=usage,
                    failure=failure,
                )
            except Exception:
                import logging

                logging.getLogger("llm_resilience").exception("attempt guard failed to settle")

    def select(self, healthy: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Choose which of LiteLLM's candidates may be picked (the deployment filter)."""
        if self.admission is not None:  # LiteLLM asked twice for one attempt: keep the ticket
            kept = [d for d in healthy if _dep_id(d) == self.admission.deployment_id]
            if kept:
                return kept
        breakers = self.router._breakers
        call = self.call
        if not call.failed and not self.exclude and not call.require_prefill and self.router._all_clear():
            # Fast path: every breaker closed, nothing held: LiteLLM's candidates stand as they are.
            if len(healthy) == 1:
                self._pick(_dep_id(healthy[0]))
            return healthy
        now = self.router._clock.wall()
        preferred: list[dict[str, Any]] = []
        fallback: list[dict[str, Any]] = []
        probes: list[tuple[DeploymentBreaker, dict[str, Any]]] = []
        blocked: list[str] = []
        for d in healthy:
            dep = _dep_id(d)
            b = breakers.get(dep)
            if b is None:
                preferred.append(d)
                continue
            if dep in call.never_again or dep in self.exclude:
                blocked.append(dep)
                continue
            if call.require_prefill and not self.router._deployments[dep].supports_prefill:
                blocked.append(dep)
                continue
            state = b.state
            if state != "closed":
                if b.could_admit(now) and dep not in call.failed:
                    probes.append((b, d))
                else:
                    blocked.append(dep)
                continue
            if dep in call.failed or b.held_for(now) > 0:
                fallback.append(d)
            else:
                preferred.append(d)
        # A recovering deployment gets its probe first, so it is tested promptly.
        for b, d in probes:
            adm = b.admit()
            if adm is not None:
                self.admission = adm
                self.picked = b.deployment_id
                return [d]
        pool = preferred or fallback
        if not pool:
            raise CircuitOpenError(self.group, blocked or [_dep_id(d) for d in healthy])
        for d in pool:
            dep = _dep_id(d)
            b = breakers.get(dep)
            if b is not None:
                self.generations[dep] = b.generation
        if len(pool) == 1:
            self._pick(_dep_id(pool[0]))
        return pool

    def learn(self, dep: str | None, epoch: int) -> None:
        """A non-precise attempt's deployment, read back after it ended. Every breaker was closed
        when it started (router epoch ``epoch``), so its ticket is the closed one, unless that
        breaker has changed since: then, like any stale ticket, its outcome counts for nothing."""
        if self.picked is not None or dep is None:  # the pick hook saw it (another attempt's)
            return
        if self.router._changed_at.get(dep, -1) <= epoch:
            self._pick(dep)
        else:
            self.picked = dep

    def _pick(self, dep: str) -> None:
        if self.picked is not None and self.admission is not None:
            return
        self.picked = dep
        gen = self.generations.get(dep)
        if gen is None:
            b = self.router._breakers.get(dep)
            gen = b.generation if b is not None else None
        if gen is not None:
            self.admission = Admission(dep, gen, probe=False)


def _coarse(seconds: float, cap: float) -> float:
    """``seconds`` rounded up to a whole second (a tenth below one second), at most ``cap``."""
    step = 1.0 if seconds >= 1.0 else 0.1
    return min(cap, math.ceil(seconds / step) * step)


def _picked_in(metadata: Mapping[str, Any] | None) -> str | None:
    """The deployment LiteLLM's Router chose, as it records it in the request's metadata."""
    info = (metadata or {}).get("model_info")
    dep = info.get("id") if isinstance(info, Mapping) else None
    return str(dep) if dep is not None else None


def _dep_id(d: Mapping[str, Any]) -> str:
    return str((d.get("model_info") or {}).get("id"))


_ATTEMPTS: dict[str, _AttemptContext] = {}
# Call ids: a random per-process prefix and a counter (uuid4 costs an urandom syscall per call).
_CALL_PREFIX = f"{uuid.uuid4().hex[:8]}-"
_CALL_IDS = itertools.count(1)
_ATTEMPT_IDS = itertools.count()


class _FilterHook(CustomLogger):
    """LiteLLM's deployment filter, registered only while some attempt needs it (a breaker not
    closed, a Retry-After hold, a retry or hedge that prefers another deployment): when every
    breaker is closed, LiteLLM skips its filter stage entirely. Requests that do not come from a
    ResilientRouter pass through untouched."""

    async def async_filter_deployments(  # type: ignore[override]
        self,
        model: str,
        healthy_deployments: list[dict[str, Any]],
        messages: Any,
        request_kwargs: dict[str, Any] | None = None,
        parent_otel_span: Any = None,
    ) -> list[dict[str, Any]]:
        token = ((request_kwargs or {}).get("metadata") or {}).get(_META_KEY)
        ctx = _ATTEMPTS.get(token) if token is not None else None
        if ctx is None:
            return healthy_deployments
        return ctx.select(healthy_deployments)


class _PickHook(CustomLogger):
    """Learns which deployment LiteLLM picked, just before the request is sent."""

    def log_pre_api_call(self, model: Any, messages: Any, kwargs: dict[str, Any]) -> None:
        params = kwargs.get("litellm_params") or {}
        md = params.get("metadata") or {}
        token = md.get(_META_KEY)
        ctx = _ATTEMPTS.get(token) if token is not None else None
        if ctx is None:
            return
        dep = (md.get("model_info") or {}).get("id") or kwargs.get("model_id")
        if dep is not None:
            ctx._pick(str(dep))
        ctx.sent = True


class _Registration:
    """A LiteLLM callback list entry held while its refcount is positive (thread-safe)."""

    _lock = threading.Lock()

    def __init__(self, hook: CustomLogger, callbacks: Callable[[], list[Any]]) -> None:
        self.hook = hook
        self._callbacks = callbacks
        self.users = 0

    def acquire(self) -> None:
        with self._lock:
            self.users += 1
            lst = self._callbacks()
            if not any(cb is self.hook for cb in lst):
                lst.append(self.hook)

    def release(self) -> None:
        with self._lock:
            self.users = max(0, self.users - 1)
            if self.users == 0:
                lst = self._callbacks()
                while any(cb is self.hook for cb in lst):
                    lst.remove(self.hook)


# Both hooks are held only by attempts that need them (a breaker not closed, a hold, a retry or
# hedge, a guard): with them registered LiteLLM does measurably more work per request, for every
# Router in the process.
_PICK = _Registration(_PickHook(), lambda: litellm.input_callback)
_FILTER = _Registration(_FilterHook(), lambda: litellm.callbacks)


def _release(sync: _SyncRunner) -> None:
    sync.close()


# -- per-call context -----------------------------------------------------------------------------


_OPTION_KEYS = frozenset(
    {
        "attempt_timeout",
        "first_chunk_timeout",
        "stream_idle_timeout",
        "idempotency_key",
        "idempotent",
        "priority",
        "scenario",
    }
)


@dataclass(frozen=True, slots=True)
class _CallOptions:
    """Per-call overrides, taken out of the LiteLLM kwargs before anything is sent."""

    key: str | None = None
    idempotent: bool = True
    attempt_timeout: float | None = None
    first_chunk_timeout: float | None = None
    stream_idle_timeout: float | None = None
    priority: str | None = None
    scenario: str | None = None


_NO_OPTIONS = _CallOptions()


def _positive(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(name, "must be a positive number of seconds")
    return float(value)


class _Served(NamedTuple):
    response: Any
    usage: dict[str, int] | None
    deployment_id: str | None


@dataclass(slots=True)
class _CallContext:
    call_id: str
    report: CallReport
    deadline: Deadline
    stream: bool
    listener: Listener | None
    before_retry: BeforeRetry | None
    failed: set[str] = field(default_factory=set)
    never_again: set[str] = field(default_factory=set)
    attempt_no: int = 0
    next_wait: float = 0.0
    failures: list[Failure] = field(default_factory=list)
    opts: _CallOptions = field(default_factory=lambda: _NO_OPTIONS)
    tier: TierPolicy | None = None
    require_prefill: bool = False
    out_of_time: bool = False  # a retry or fallback was given up because it would not fit
    served: _Served | None = None  # the last answer, as its attempt read it


class _SyncRunner:
    """A private event loop on a daemon thread, so sync calls run the same async attempt loop."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                t = threading.Thread(target=loop.run_forever, name="llm-resilience-sync", daemon=True)
                t.start()
                self._loop = loop
            return self._loop

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        fut: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop())
        try:
            return fut.result()
        except BaseException:
            fut.cancel()
            raise

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)


class ResilientRouter:
    """LiteLLM's Router with tenacity retries, per-deployment breakers, fallbacks and deadlines.

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
        """From a LiteLLM proxy-style YAML path (or its parsed mapping) with a ``resilience:`` section."""
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
        ``redis_state.RedisSharedState``, or False (local state even with a redis_url)."""
        allow_loopback()
        self.spec = spec
        self.policy = spec.policy
        self._clock = clock or Clock()
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self.events = EventBus()
        self.guards: list[AttemptGuard] = list(guards or [])
        self._router = litellm.Router(
            model_list=copy.deepcopy(spec.model_list),
            **spec.router_settings,
            num_retries=0,
            disable_cooldowns=True,
            fallbacks=[],
            context_window_fallbacks=[],
            content_policy_fallbacks=[],
            default_fallbacks=None,
            retry_after=0,
        )
        self._deployments: dict[str, DeploymentInfo] = {}
        self._group_deployments: dict[str, list[str]] = {}
        for d in self._router.registry().all():
            info = DeploymentInfo(
                id=_dep_id(d),
                model_group=d["model_name"],
                model=d["litellm_params"]["model"],
                api_base=d["litellm_params"].get("api_base"),
                params={
                    k: v
                    for k, v in {
                        **(d.get("model_info") or {}),
                        **d["litellm_params"],
                    }.items()
                    if "key" not in k and "secret" not in k and "token" not in k.replace("per_token", "")
                },
            )
            self._deployments[info.id] = info
            self._group_deployments.setdefault(info.model_group, []).append(info.id)
        self._not_closed: set[str] = set()
        self._hold_until = 0.0
        # Shared (multi-process) breaker state can change without a local transition event.
        self._shared_breakers = False
        # Shared state on Redis (docs/scaling-out.md): breakers and retry budgets fleet-wide.
        self.shared_state: Any = None
        shared_members: list[Any] = []
        wants_shared = shared_state is not None and shared_state is not False
        if shared_state is None and spec.policy.shared_state.enabled:
            rs = spec.router_settings
            wants_shared = bool(rs.get("redis_url") or rs.get("redis_host"))
        if wants_shared:
            try:
                from llm_resilience_plugin.shared_state import _redis as redis_state
            except ImportError as e:
                raise ConfigError(
                    "router_settings.redis_url",
                    f"shared state needs redis-py: pip install 'llm-resilience-plugin[redis]' ({e})",
                ) from None
            self.shared_state = redis_state.attach_router(spec, shared_state)
            self._shared_breakers = True
            router_key = spec.policy.shared_state.router_name or redis_state.router_key(
                spec.model_list, [(i.model_group, i.id) for i in self._deployments.values()]
            )
        self._epochs = itertools.count(1)
        self._epoch = 0  # the last breaker transition's number; _changed_at: per deployment
        self._changed_at: dict[str, int] = {}
        self._breakers = BreakerRegistry()
        for info in self._deployments.values():
            eff = self.policy.for_group(info.model_group)
            backend = None
            if self.shared_state is not None:
                lease = spec.policy.shared_state.probe_lease or eff.deadline
                backend = self.shared_state.breaker_backend(router_key, info.id, eff.breaker, lease=lease)
                shared_members.append(backend)
            self._breakers.add(
                DeploymentBreaker(
                    info.id,
                    info.model_group,
                    eff.breaker,
                    clock=self._clock.wall,
                    on_transition=self._on_transition,
                    backend=backend,
                )
            )
        self._budgets = {}
        for g in self._group_deployments:
            rb = self.policy.for_group(g).retry_budget
            bucket = None
            if self.shared_state is not None:
                bucket = self.shared_state.token_bucket(router_key, g, rb.capacity)
                shared_members.append(bucket)
            self._budgets[g] = RetryBudget(rb, shared=bucket)
        if self.shared_state is not None:
            self.shared_state.prime(shared_members)
        self._policies = {g: self.policy.for_group(g) for g in self._group_deployments}
        for guard in self.guards:  # e.g. a CostGuard prices every deployment now (ConfigError)
            bind = getattr(guard, "bind_router", None)
            if callable(bind):
                bind(self)
        self._hedges = {
            g: HedgeState(p.hedge)
            for g, p in self._policies.items()
            if p.hedge is not None and p.hedge.enabled
        }
        self._timeouts: dict[tuple[float, float], httpx.Timeout] = {}
        self._idem_store = None
        self._idem_ttl = 600.0
        self._single_flight = SingleFlight()
        self._sync = _SyncRunner()
        release: Callable[..., None] = _release
        release_args: tuple[Any, ...] = (self._sync,)
        if self.shared_state is not None:  # closing also stops syncing this router's keys
            release, release_args = self.shared_state.release_router, (_release, self._sync, shared_members)
        self._finalizer = weakref.finalize(self, release, *release_args)

    def _on_transition(self, event: BreakerTransition) -> None:
        epoch = next(self._epochs)  # stamped before _not_closed changes: see _attempt
        self._changed_at[event.deployment_id] = epoch
        self._epoch = epoch
        if event.new_state == "closed":
            self._not_closed.discard(event.deployment_id)
        else:
            self._not_closed.add(event.deployment_id)
        self.events.emit(event)

    def _all_clear(self) -> bool:
        """Every breaker closed and no Retry-After hold pending (the filter's fast path)."""
        hold = self._hold_until  # 0.0 until some Retry-After was honoured
        return not self._not_closed and not self._shared_breakers and (not hold or self._clock.wall() >= hold)

    # -- introspection ---------------------------------------------------------------------------

    @property
    def litellm_router(self) -> litellm.Router:
        """The wrapped ``litellm.Router`` (its retries, fallbacks and cooldowns are off)."""
        return self._router

    @property
    def model_groups(self) -> list[str]:
        return list(self._group_deployments)

    def deployments(self, group: str | None = None) -> list[DeploymentInfo]:
        if group is None:
            return list(self._deployments.values())
        return [self._deployments[i] for i in self._group_deployments.get(group, [])]

    def breakers(self) -> dict[str, dict[str, Any]]:
        """State per deployment id: state, fail_counter, generation, probes in flight, retry_at."""
        return self._breakers.snapshot()

    def breaker(self, deployment_id: str) -> DeploymentBreaker:
        return self._breakers[deployment_id]

    def retry_budget(self, group: str) -> RetryBudget:
        return self._budgets[group]

    def effective_policy(self, group: str) -> EffectivePolicy:
        self._check_group(group)
        return self._policies[group]

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Receive every event (attempts, retries, fallbacks, breaker transitions, calls)."""
        return self.events.subscribe(listener)

    def _check_group(self, group: str) -> None:
        if not isinstance(group, str):
            raise UnknownModelGroupError(repr(group), self.model_groups)
        if group not in self._group_deployments:
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
            return await self._walk_routes(ctx, model, messages, kwargs)
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
        self._finalizer()

    # -- the loop --------------------------------------------------------------------------------

    def _new_call(
        self,
        model: str,
        messages: Any,
        stream: bool,
        deadline: float | None,
        listener: Listener | None,
        before_retry: BeforeRetry | None,
        kwargs: Mapping[str, Any],
    ) -> tuple[_CallContext, dict[str, Any]]:
        """Validate the call (nothing is sent on bad input) and split plugin options from kwargs."""
        self._check_group(model)
        if not isinstance(messages, list) or not messages:
            raise ConfigError("messages", "expected a non-empty list of chat messages")
        if deadline is not None:
            deadline = _positive("deadline", deadline)
        if kwargs and (not _OPTION_KEYS.isdisjoint(kwargs) or "timeout" in kwargs):
            opts, clean = self._options(kwargs)
        else:  # the common case: LiteLLM's own arguments only
            opts, clean = _NO_OPTIONS, dict(kwargs)
        priority = opts.priority if opts.priority is not None else self.policy.default_tier
        tier = None
        if priority is not None:
            tier = self.policy.tiers.get(priority)
            if tier is None:
                raise ConfigError(
                    "priority", f"unknown tier {priority!r}; configured tiers: {sorted(self.policy.tiers)}"
                )
            if tier.shed_below > 0:
                self._shed_check(model, priority, tier, clean)
        call_id = f"{_CALL_PREFIX}{next(_CALL_IDS):x}"
        report = CallReport(call_id, model, stream, self._clock.wall(), priority=priority)
        if opts.key is not None:
            report.idempotency_key = opts.key
        elif self._idem_store is not None:
            report.idempotency_key = fingerprint(model, messages, clean)
        else:  # hashed only if read (the list is copied: appending to it later changes nothing)
            report._key_source = functools.partial(fingerprint, model, list(messages), clean)
        budget_s = (
            deadline or (tier.deadline if tier and tier.deadline else None) or self._policies[model].deadline
        )
        ctx = _CallContext(
            call_id=call_id,
            report=report,
            deadline=Deadline.after(self._clock, budget_s),
            stream=stream,
            listener=listener,
            before_retry=before_retry,
            opts=opts,
            tier=tier,
        )
        return ctx, clean

    @staticmethod
    def _options(kwargs: Mapping[str, Any]) -> tuple[_CallOptions, dict[str, Any]]:
        """Validate the plugin's per-call options and take them out of LiteLLM's kwargs."""
        clean = {k: v for k, v in kwargs.items() if k not in _OPTION_KEYS}
        timeout = clean.pop("timeout", None)
        attempt_timeout = _positive("attempt_timeout", kwargs.get("attempt_timeout"))
        if attempt_timeout is None and isinstance(timeout, int | float) and not isinstance(timeout, bool):
            attempt_timeout = _positive("timeout", timeout)
        key = kwargs.get("idempotency_key")
        if key is not None and (not isinstance(key, str) or not key):
            raise ConfigError("idempotency_key", "must be a non-empty string")
        priority = kwargs.get("priority")
        if priority is not None and not isinstance(priority, str):
            raise ConfigError("priority", "must be a string naming a configured tier")
        scenario = kwargs.get("scenario")
        if scenario is not None and not isinstance(scenario, str):
            raise ConfigError("scenario", "must be a string naming a configured static answer")
        opts = _CallOptions(
            key=key,
            idempotent=bool(kwargs.get("idempotent", True)),
            attempt_timeout=attempt_timeout,
            first_chunk_timeout=_positive("first_chunk_timeout", kwargs.get("first_chunk_timeout")),
            stream_idle_timeout=_positive("stream_idle_timeout", kwargs.get("stream_idle_timeout")),
            priority=priority,
            scenario=scenario,
        )
        return opts, clean

    def _shed_check(self, group: str, name: str, tier: TierPolicy, kwargs: Mapping[str, Any]) -> None:
        """Refuse a low tier while the group's retry budget (or a guard's budget) runs low."""
        budget = self._budgets[group]
        if budget.policy.enabled and budget.fraction < tier.shed_below:
            raise LoadShedError(name, f"retry budget of {group!r}", budget.fraction, tier.shed_below)
        metadata = kwargs.get("metadata") or {}
        for guard in self.guards:
            headroom = getattr(guard, "headroom", None)
            fraction = headroom(metadata) if callable(headroom) else None
            if fraction is not None and fraction < tier.shed_below:
                raise LoadShedError(name, type(guard).__name__, fraction, tier.shed_below)

    async def _complete(
        self, ctx: _CallContext, group: str, messages: list[dict[str, Any]], kwargs: dict[str, Any]
    ) -> Any:
        """A non-stream call, with the idempotency store and single-flight when configured."""
        store = self._idem_store
        if store is None:
            return await self._walk_routes(ctx, group, messages, kwargs)
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
            resp = await self._walk_routes(ctx, group, messages, kwargs)
            r = ctx.report
            entry = {
                "response": resp.model_dump(),
                "served_group": r.served_group,
                "deployment_id": r.deployment_id,
                "call_id": r.call_id,
                "stored_at": self._clock.wall(),
            }
            if not r.degraded:
                store.put(key, entry, self._idem_ttl)
            return resp
        finally:
            self._single_flight.done(key)
            fut.set_result(entry)  # followers replay it, or (None) make their own call

    def _replay(self, ctx: _CallContext, entry: Mapping[str, Any]) -> Any:
        resp = litellm.ModelResponse(**entry["response"])
        r = ctx.report
        r.replayed = True
        r.outcome = "success"
        r.served_group = entry.get("served_group")
        r.deployment_id = entry.get("deployment_id")
        _fill_from_response(r, resp, usage_of(resp))
        r.response_cost = 0.0  # nothing was paid for this answer
        r.total_latency_s = self._clock.wall() - r.started_at
        _attach_report(resp, r)
        self._emit(ctx, r)
        return resp

    def _emit(self, ctx: _CallContext, event: Event) -> None:
        self.events.emit(event)
        if ctx.listener is not None:
            try:
                ctx.listener(event)
            except Exception:  # a listener never breaks a call
                import logging

                logging.getLogger("llm_resilience").exception("call listener failed")

    async def _walk_routes(
        self, ctx: _CallContext, requested: str, messages: list[dict[str, Any]], kwargs: dict[str, Any]
    ) -> Any:
        degradation = self._policies[requested].degradation
        group, level, tried = requested, 0, [requested]
        call_messages, call_kwargs, trimmed = messages, kwargs, False
        while True:
            try:
                # The first attempt runs before tenacity is built: most calls succeed at once and
                # never pay for a retry loop. A failure is handed to tenacity as its attempt 1.
                ctx.next_wait = 0.0
                ctx.out_of_time = False
                hedge = self._hedge_for(ctx, group)
                try:
                    if hedge is None:
                        result = await self._attempt(ctx, group, level, call_messages, call_kwargs)
                    else:
                        result = await self._hedged_attempt(
                            ctx, group, level, call_messages, call_kwargs, hedge
                        )
                except AttemptFailed as first:
                    result = await self._retry_group(
                        ctx, group, level, call_messages, call_kwargs, hedge, first
                    )
            except AttemptFailed as af:
                failure = af.failure
                nxt = self._next_route(ctx, requested, failure, tried, level)
                if (
                    nxt is None
                    and not trimmed
                    and failure.error_class is ErrorClass.CONTEXT_WINDOW
                    and degradation.trim_context_on_overflow
                ):
                    smaller = self._trimmed(group, call_messages, call_kwargs, failure, degradation)
                    if smaller is not None:
                        trimmed = True
                        ctx.report.degraded.append(
                            f"context trimmed: {len(call_messages)} -> {len(smaller)} messages"
                        )
                        call_messages = smaller
                        continue
                if nxt is None:
                    static = self._static_answer(ctx, requested, failure, call_messages)
                    if static is not None:
                        self._finish(ctx, static, None, group=None, level=level)
                        return static
                    self._finish(ctx, None, failure)
                    err = self._final_error(ctx)
                    raise err from err.__cause__
                self._emit(ctx, FallbackTaken(ctx.call_id, group, nxt, level + 1, failure.error_class))
                tried.append(nxt)
                group = nxt
                level += 1
                call_kwargs = self._degrade_for_level(ctx, degradation.levels.get(level), kwargs, level)
                continue
            self._finish(ctx, result, None, group=group, level=level)
            return result

    def _trimmed(
        self,
        group: str,
        messages: list[dict[str, Any]],
        kwargs: Mapping[str, Any],
        failure: Failure,
        degradation: Any,
    ) -> list[dict[str, Any]] | None:
        deps = self.deployments(group)
        model = deps[0].model if deps else "gpt-4o-mini"
        limit = context_limit_from_error(failure.message)
        if limit is None:
            try:
                limit = int(litellm.get_model_info(model).get("max_input_tokens") or 0) or None
            except Exception:
                limit = None
        if limit is None:
            return None
        return trim_messages(
            messages,
            limit,
            model=model,
            reserve_output=int(kwargs.get("max_tokens") or 0),
            keep_last=degradation.keep_last_messages,
            provider_count=prompt_tokens_from_error(failure.message),
        )

    def _degrade_for_level(
        self, ctx: _CallContext, level_policy: Any, kwargs: dict[str, Any], level: int
    ) -> dict[str, Any]:
        out, changes = apply_level(kwargs, level_policy)
        if level_policy is not None and level_policy.deadline is not None:
            capped = self._clock.monotonic() + level_policy.deadline
            if capped < ctx.deadline.expires_at:
                ctx.deadline.expires_at = capped
                changes.append(f"deadline={level_policy.deadline}s")
        if changes:
            ctx.report.degraded.append(f"fallback level {level}: " + ", ".join(changes))
        return out

    def _static_answer(
        self, ctx: _CallContext, requested: str, failure: Failure, messages: list[dict[str, Any]]
    ) -> Any | None:
        scenario = ctx.opts.scenario
        if scenario is None or failure.error_class in (ErrorClass.BAD_REQUEST, ErrorClass.UNKNOWN):
            return None
        text = self._policies[requested].degradation.static_answers.get(scenario)
        if text is None:
            return None
        ctx.report.degraded.append(f"static answer: {scenario}")
        resp = static_response(text, requested, scenario, messages)
        if ctx.stream:
            return StaticStream(resp, ctx.report, self, ctx)
        return resp

    def _next_route(
        self, ctx: _CallContext, requested: str, failure: Failure, tried: list[str], level: int = 0
    ) -> str | None:
        action = self._policies[requested].classes[failure.error_class].action
        if action == "fail":
            return None
        if ctx.deadline.remaining() <= self.policy.min_attempt_time:
            return None
        if len(tried) - 1 >= self.policy.max_fallbacks:
            return None
        if ctx.tier is not None and ctx.tier.max_fallback_level is not None:
            if level + 1 > ctx.tier.max_fallback_level:
                return None
        for g in self.spec.fallback_chain(requested, failure.error_class):
            if g not in tried:
                return g
        return None

    def _finish(
        self,
        ctx: _CallContext,
        result: Any,
        failure: Failure | None,
        *,
        group: str | None = None,
        level: int = 0,
    ) -> None:
        r = ctx.report
        r.total_latency_s = self._clock.wall() - r.started_at
        if failure is not None:
            r.outcome = "failure"
            r.error_class = failure.error_class
        else:
            r.outcome = "success"
            r.served_group = group
            r.fallback_level = level
            served = ctx.served
            if served is not None and served.response is result:  # what the attempt read
                r.deployment_id, usage = served.deployment_id, served.usage
            else:  # a static answer, or a stream
                last = next((a for a in reversed(r.attempts) if a.outcome == "success"), None)
                r.deployment_id, usage = (last.deployment_id if last else None), None
            if result is not None and not isinstance(result, ResilientStream):
                _fill_from_response(r, result, usage_of(result) if usage is None else usage)
                _attach_report(result, r)
        if not ctx.stream or failure is not None:
            self._emit(ctx, r)

    def _final_error(self, ctx: _CallContext) -> BaseException:
        """The most informative error: a non-retryable provider error as itself, otherwise one
        error listing every attempt, chained to the first root cause."""
        failures = ctx.failures
        report = ctx.report
        for f in failures:
            if f.error_class in (
                ErrorClass.BAD_REQUEST,
                ErrorClass.CONTEXT_WINDOW,
                ErrorClass.CONTENT_POLICY,
                ErrorClass.BUDGET,
                ErrorClass.UNKNOWN,
            ):
                _attach_report(f.exception, report)
                return f.exception
        root = next((f for f in failures if f.error_class is not ErrorClass.CIRCUIT_OPEN), None)
        root = root or (failures[0] if failures else None)
        n = report.upstream_requests
        out_of_time = ctx.out_of_time or ctx.deadline.remaining() <= self.policy.min_attempt_time
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
        return err

    def _hedge_for(self, ctx: _CallContext, group: str) -> HedgeState | None:
        """The group's hedging state, unless this call may not be hedged."""
        hedge = self._hedges.get(group)
        if hedge is not None and (not ctx.opts.idempotent or (ctx.tier is not None and not ctx.tier.hedge)):
            return None
        return hedge

    async def _retry_group(
        self,
        ctx: _CallContext,
        group: str,
        level: int,
        messages: list[dict[str, Any]],
        kwargs: dict[str, Any],
        hedge: HedgeState | None,
        first_failure: AttemptFailed,
    ) -> Any:
        """Attempts 2..n in ``group``: tenacity decides whether, when and how often."""
        state = GroupRetryState(
            policy=self._policies[group],
            budget=self._budgets[group],
            deadline=ctx.deadline,
            rng=self._rng,
            earliest_free=lambda: self._earliest_free(ctx, group),
            retry_cap=ctx.tier.max_retries if ctx.tier is not None else None,
            has_fallback=self._has_fallback(ctx, group),
        )

        async def before_sleep(rs: tenacity.RetryCallState) -> None:
            exc = rs.outcome.exception() if rs.outcome else None
            sleep_s = rs.upcoming_sleep or 0.0
            ctx.next_wait = sleep_s
            if isinstance(exc, AttemptFailed):
                self._emit(
                    ctx,
                    RetryScheduled(
                        ctx.call_id,
                        group,
                        rs.attempt_number,
                        sleep_s,
                        exc.failure.error_class,
                        exc.deployment_id,
                    ),
                )
            if ctx.before_retry is not None:
                maybe = ctx.before_retry(rs)
                if maybe is not None:
                    await maybe

        first: AttemptFailed | None = first_failure
        retrying = build_retrying(state, self._clock, before_sleep)
        try:
            async for attempt in retrying:
                with attempt:
                    if first is not None:
                        pending, first = first, None
                        raise pending
                    if hedge is None:
                        return await self._attempt(ctx, group, level, messages, kwargs)
                    return await self._hedged_attempt(ctx, group, level, messages, kwargs, hedge)
        except AttemptFailed:
            if state.gave_up_reason is not None and state.gave_up_reason.startswith("no time left"):
                ctx.out_of_time = True
            raise
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    async def _hedged_attempt(
        self,
        ctx: _CallContext,
        group: str,
        level: int,
        messages: list[dict[str, Any]],
        kwargs: dict[str, Any],
        hedge: HedgeState,
    ) -> Any:
        """Race a second request to another deployment if the first is slow; first answer wins,
        the other is cancelled (its breaker counts neither, its reservation is released)."""
        hedge.on_call()
        holder: list[_AttemptContext] = []
        first: asyncio.Future[Any] = asyncio.ensure_future(
            self._attempt(ctx, group, level, messages, kwargs, holder=holder)
        )
        tasks: list[asyncio.Future[Any]] = [first]
        try:
            delay = min(hedge.delay(), ctx.deadline.remaining())
            done, _ = await asyncio.wait({first}, timeout=delay)
            if done:
                return first.result()
            picked = holder[0].picked if holder else None
            others = [d for d in self._admissible(ctx, group, self._clock.wall()) if d != picked]
            budget = self._budgets[group]
            if not others or not budget.allows_retry() or not hedge.try_take():
                return await first
            budget.spend()
            ctx.report.hedged = True
            self._emit(ctx, HedgeSent(ctx.call_id, group, delay, picked))
            exclude = frozenset({picked}) if picked else frozenset()
            second: asyncio.Future[Any] = asyncio.ensure_future(
                self._attempt(ctx, group, level, messages, kwargs, exclude=exclude)
            )
            tasks.append(second)
            pending: set[asyncio.Future[Any]] = {first, second}
            errors: list[BaseException] = []
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in sorted(done, key=tasks.index):
                    exc = t.exception()
                    if exc is None:
                        for other in done - {t}:
                            if other.exception() is None:
                                await _discard(other.result())
                        return t.result()
                    errors.append(exc)
            raise errors[0]
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()
            leftovers = [t for t in tasks if not t.done()]
            if leftovers:
                await asyncio.gather(*leftovers, return_exceptions=True)

    def _has_fallback(self, ctx: _CallContext, group: str) -> bool:
        """Is there a generic fallback group this call could still move to?"""
        requested = ctx.report.requested_group
        return any(g != group for g in self.spec.fallback_chain(requested, ErrorClass.RATE_LIMIT))

    def _admissible(self, ctx: _CallContext, group: str, now: float) -> list[str]:
        """Deployments of ``group`` this call may still try whose breakers would admit it."""
        return [
            d
            for d in self._group_deployments[group]
            if d not in ctx.never_again and self._breakers[d].could_admit(now)
        ]

    def _earliest_free(self, ctx: _CallContext, group: str) -> float:
        now = self._clock.wall()
        waits = [self._breakers[d].held_for(now) for d in self._admissible(ctx, group, now)]
        return min(waits) if waits else 0.0

    def _attempt_kwargs(
        self,
        ctx: _CallContext,
        actx_token: str,
        timeout: float,
        connect: float | None,
        kwargs: Mapping[str, Any],
    ) -> dict[str, Any]:
        """LiteLLM's kwargs for one attempt: the attempt token in metadata, the timeouts, usage."""
        out = {k: v for k, v in kwargs.items() if k != "metadata"}
        md = dict(kwargs.get("metadata") or {})
        md[_META_KEY] = actx_token
        out["metadata"] = md
        if connect:
            t = self._timeouts.get((timeout, connect))
            if t is None:
                t = httpx.Timeout(timeout, connect=min(connect, timeout))
                if len(self._timeouts) < 64:  # few values: configured ones, or a deadline's rest rounded
                    self._timeouts[(timeout, connect)] = t
            out["timeout"] = t
        else:
            out["timeout"] = timeout
        if ctx.stream:
            out["stream"] = True
            opts = dict(out.get("stream_options") or {})
            opts.setdefault("include_usage", True)
            out["stream_options"] = opts
        return out

    async def _attempt(
        self,
        ctx: _CallContext,
        group: str,
        level: int,
        messages: list[dict[str, Any]],
        kwargs: Mapping[str, Any],
        *,
        exclude: frozenset[str] = frozenset(),
        holder: list[_AttemptContext] | None = None,
    ) -> Any:
        pol = self._policies[group]
        ctx.attempt_no += 1
        wait_before, ctx.next_wait = ctx.next_wait, 0.0
        remaining = ctx.deadline.remaining()
        started_wall = self._clock.wall()
        if remaining <= pol.min_attempt_time:
            failure = Failure(
                ErrorClass.TIMEOUT,
                None,
                "call deadline exhausted before the attempt",
                None,
                TimeoutError("call deadline exhausted"),
            )
            self._record(ctx, group, level, None, failure, started_wall, 0.0, wait_before, "skipped")
            raise AttemptFailed(failure, None)
        if ctx.stream:
            limit = ctx.opts.first_chunk_timeout or ctx.opts.attempt_timeout or pol.first_chunk_timeout
        else:
            limit = ctx.opts.attempt_timeout or pol.attempt_timeout
        timeout = min(limit, remaining)
        # LiteLLM builds and caches an HTTP client per timeout value: the rest of a deadline is a
        # new value every call, so it gets a coarse one (few values, cache hits) and the watchdog
        # holds the exact bound. A configured attempt timeout goes through as it is.
        sent_timeout = timeout if timeout == limit else _coarse(timeout, limit)
        bound = timeout if sent_timeout > timeout else timeout + 0.25
        actx = _AttemptContext(router=self, call=ctx, group=group, exclude=exclude)
        if holder is not None:
            holder.append(actx)
        token = f"{id(self)}:{ctx.call_id}:{next(_ATTEMPT_IDS)}"
        _ATTEMPTS[token] = actx
        epoch = self._epoch  # before _all_clear(): a transition in between makes the attempt precise
        filtered = bool(ctx.failed or exclude or ctx.require_prefill) or not self._all_clear()
        # A precise attempt learns its deployment from the pick hook as the request goes out (a
        # hedge must know it while the request is in flight); the rest (every breaker closed, no
        # guard) read it back from the metadata LiteLLM fills in.
        precise = filtered or bool(self.guards) or holder is not None
        if filtered:
            _FILTER.acquire()
        if precise:
            _PICK.acquire()
        md: Mapping[str, Any] | None = None
        t0 = self._clock.monotonic()
        try:
            if self.guards:
                self._guard_before(ctx, actx, group, level, messages, kwargs)
            attempt_kwargs = self._attempt_kwargs(ctx, token, sent_timeout, pol.connect_timeout, kwargs)
            md = attempt_kwargs["metadata"]
            with AttemptWatchdog(bound):  # the hard bound, if LiteLLM's timeout does not end it first
                resp = await self._router.acompletion(model=group, messages=messages, **attempt_kwargs)
                if ctx.stream:
                    resp = await prefetch_stream(resp)
        except asyncio.CancelledError:
            if not precise:
                actx.learn(_picked_in(md), epoch)
            if actx.admission is not None:
                self._breakers[actx.admission.deployment_id].release(actx.admission)
            if actx.guard_tokens:
                if actx.sent:  # in flight: the provider may bill it; the guard's policy decides
                    actx.settle_guards(None, None, None)
                else:  # nothing was sent: a plain release
                    nothing = Failure(
                        ErrorClass.UNKNOWN, None, "cancelled before sending", None, asyncio.CancelledError()
                    )
                    actx.settle_guards(None, None, nothing)
            latency = self._clock.monotonic() - t0
            cancelled = Failure(ErrorClass.UNKNOWN, None, "cancelled", None, asyncio.CancelledError())
            self._record(ctx, group, level, actx, cancelled, started_wall, latency, wait_before, "cancelled")
            raise
        except BaseException as exc:  # classify once, then decide
            if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
                raise
            latency = self._clock.monotonic() - t0
            if not precise:
                actx.learn(_picked_in(md), epoch)
            failure = classify(exc)
            self._on_failure(ctx, group, level, actx, failure, started_wall, latency, wait_before)
            raise AttemptFailed(failure, actx.picked) from None
        finally:
            _ATTEMPTS.pop(token, None)
            if filtered:
                _FILTER.release()
            if precise:
                _PICK.release()
        latency = self._clock.monotonic() - t0
        if ctx.stream:
            if not precise:
                actx.learn(_picked_in(md), epoch)
            stream = ResilientStream(self, ctx, group, level, actx, resp, started_wall, latency, wait_before)
            stream.bind_restart(messages, dict(kwargs))
            return stream
        hidden = hidden_params_of(resp)
        dep = hidden.get("model_id") if hidden is not None else None
        if not precise:
            actx.learn(str(dep) if dep is not None else _picked_in(md), epoch)
        elif dep is not None and actx.picked != dep:
            actx._pick(str(dep))
        usage = usage_of(resp)
        ctx.served = _Served(resp, usage, actx.picked)
        self._on_success(
            ctx, group, level, actx, started_wall, latency, wait_before, response=resp, usage=usage
        )
        return resp

    def _guard_before(
        self,
        ctx: _CallContext,
        actx: _AttemptContext,
        group: str,
        level: int,
        messages: list[dict[str, Any]],
        kwargs: Mapping[str, Any],
    ) -> None:
        ids = self._admissible(ctx, group, self._clock.wall()) or self._group_deployments[group]
        deployments = tuple(self._deployments[d] for d in ids)
        info = AttemptInfo(
            call_id=ctx.call_id,
            attempt=ctx.attempt_no,
            model_group=group,
            fallback_level=level,
            deployments=deployments,
            messages=messages,
            kwargs={k: v for k, v in kwargs.items() if k != "metadata"},
            metadata=dict(kwargs.get("metadata") or {}),
            stream=ctx.stream,
            idempotency_key=ctx.report.idempotency_key,
        )
        for guard in self.guards:
            actx.guard_tokens.append((guard, guard.before_attempt(info)))

    def _on_success(
        self,
        ctx: _CallContext,
        group: str,
        level: int,
        actx: _AttemptContext,
        started_wall: float,
        latency: float,
        wait_before: float,
        ttft: float | None = None,
        response: Any | None = None,
        usage: Mapping[str, int] | None = None,
    ) -> None:
        if actx.admission is not None:
            self._breakers[actx.admission.deployment_id].record_success(actx.admission)
        self._budgets[group].on_success()
        hedge = self._hedges.get(group)
        if hedge is not None:
            hedge.observe(ttft if ttft is not None else latency)
        if actx.guard_tokens:
            actx.settle_guards(response, usage, None)
        self._record(ctx, group, level, actx, None, started_wall, latency, wait_before, "success", ttft)

    def _on_failure(
        self,
        ctx: _CallContext,
        group: str,
        level: int,
        actx: _AttemptContext,
        failure: Failure,
        started_wall: float,
        latency: float,
        wait_before: float,
    ) -> None:
        ctx.failures.append(failure)
        if actx.guard_tokens:
            actx.settle_guards(None, None, failure)
        dep = actx.picked
        adm = actx.admission
        if adm is not None:
            b = self._breakers[adm.deployment_id]
            if failure.counts_against_deployment:
                b.record_failure(adm)
            else:
                b.release(adm)
            if failure.retry_after:
                b.hold(failure.retry_after)
                self._hold_until = max(self._hold_until, self._clock.wall() + failure.retry_after)
        if failure.counts_against_deployment:
            self._budgets[group].on_failure()
        if dep is not None:
            ctx.failed.add(dep)
            if not self._policies[group].classes[failure.error_class].same_deployment:
                ctx.never_again.add(dep)
        sent = actx.sent or (dep is not None and failure.error_class is not ErrorClass.CIRCUIT_OPEN)
        outcome = "failure" if sent else "skipped"
        self._record(ctx, group, level, actx, failure, started_wall, latency, wait_before, outcome)

    def _record(
        self,
        ctx: _CallContext,
        group: str,
        level: int,
        actx: _AttemptContext | None,
        failure: Failure | None,
        started_wall: float,
        latency: float,
        wait_before: float,
        outcome: Any,
        ttft: float | None = None,
    ) -> None:
        dep = actx.picked if actx is not None else None
        values = (  # AttemptRecord's fields, in order
            ctx.call_id,
            ctx.attempt_no,
            group,
            dep,
            level,
            outcome,
            failure.error_class if failure else None,
            failure.status if failure else None,
            failure.message if failure else None,
            started_wall,
            latency,
            wait_before,
            self._breaker_state(dep),
            ttft,
            bool(actx and actx.admission and actx.admission.probe),
        )
        if ctx.listener is None and not self.events.active:
            ctx.report.defer_attempt(values)  # nobody takes it now: built if the report is read
            return
        rec = AttemptRecord(*values)
        ctx.report.attempts.append(rec)
        self._emit(ctx, rec)

    def _breaker_state(self, dep: str | None) -> str | None:
        if dep is None or dep not in self._deployments:
            return None
        if dep not in self._not_closed and not self._shared_breakers:
            return "closed"  # transitions keep _not_closed current for in-process breakers
        return self._breakers[dep].state

    # -- streaming -------------------------------------------------------------------------------

    async def _stream(
        self, ctx: _CallContext, group: str, messages: list[dict[str, Any]], kwargs: dict[str, Any]
    ) -> ResilientStream | StaticStream:
        result = await self._walk_routes(ctx, group, messages, kwargs)
        assert isinstance(result, ResilientStream | StaticStream)
        return result


def _fill_from_response(report: CallReport, resp: Any, usage: dict[str, int] | None) -> None:
    """The served model, cost and usage of the answer."""
    report.served_model = getattr(resp, "model", None)
    cost = (hidden_params_of(resp) or {}).get("response_cost")
    report.response_cost = float(cost) if isinstance(cost, int | float) else None
    report.usage = usage


def _attach_report(obj: Any, report: CallReport) -> None:
    hidden = hidden_params_of(obj)
    if hidden is not None:
        hidden[REPORT_KEY] = report
        return
    try:
        setattr(obj, REPORT_KEY, report)
    except (AttributeError, TypeError):
        pass


def get_report(obj: Any) -> CallReport | None:
    """The :class:`CallReport` of a response, a stream, or an error raised by the router."""
    if isinstance(obj, ResilientStream | SyncResilientStream | StaticStream):
        return obj.report
    hidden = hidden_params_of(obj)
    if hidden is not None and REPORT_KEY in hidden:
        return hidden[REPORT_KEY]  # type: ignore[no-any-return]
    rep = getattr(obj, REPORT_KEY, None) or getattr(obj, "report", None)
    return rep if isinstance(rep, CallReport) else None
