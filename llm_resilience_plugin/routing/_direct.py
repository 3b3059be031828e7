"""Direct dispatch: one attempt straight through ``litellm.acompletion`` (or, for the other
operations, ``litellm.aembedding``/``atext_completion``/``aimage_generation``/``aresponses``: see
:mod:`._direct_ops`) for the deployment the plugin picked, with the arguments the wrapped
``litellm.Router`` would have sent.

The Router stays the authority: its registry gives each deployment's parameters (``os.environ/``
resolved, ``litellm_params`` merged, ``model_info``), its own request-shaping functions build the
attempt's kwargs, its own ``simple_shuffle`` picks among the deployments the engine admits, and its
routing cache holds the ``max_parallel_requests`` slot both paths share. What is skipped is the
Router's call machinery around the attempt (retries, fallbacks, cooldowns and bookkeeping that the
plugin switches off or does itself). A group whose config uses anything not proven equivalent
(``tests/integration/test_direct_dispatch.py``, ``test_direct_operations.py``,
``test_direct_usage.py``) is dispatched through the Router; see :mod:`._direct_plan` for the list
and ``docs/how-a-call-flows.md``.

LiteLLM internals relied on (the Router's shaping functions, routing keys, routing cache, core
endpoint functions, registry and health) come from :mod:`llm_resilience_plugin._litellm`; where
that LiteLLM lacks them (capability ``direct_dispatch``) every group uses the Router.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import litellm

from llm_resilience_plugin import _litellm
from llm_resilience_plugin._engine.attempt import AttemptContext, deployment_id_of
from llm_resilience_plugin._engine.dispatch import CHAT
from llm_resilience_plugin._engine.engine import Engine
from llm_resilience_plugin._engine.executor_wait import quiet_cancel
from llm_resilience_plugin._engine.watchdog import AttemptWatchdog
from llm_resilience_plugin.events import CallReport
from llm_resilience_plugin.routing._direct_ops import (
    GENERIC_ROUTER_ONLY,
    OPERATION_FUNCTIONS,
    metadata_field,
    operation_kwargs,
    stamp_operation_error,
)
from llm_resilience_plugin.routing._direct_plan import DISPATCH_MODES, GroupDispatch, dispatch_plan
from llm_resilience_plugin.routing._direct_shaping import RouterPieces
from llm_resilience_plugin.routing._direct_usage import UsageAccounting
from llm_resilience_plugin.routing._dispatch import RouterDispatcher
from llm_resilience_plugin.routing._hooks import FILTER
from llm_resilience_plugin.routing._sse_skip import skip_malformed_events
from llm_resilience_plugin.routing._streams import ResilientStream, StaticStream, prefetch_stream

_ROUTING_HOOKS = ("async_filter_deployments", "async_pre_routing_hook")
_HOOK_TYPES: dict[type, bool] = {}


def _routes(cb: Any) -> bool:
    """Does a global callback take part in the Router's deployment choice (checked once per class)?"""
    cls = type(cb)
    known = _HOOK_TYPES.get(cls)
    if known is None:
        from litellm.integrations.custom_logger import CustomLogger  # public: callbacks' base class

        known = _HOOK_TYPES[cls] = isinstance(cb, CustomLogger) and any(
            getattr(cls, name, None) is not getattr(CustomLogger, name, None) for name in _ROUTING_HOOKS
        )
    return known


def routing_hooks_present() -> bool:
    """A callback in ``litellm.callbacks`` (other than the plugin's own filter) that filters or
    re-routes deployments: the Router would run it, so the attempt goes through the Router."""
    cbs = litellm.callbacks
    if not cbs:
        return False
    own = FILTER.hook
    return any(cb is not own and _routes(cb) for cb in cbs)


