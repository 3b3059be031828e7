"""ResilientRouter: LiteLLM's Router with the engine's retries, breakers, fallbacks and deadlines.

The plugin owns every retry, fallback and cooldown decision; the wrapped ``litellm.Router`` makes
exactly one attempt per call (``num_retries=0``, no fallbacks, cooldowns off) on a deployment that
LiteLLM's own routing strategy picks among the ones the engine admits. This module is the facade:
construction, introspection, the public calls; each call is opened and run (per-call options, the
idempotency store) by the router's ``calls`` (``_calls.CallRunner``); the loop is in ``_engine``.
"""

from __future__ import annotations

import asyncio
import copy
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import litellm
from litellm.types.router import Deployment

from llm_resilience_plugin import _litellm
from llm_resilience_plugin._engine.breakers import DeploymentBreaker
from llm_resilience_plugin._engine.clock import Clock
from llm_resilience_plugin._engine.core import BeforeRetry
from llm_resilience_plugin._engine.drivers import SyncRunner
from llm_resilience_plugin._engine.engine import Engine
from llm_resilience_plugin._engine.idempotency import DEFAULT_SCOPE_KEYS, IdempotencyStore, open_store
from llm_resilience_plugin._engine.retry import RetryBudget
from llm_resilience_plugin._env import allow_loopback
from llm_resilience_plugin._redaction import (
    SecretHold,
)
from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.events import (
    REPORT_KEY,
    AttemptGuard,
    CallReport,
    DeploymentInfo,
    Listener,
    hidden_params_of,
)
from llm_resilience_plugin.observability import apply_observability
from llm_resilience_plugin.policy import (
    EffectivePolicy,
    ResiliencePolicy,
    RouterSpec,
    build_spec,
    load_config,
    spec_from_mapping,
)
from llm_resilience_plugin.routing._calls import CallRunner
from llm_resilience_plugin.routing._clients import ClosingSyncRunner
from llm_resilience_plugin.routing._direct import dispatcher_for
from llm_resilience_plugin.routing._dispatch import RouterDispatcher
from llm_resilience_plugin.routing._model_list import (
    ModelList,
    deployment_info,
    refuse_url_credentials,
    secrets_of,
    with_readable_ids,
)
from llm_resilience_plugin.routing._operations import EndpointsMixin
from llm_resilience_plugin.routing._operations_audio import AudioMixin
from llm_resilience_plugin.routing._shared import SharedWiring
from llm_resilience_plugin.routing._shutdown import DEFAULT_GRACE
from llm_resilience_plugin.routing._streams import ResilientStream, StaticStream, SyncResilientStream
from llm_resilience_plugin.routing._surface import MACHINERY, REFUSED, pass_through_family

# LiteLLM's internals, found once (an ImportError naming the supported range below its floor).
_litellm.internals()


def _release(sync: SyncRunner) -> None:
    sync.close()