class DirectDispatcher:
    """Sends a direct group's attempt through LiteLLM's module function for its operation;
    everything else (other groups, streams on a deployment with a parallel-request limit or counted
    usage, request-scoped credentials, routing callbacks) through the wrapped
    :class:`RouterDispatcher`."""

    def __init__(
        self,
        router: litellm.Router,
        engine: Engine,
        via_router: RouterDispatcher,
        plan: Mapping[str, GroupDispatch],
    ) -> None:
        found = _litellm.internals().direct
        assert found is not None, "dispatch_plan() makes no group direct without direct_dispatch"
        self.router = router
        self.engine = engine
        self.via_router = via_router
        # The served model, cost and usage of an answer, and its report: the Router dispatcher's
        # own method (bound here, so each answer makes no delegating call).
        self.annotate: Callable[[CallReport, Any, dict[str, int] | None], None] = via_router.annotate
        self.plan = dict(plan)
        self.sent_direct = 0  # attempts sent straight through litellm.acompletion (for tests, stats)
        # The Router core's endpoint functions as its class holds them (a class-level patch
        # replaces one: the attempt then goes through the Router, which calls the patch).
        self._core_members = found.core_members
        self._core_functions = {
            name: found.core_members.get(name)
            for name in ("acompletion", *("a" + op for op in OPERATION_FUNCTIONS))
        }
        shaping = _litellm.shaping_of(router)
        assert shaping is not None, "dispatch_plan() makes no group direct without the Router's shaping"
        self._shaping, self._store = shaping
        self._routing_keys: frozenset[str] = found.routing_keys
        self._clientside: frozenset[str] = found.clientside_keys
        self._max_parallel_limit = found.max_parallel_limit
        self._calculate_max_parallel = found.calculate_max_parallel_requests
        self._deployments: dict[str, list[dict[str, Any]]] = {}
        self._limited: set[str] = set()
        for d in _litellm.deployments_of(router):
            group = str(d["model_name"])
            if self.plan.get(group, GroupDispatch("router", "")).dispatcher != "direct":
                continue
            dep = {
                "model_name": group,
                "litellm_params": dict(d["litellm_params"]),
                "model_info": dict(d["model_info"]),
            }
            self._deployments.setdefault(group, []).append(dep)
        self._group_size = {g: len(v) for g, v in self._deployments.items()}
        self._pieces = RouterPieces(found)  # LiteLLM's shaping/header functions, found once
        # per deployment id: its SDK client cache keys, indexed by "is a stream"
        self._client_keys = {
            deployment_id_of(d): _litellm.client_cache_keys(deployment_id_of(d))
            for deps in self._deployments.values()
            for d in deps
        }
        # Groups where simple_shuffle has a weight to read; in the others (and with no per-request
        # ``_router_weights``) it is ``random.choice``, which is called as is.
        self._weighted = {
            g
            for g, deps in self._deployments.items()
            if any(d["litellm_params"].get(m) for d in deps for m in ("weight", "rpm", "tpm"))
        }
        for deps in self._deployments.values():
            for dep in deps:
                if self._slot_limit(dep, create=True) is not None:
                    self._limited.add(deployment_id_of(dep))
        self._limited_groups = {
            g
            for g, deps in self._deployments.items()
            if any(deployment_id_of(d) in self._limited for d in deps)
        }
        # Deployments whose usage the Router counts (rpm/tpm): a direct attempt reports into it.
        self._usage = UsageAccounting(router)
        self._tracked = {
            deployment_id_of(d)
            for g, deps in self._deployments.items()
            for d in deps
            if self._usage.tracks(deployment_id_of(d), g)
        }
        self._tracked_groups = {
            g
            for g, deps in self._deployments.items()
            if any(deployment_id_of(d) in self._tracked for d in deps)
        }
        self._batch_limited_groups = {
            g
            for g, deps in self._deployments.items()
            if any(d["model_info"].get("max_embedding_batch_size") for d in deps)
        }

    # -- the Router's own pieces -----------------------------------------------------------------

    def _slot_limit(self, dep: Mapping[str, Any], *, create: bool = False) -> Any:
        """The deployment's ``max_parallel_requests`` limit, the very object the Router keeps in its
        routing cache (``max_parallel_requests_limit`` in litellm.router_rust.invoke.slots), so
        both paths count one in-flight total."""
        key = _litellm.slot_key(deployment_id_of(dep))
        cached = self._store.get_cache(key=key, local_only=True)
        if cached is not None or not create:
            return cached if isinstance(cached, self._max_parallel_limit) else None
        params = dep["litellm_params"]
        limit = self._calculate_max_parallel(
            rpm=params.get("rpm"),
            max_parallel_requests=params.get("max_parallel_requests"),
            tpm=params.get("tpm"),
            default_max_parallel_requests=self.router.default_max_parallel_requests,
        )
        if not limit:
            return None
        self._store.set_cache(
            key=key,
            value=self._max_parallel_limit(
                max_parallel_requests=limit,
                model_id=deployment_id_of(dep),
                model_group=str(dep["model_name"]),
            ),
            local_only=True,
        )
        return self._store.get_cache(key=key, local_only=True)

    def request_kwargs(
        self,
        group: str,
        dep: Mapping[str, Any],
        messages: list[dict[str, Any]],
        kwargs: Mapping[str, Any],
        dep_id: str | None = None,
    ) -> dict[str, Any]:
        """The kwargs the Router's chat attempt passes to ``litellm.acompletion`` for ``dep``:
        ``_update_kwargs_before_fallbacks`` (trace id, requested group), the walk's metadata
        (no retries, no fallbacks: the plugin's own), then ``_update_kwargs_with_deployment`` and
        the ``litellm_params`` merge, by the Router's own functions (``dep_id``: ``dep``'s id, if
        known)."""
        p = self._pieces
        keys = self._routing_keys
        request: dict[str, Any] = dict(kwargs)  # without the routing keys (no comprehension frame)
        if not keys.isdisjoint(request):
            for k in keys.intersection(request):
                del request[k]
        md = dict(request.get("metadata") or {})
        md["model_group"] = group
        md["model_group_alias"] = None
        request["metadata"] = md
        request["stream"] = stream = bool(request.get("stream", False))
        request.setdefault("litellm_trace_id", str(uuid.uuid4()))
        request["_context_compaction_state"] = p.initialize_compaction_state(request, "chat")
        request["messages"] = messages
        params = p.deployment_params(dep, request)
        p.update_kwargs_with_deployment(
            self._shaping, dep, request, cache=self._store, splits_stream_timeout=True
        )
        md.update(
            {
                "original_model_group": group,
                "attempted_fallbacks": 0,
                "attempted_retries": 0,
                "max_retries": 0,
                "model_group_size": self._group_size[group],
            }
        )
        client_key = self._client_keys[dep_id if dep_id is not None else deployment_id_of(dep)][stream]
        client = self._store.get_cache(key=client_key, local_only=True)
        return p.without_router_only_kwargs(  # type: ignore[no-any-return]
            {**params, "caching": False, "client": client, **request}
        )

    def operation_request_kwargs(
        self, op: str, group: str, dep: Mapping[str, Any], payload: Any, kwargs: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The kwargs the Router's attempt for a non-chat ``op`` passes to LiteLLM's function for
        ``dep`` (see :mod:`._direct_ops`), with the deployment's cached SDK client."""
        if op == "responses":  # ``generic()``: the wrapper's own provider and client are dropped
            kwargs = {k: v for k, v in kwargs.items() if k not in ("custom_llm_provider", "client")}
        elif op == "text_completion":
            kwargs = {k: v for k, v in kwargs.items() if k not in ("is_retry", "is_fallback", "is_async")}
        client = self._store.get_cache(
            key=self._client_keys[deployment_id_of(dep)][kwargs.get("stream") is True], local_only=True
        )
        return operation_kwargs(
            self._shaping,
            self._store,
            self._routing_keys,
            op,
            group,
            dep,
            payload,
            kwargs,
            self._group_size[group],
            client,
        )

    # -- the Dispatcher protocol -----------------------------------------------------------------

    def direct_for(self, attempt: AttemptContext, kwargs: Mapping[str, Any]) -> bool:
        """Does this attempt go direct (its group is, and nothing at run time needs the Router)?"""
        if attempt.group not in self._deployments:
            return False
        op = attempt.call.operation
        if op != CHAT and not self._operation_direct(op, attempt, kwargs):
            return False
        if attempt.call.stream and (
            attempt.group in self._limited_groups or attempt.group in self._tracked_groups
        ):
            return False  # the Router's slot rides along an open stream and counts its usage at the end
        if kwargs and not self._clientside.isdisjoint(kwargs):
            return False  # request-scoped credentials make a request-scoped deployment in the Router
        name = "acompletion" if op == CHAT else "a" + op
        wrapped = self._core_members.get(name) is not self._core_functions.get(name)
        if wrapped or name in vars(self.router):
            return False  # someone wraps the Router's function (a spy, a mock, instrumentation)
        return not litellm.callbacks or not routing_hooks_present()  # no call while none is registered

    def _operation_direct(self, op: str, attempt: AttemptContext, kwargs: Mapping[str, Any]) -> bool:
        """Does a non-chat attempt go direct: an operation the equivalence suite covers, no
        request keys only the Router's generic path handles, no embedding batch a deployment of
        the group refuses."""
        if op not in OPERATION_FUNCTIONS:
            return False
        if op == "responses":
            return GENERIC_ROUTER_ONLY.isdisjoint(kwargs)
        if op == "embedding" and attempt.group in self._batch_limited_groups:
            return False  # the Router's own batch-size refusal (the plugin splits before it anyway)
        return True

    async def send(
        self,
        attempt: AttemptContext,
        messages: list[dict[str, Any]],
        kwargs: dict[str, Any],
        *,
        timeout_s: float,
        bound: float,
    ) -> Any:
        """One request straight to the deployment the engine admits and ``simple_shuffle`` picks."""
        if not self.direct_for(attempt, kwargs):
            return await self.via_router.send(attempt, messages, kwargs, timeout_s=timeout_s, bound=bound)
        p = self._pieces
        engine = self.engine
        call = attempt.call
        group = attempt.group
        pool = attempt.select(self._deployments[group])  # the engine's filter (may raise CircuitOpenError)
        if len(pool) == 1:
            dep = pool[0]
        elif group in self._weighted or "_router_weights" in kwargs:
            dep = p.simple_shuffle(_no_alias, pool, group, kwargs)
        else:
            dep = random.choice(pool)  # simple_shuffle's own last line when nothing is weighted
        dep_id = deployment_id_of(dep)
        attempt.pick(dep_id)
        self.sent_direct += 1
        op = call.operation
        attempt_kwargs = self.via_router.attempt_kwargs(
            call.stream, attempt.token, timeout_s, engine.policies[group].connect_timeout, kwargs, op
        )
        if op == CHAT:
            sent = self.request_kwargs(group, dep, messages, attempt_kwargs, dep_id)
            send: Any = litellm.acompletion
        else:
            sent = self.operation_request_kwargs(op, group, dep, messages, attempt_kwargs)
            send = getattr(litellm, OPERATION_FUNCTIONS[op])  # looked up per call, as the Router's host does
        # get-or-create on every call, as the Router does: its cache entry may have expired
        limit = self._slot_limit(dep, create=True) if dep_id in self._limited else None
        tracked = dep_id in self._tracked
        try:
            with AttemptWatchdog(bound):
                if limit is not None:
                    with limit:
                        attempt.sent = True
                        resp: Any = await quiet_cancel(send(**sent))
                else:
                    attempt.sent = True
                    resp = await quiet_cancel(send(**sent))
                if call.stream:
                    skipper = skip_malformed_events(resp)  # before the SDK stream is first read
                    pre = await prefetch_stream(resp)
                    pre.skipper = skipper
                    return pre
        except Exception as e:
            if op == CHAT:
                p.stamp_deployment_num_retries(e, dep)
                p.stamp_failed_deployment_id(e, sent.get("model_info"))
            else:
                stamp_operation_error(op, e, dep, sent)
            if tracked:
                await self._usage.failure(e, sent, metadata_field(op), group)
            raise
        if not tracked:  # the headers the Router's finish_async stamps on a served answer
            return p.stamp_response(resp, group, sent)
        await self._usage.success(resp, sent, metadata_field(op), group)
        return p.stamp_response(resp, group, sent, await self._usage.remaining(group))

    def wrap_stream(
        self,
        attempt: AttemptContext,
        level: int,
        prefetched: Any,
        started_wall: float,
        latency: float,
        wait_before: float,
        messages: list[dict[str, Any]],
        kwargs: dict[str, Any],
    ) -> ResilientStream:
        """The caller's stream (as the Router dispatcher's)."""
        return self.via_router.wrap_stream(
            attempt, level, prefetched, started_wall, latency, wait_before, messages, kwargs
        )

    def static_stream(self, response: Any, attempt_call: Any) -> StaticStream:
        """A configured static answer as a one-chunk stream."""
        return self.via_router.static_stream(response, attempt_call)

    async def discard(self, result: Any) -> None:
        """Close a result nobody will read (the loser of a hedge)."""
        await self.via_router.discard(result)


def _no_alias(model: str) -> str | None:
    return None


def dispatcher_for(
    router: litellm.Router,
    engine: Engine,
    via_router: RouterDispatcher,
    settings: Mapping[str, Any],
    mode: str,
) -> tuple[RouterDispatcher | DirectDispatcher, dict[str, GroupDispatch]]:
    """The engine's dispatcher for the policy's ``dispatch`` mode, and the plan per group."""
    plan = dispatch_plan(router, settings, mode)
    if not any(p.dispatcher == "direct" for p in plan.values()):
        return via_router, plan
    return DirectDispatcher(router, engine, via_router, plan), plan


__all__ = [
    "DISPATCH_MODES",
    "DirectDispatcher",
    "GroupDispatch",
    "dispatch_plan",
    "dispatcher_for",
    "routing_hooks_present",
]