class ResilientRouter(EndpointsMixin, AudioMixin):
    """LiteLLM's Router with tenacity retries, per-deployment breakers, fallbacks and deadlines.

    Chat (``acompletion``) and, from :class:`EndpointsMixin`, ``aembedding``,
    ``atext_completion``, ``aimage_generation`` and ``aresponses``; from :class:`AudioMixin`,
    ``atranscription``, ``aspeech``, ``amoderation``, ``arerank`` (each with its blocking twin)
    and the batch completions.

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

    def set_idempotency_store(
        self,
        store: str | IdempotencyStore | None,
        *,
        ttl: float = 600.0,
        scope: Sequence[str] = DEFAULT_SCOPE_KEYS,
    ) -> None:
        """Return stored results for repeated idempotency keys within ``ttl`` seconds.

        ``"memory"``, ``"sqlite:///path.db"``, any object with ``get``/``put``, or None (off).
        ``scope``: the metadata keys (or ``key:value`` tags) a key is scoped by besides the
        operation and model group (default: the tenant).
        """
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or ttl <= 0:
            raise ConfigError("idempotency_ttl", "must be a positive number of seconds")
        if isinstance(scope, str) or not all(isinstance(k, str) and k for k in scope):
            raise ConfigError("idempotency_scope", "expected a list of metadata keys, e.g. ['tenant']")
        self.calls.store = open_store(store)
        self.calls.ttl = float(ttl)
        self.calls.scope_keys = tuple(scope)

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
        refuse_url_credentials(spec.model_list)
        # The deployments' secrets are scrubbed from every record until this router closes.
        hold = SecretHold(secrets_of(spec.model_list))
        self._forget_secrets = weakref.finalize(self, hold.release)
        entries = with_readable_ids(spec.model_list)
        for name in ("eof_check", "single_send"):  # said once: how this LiteLLM's streams and sends differ
            _litellm.internals().warn_missing(name)
        self._router = litellm.Router(
            model_list=copy.deepcopy(entries),
            **spec.router_settings,
            num_retries=0,
            disable_cooldowns=True,
            fallbacks=[],
            context_window_fallbacks=[],
            content_policy_fallbacks=[],
            default_fallbacks=None,
            retry_after=0,
        )
        deployments = {info.id: info for info in map(deployment_info, _litellm.deployments_of(self._router))}
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
            pace_for=wiring.pace_for if wiring.shared is not None else None,
            shared_breakers=wiring.wanted,
        )
        # Direct dispatch where it is proven equivalent to the Router for this config (policy
        # ``dispatch``); the Router's dispatcher serves every other group and operation.
        via_router = RouterDispatcher(self._router, engine)
        engine.dispatcher, plan = dispatcher_for(
            self._router, engine, via_router, spec.router_settings, spec.policy.dispatch
        )
        # add_deployment, upsert_deployment, delete_deployment, set_model_list (routing/_model_list.py)
        self._model_list = ModelList(self, self._router, entries, via_router, wiring, plan)
        # What opens and runs each call (chat here, the other operations in EndpointsMixin).
        self.calls = CallRunner(engine, spec, ClosingSyncRunner())  # its runner closes LiteLLM's clients
        self.guards = engine.guards
        self.events = engine.events
        if self.shared_state is not None:
            self.shared_state.prime(shared_members)
        for guard in self.guards:  # e.g. a CostGuard prices every deployment now (ConfigError)
            bind = getattr(guard, "bind_router", None)
            if callable(bind):
                bind(self)
        sync = self.calls.sync
        release: Callable[..., None] = _release
        release_args: tuple[Any, ...] = (sync,)
        if self.shared_state is not None:  # closing also stops syncing this router's keys
            release, release_args = self.shared_state.release_router, (_release, sync, shared_members)
        self._finalizer = weakref.finalize(self, release, *release_args)
        # The policy's `observability:` section (auto: on when installed); close() detaches it.
        try:
            self._detach_observability = apply_observability(self, self.policy.observability)
        except ConfigError:
            self._finalizer()
            self._forget_secrets()
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
        plan = self._model_list.plan
        return {g: {"dispatcher": p.dispatcher, "reason": p.reason} for g, p in plan.items()}

    def breakers(self) -> dict[str, dict[str, Any]]:
        """State per deployment id: state, fail_counter, generation, probes in flight, retry_at."""
        return self.engine.breakers.snapshot()

    def paces(self) -> dict[str, dict[str, Any]]:
        """Rate-limit pacing per deployment id: the effective rpm/tpm and where they come from
        (``config``, ``headers``, ``learned``, ``none``), calls queued, slots granted, 429s seen."""
        return self.engine.paces.snapshot()

    def breaker(self, deployment_id: str) -> DeploymentBreaker:
        """The circuit breaker of one deployment (``KeyError`` for one the router does not serve)."""
        breakers = self.engine.breakers
        if deployment_id not in breakers:
            raise KeyError(deployment_id)
        return breakers[deployment_id]

    def retry_budget(self, group: str) -> RetryBudget:
        """The retry budget of one model group."""
        return self.engine.budgets[group]

    def effective_policy(self, group: str) -> EffectivePolicy:
        """The policy in force for ``group`` (global settings merged with its overrides)."""
        self.calls.check_group(group)
        return self.engine.policies[group]

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Receive every event (attempts, retries, fallbacks, breaker transitions, calls)."""
        return self.events.subscribe(listener)

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
        calls = self.calls
        ctx, kwargs = calls.open_call(model, messages, stream, deadline, listener, before_retry, kwargs)
        if stream:
            return await calls.stream(ctx, model, messages, kwargs)
        return await calls.complete(ctx, model, messages, kwargs)

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
        calls = self.calls
        ctx, kwargs = calls.open_call(model, messages, stream, deadline, listener, before_retry, kwargs)
        if stream:
            astream = calls.run_sync(calls.stream(ctx, model, messages, kwargs))
            return SyncResilientStream(astream, calls.sync)
        return calls.run_sync(calls.complete(ctx, model, messages, kwargs))

    def close(self, grace: float = DEFAULT_GRACE) -> None:
        """Shut down: refuse new calls (:class:`RouterClosedError`), wait up to ``grace``
        seconds for the calls and streams in flight, cancel the rest (reported ``cancelled``,
        counted against no deployment; a cut stream's read raises :class:`RouterClosedError`),
        then release the private loop, LiteLLM's clients on it and, with the last router,
        LiteLLM's hook. From inside a running event loop prefer :meth:`aclose`: calls on that
        loop cannot finish while this blocks, so they are cancelled at once (as is a stream this
        thread reads)."""
        grace = _grace(grace)
        self.calls.shutdown.drain(grace)
        self._release()

    async def aclose(self, grace: float = DEFAULT_GRACE) -> None:
        """The async twin of :meth:`close`: calls and streams on this loop go on during the grace
        period (a stream the closing task itself reads is cut at once)."""
        grace = _grace(grace)
        await self.calls.shutdown.adrain(grace)
        await asyncio.to_thread(self._release)

    def _release(self) -> None:
        self._detach_observability()
        self._finalizer()
        self._forget_secrets()
        self._model_list.release()

    # -- the rest of litellm.Router's surface (routing/_surface.py) ------------------------------

    @property
    def model_list(self) -> list[dict[str, Any]]:
        """The wrapped Router's ``model_list`` (pass-through, as ``litellm.Router.model_list``)."""
        return self._router.model_list  # type: ignore[no-any-return]

    def get_model_list(self, *args: Any, **kwargs: Any) -> Any:
        """``litellm.Router.get_model_list`` of the wrapped Router (pass-through)."""
        return self._router.get_model_list(*args, **kwargs)

    def get_model_names(self, *args: Any, **kwargs: Any) -> Any:
        """``litellm.Router.get_model_names`` of the wrapped Router (pass-through)."""
        return self._router.get_model_names(*args, **kwargs)

    # -- a model list that changes (routing/_model_list.py) --------------------------------------

    def add_deployment(self, deployment: Deployment | Mapping[str, Any]) -> Deployment | None:
        """Add one deployment, checked as construction checks one, unless its id is served
        (``litellm.Router.add_deployment``): the deployment added, or None. It gets a closed
        breaker, its pace (``rpm``/``tpm``), a place in the dispatch plan and the cost guard's
        price; a ``ConfigError`` leaves the router unchanged. Safe while calls are in flight."""
        return self._model_list.add(deployment)  # type: ignore[no-any-return]

    def upsert_deployment(self, deployment: Deployment | Mapping[str, Any]) -> Deployment | None:
        """Add a deployment or replace the one with its id (``litellm.Router.upsert_deployment``):
        the deployment, or None if it is unchanged. A replaced deployment keeps its breaker while
        it calls the same model at the same ``api_base`` (else it starts closed) and its pace
        while its configured ``rpm``/``tpm`` stay."""
        return self._model_list.upsert(deployment)  # type: ignore[no-any-return]

    def delete_deployment(self, id: str) -> Any:
        """Take out the deployment with ``id`` (``litellm.Router.delete_deployment``): its entry, or
        None if no deployment has it. New calls never pick it and its breaker leaves
        :meth:`breakers`; an attempt in flight on it finishes. The last deployment of a group
        the fallbacks or the policy name is refused (``ConfigError``): build a new router."""
        return self._model_list.delete(id)

    def set_model_list(self, model_list: list[dict[str, Any]]) -> None:
        """Replace every deployment (``litellm.Router.set_model_list``), all or nothing, with the
        checks of construction; deployments that stay keep their breakers and paces."""
        self._model_list.replace(model_list)

    if not TYPE_CHECKING:  # the type checker sees only the names defined above

        def __getattr__(self, name: str) -> Any:
            """A pass-through name of ``litellm.Router`` read from the wrapped Router (one request,
            no resilience); a refused one a function raising ConfigError; the Router's machinery
            an AttributeError saying where it is."""
            router = self.__dict__.get("_router")
            if name.startswith("_") or router is None:
                raise AttributeError(name)
            if pass_through_family(name) is not None:
                return getattr(router, name)
            if name in REFUSED:
                return _refused(name)
            hint = (
                "it is the wrapped Router's own routing/retry/cooldown machinery, which the plugin "
                f"replaces; read it on router.litellm_router.{name}"
                if name in MACHINERY
                else "not a litellm.Router name this plugin knows"
            )
            raise AttributeError(f"'ResilientRouter' object has no attribute {name!r} ({hint})")


def _grace(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise ConfigError("grace", "must be a number of seconds >= 0 (how long calls in flight may finish)")
    return float(value)


def _refused(name: str) -> Callable[..., Any]:
    """What a refused ``litellm.Router`` method is on ResilientRouter: a clear ConfigError."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ConfigError(
            name,
            "would change the router settings the router's breakers, policies and dispatch "
            "plans were built from; build a new ResilientRouter with the new settings (and "
            "close() the old one); the model list changes in place (add_deployment, "
            "upsert_deployment, delete_deployment, set_model_list)",
        )

    refuse.__name__ = name
    return refuse


def get_report(obj: Any) -> CallReport | None:
    """The :class:`CallReport` of a response, a stream, or an error raised by the router."""
    if isinstance(obj, ResilientStream | SyncResilientStream | StaticStream):
        return obj.report
    hidden = hidden_params_of(obj)
    if hidden is not None and REPORT_KEY in hidden:
        return hidden[REPORT_KEY]  # type: ignore[no-any-return]
    rep = getattr(obj, REPORT_KEY, None) or getattr(obj, "report", None)
    return rep if isinstance(rep, CallReport) else None
