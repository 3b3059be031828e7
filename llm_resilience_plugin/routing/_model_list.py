"""A model list that changes: ``add_deployment``, ``upsert_deployment``, ``delete_deployment`` and
``set_model_list`` on a :class:`~llm_resilience_plugin.ResilientRouter` (a config reload, say).

A change is checked exactly as construction checks a model list (each deployment's fields, unique
ids, credentials in URLs, the groups the fallbacks and the policy name, a ``dispatch: direct``
plan, a cost guard's prices) before anything changes: a ConfigError leaves the router as it was.
Then, under one lock:

1. the engine learns the new deployments (info, breaker, pace) and their secrets are held for
   scrubbing; nothing routes to them yet;
2. with the event loops that run this router's calls held (LiteLLM's registry is not safe to read
   from another thread mid-change), the wrapped ``litellm.Router`` makes the change with its own
   method, as a LiteLLM user calls it - its model list is the authority for what follows - and
3. the engine drops the deployments that left from its groups, recomputes each group's effective
   policy and gives new groups their retry budget and timings; every group goes through the
   Router dispatcher for now;
4. the loops run again; the dispatch plan (and the direct dispatcher) is rebuilt, new deployments
   join the fleet's shared state and removed ones leave it, the guards bind again.

Every engine map is swapped whole, never changed in place, so a call reading one mid-change sees
the old map or the new one. A deployment that left keeps its info, breaker and pace reachable by
id only (``retired``: not listed, not picked), so an attempt in flight on it reports its outcome.
"""

from __future__ import annotations

import asyncio
import copy
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import litellm
from litellm.types.router import Deployment

from llm_resilience_plugin import _litellm
from llm_resilience_plugin._engine.breakers import BreakerRegistry, DeploymentBreaker
from llm_resilience_plugin._engine.engine import Retiring, group_policies, make_breaker
from llm_resilience_plugin._engine.hedging import HedgeState
from llm_resilience_plugin._engine.learned import StreamTimings
from llm_resilience_plugin._engine.limits import configured_limits
from llm_resilience_plugin._engine.paces import Paces
from llm_resilience_plugin._engine.pacing import Pace
from llm_resilience_plugin._engine.retry import RetryBudget
from llm_resilience_plugin._problems import Problem, model_list_problems, raise_errors
from llm_resilience_plugin._redaction import (
    SecretHold,
    credential_values,
    mask_params,
    mask_url,
    url_has_credentials,
)
from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.events import DeploymentInfo
from llm_resilience_plugin.policy import EffectivePolicy, RouterSpec, spec_problems
from llm_resilience_plugin.routing._direct import dispatcher_for
from llm_resilience_plugin.routing._direct_plan import GroupDispatch, dispatch_plan
from llm_resilience_plugin.routing._dispatch import RouterDispatcher
from llm_resilience_plugin.routing._shared import SharedWiring

if TYPE_CHECKING:
    from llm_resilience_plugin.routing._router import ResilientRouter

# How many deployments that left the model list stay reachable by id for attempts in flight on
# them (the oldest go first): memory stays bounded however often a config is reloaded.
RETIRED_KEPT = 1024

# The longest a change waits for, and holds, an event loop running this router's calls.
HOLD_LIMIT = 5.0

_REBUILD = "build a new ResilientRouter with the new fallbacks or policy (and close() the old one)"


# -- what construction and a change share ------------------------------------------------------


def deployment_info(d: Mapping[str, Any]) -> DeploymentInfo:
    """What the plugin keeps of one of LiteLLM's deployment dicts: no key, secret, token or
    credential blob, header values masked, no credentials in URLs (the secrets are held for
    scrubbing from every record while the router is open, see :func:`secrets_of`)."""
    lp = d["litellm_params"]
    params = {**(d.get("model_info") or {}), **lp}
    return DeploymentInfo(
        id=str((d.get("model_info") or {}).get("id")),
        model_group=d["model_name"],
        model=lp["model"],
        api_base=mask_url(lp.get("api_base")),
        params=mask_params(params),
    )


def secrets_of(model_list: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every credential of every deployment (``os.environ/NAME`` references resolved)."""
    out: list[str] = []
    for d in model_list:
        for value in credential_values(d.get("litellm_params") or {}):
            resolved = (
                os.environ.get(value[len("os.environ/") :]) if value.startswith("os.environ/") else value
            )
            if resolved:
                out.append(resolved)
    return out


def with_readable_ids(model_list: list[dict[str, Any]]) -> list[dict[str, Any]]:
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


def refuse_url_credentials(model_list: Sequence[Mapping[str, Any]], where: str = "model_list[{i}]") -> None:
    """Credentials in ``api_base`` next to an ``api_key`` make the HTTP client refuse every request
    (it cannot send both): say so before the router serves it, naming the deployment."""
    for i, d in enumerate(model_list):
        lp = d.get("litellm_params") or {}
        if url_has_credentials(lp.get("api_base")) and lp.get("api_key"):
            raise ConfigError(
                where.format(i=i) + ".litellm_params.api_base",
                "has credentials before the host and the deployment also has an api_key; the HTTP "
                "client refuses to send both: remove the user:password@ part",
            )


def id_of(entry: Mapping[str, Any]) -> str | None:
    """The ``model_info.id`` of a model_list entry, if it has one."""
    info = entry.get("model_info")
    return str(info["id"]) if isinstance(info, Mapping) and info.get("id") else None


def entry_of(deployment: Any, where: str) -> dict[str, Any]:
    """A deployment as a model_list entry: from a LiteLLM ``Deployment`` (the fields its caller
    set) or a copy of a mapping."""
    if isinstance(deployment, Deployment):
        return deployment.model_dump(exclude_none=True, exclude_defaults=True)
    if isinstance(deployment, Mapping):
        return copy.deepcopy(dict(deployment))
    raise ConfigError(
        where,
        f"expected a litellm.types.router.Deployment or a mapping with model_name and "
        f"litellm_params, got {type(deployment).__name__}",
    )


def _endpoint(entry: Mapping[str, Any] | DeploymentInfo) -> tuple[Any, ...]:
    """Where a deployment's requests go: a breaker's evidence is about this."""
    if isinstance(entry, DeploymentInfo):
        return (entry.model_group, entry.model, entry.api_base)
    lp = entry.get("litellm_params") or {}
    return (entry.get("model_name"), lp.get("model"), mask_url(lp.get("api_base")))


def _kept(retired: dict[str, Any]) -> dict[str, Any]:
    """The newest :data:`RETIRED_KEPT` of ``retired``."""
    if len(retired) <= RETIRED_KEPT:
        return retired
    return dict(list(retired.items())[-RETIRED_KEPT:])


def _renamed(problems: list[Problem], old: str, new: str) -> list[Problem]:
    return [Problem(p.field.replace(old, new, 1), p.message, p.severity) for p in problems]


class ModelList:
    """The model-list changes of one :class:`ResilientRouter` (see the module docstring)."""

    def __init__(
        self,
        router: ResilientRouter,
        inner: litellm.Router,
        entries: list[dict[str, Any]],
        via_router: RouterDispatcher,
        wiring: SharedWiring,
        plan: dict[str, GroupDispatch],
    ) -> None:
        self._router = weakref.ref(router)
        self.inner = inner
        # The model list as the wrapped Router was given it, every entry with its id (a copy).
        self.entries = copy.deepcopy(entries)
        self.via_router = via_router
        self.wiring = wiring
        self.plan = plan
        self._lock = threading.RLock()
        # The secrets of each deployment added or changed since construction, by id (one hold per
        # id: a reload that changes a deployment again replaces its hold), scrubbed until close.
        self._holds: dict[str, SecretHold] = {}
        self._forget = weakref.finalize(router, _release_all, self._holds)

    @property
    def router(self) -> ResilientRouter:
        router = self._router()
        assert router is not None, "the router was collected"
        return router

    def release(self) -> None:
        """The router closed: forget the secrets of the deployments added since construction."""
        self._forget()

    # -- the four changes (litellm.Router's names, arguments and return values) -----------------

    def add(self, deployment: Any) -> Any:
        """``add_deployment``: the deployment added, or None if one with its id is served."""
        entry = entry_of(deployment, "deployment")
        with self._lock:
            if (dep_id := id_of(entry)) is not None and self._index(dep_id) is not None:
                return None
            self._check_one(entry)
            entries = with_readable_ids([*self.entries, entry])
            given = _as_deployment(deployment, entries[-1])
            return self._commit(entries, "add_deployment", lambda: self.inner.add_deployment(given))

    def upsert(self, deployment: Any) -> Any:
        """``upsert_deployment``: add it, or replace the deployment with its id; None if unchanged."""
        entry = entry_of(deployment, "deployment")
        with self._lock:
            self._check_one(entry)
            dep_id = id_of(entry)
            index = self._index(dep_id) if dep_id is not None else None
            if index is None:
                entries = with_readable_ids([*self.entries, entry])
            elif self.entries[index] == entry:
                return None
            else:
                entries = [*self.entries[:index], entry, *self.entries[index + 1 :]]
            given = _as_deployment(deployment, entries[-1] if index is None else entry)
            return self._commit(entries, "upsert_deployment", lambda: self.inner.upsert_deployment(given))

    def delete(self, id: str) -> Any:
        """``delete_deployment``: the removed deployment's entry, or None if no deployment has ``id``."""
        with self._lock:
            index = self._index(str(id))
            if index is None:
                return None
            entries = [*self.entries[:index], *self.entries[index + 1 :]]
            return self._commit(entries, "delete_deployment", lambda: self.inner.delete_deployment(str(id)))

    def replace(self, model_list: Any) -> None:
        """``set_model_list``: every deployment replaced (all or nothing)."""
        if not isinstance(model_list, list | tuple):
            raise ConfigError("model_list", "expected a list of deployments (model_name, litellm_params)")
        raw = [entry_of(d, f"model_list[{i}]") for i, d in enumerate(model_list)]
        _, problems = model_list_problems(raw)
        raise_errors(problems)
        entries = with_readable_ids(raw)
        with self._lock:
            self._commit(entries, "set_model_list", lambda: self.inner.set_model_list(copy.deepcopy(entries)))

    # -- checks ----------------------------------------------------------------------------------

    def _index(self, dep_id: str) -> int | None:
        return next((i for i, e in enumerate(self.entries) if id_of(e) == dep_id), None)

    def _check_one(self, entry: dict[str, Any]) -> None:
        """One deployment's own fields, named ``deployment.<field>``."""
        _, problems = model_list_problems([entry])
        raise_errors(_renamed(problems, "model_list[0]", "deployment"))
        refuse_url_credentials([entry], where="deployment")

    def _check(self, entries: list[dict[str, Any]], op: str, changed: list[dict[str, Any]]) -> RouterSpec:
        """What construction checks, over the whole new list; the spec it gives (nothing changes)."""
        router = self.router
        spec = router.spec
        groups = {str(e["model_name"]) for e in entries if isinstance(e, Mapping)}
        for group, where in _named_groups(spec).items():
            if group not in groups:
                raise ConfigError(
                    op,
                    f"would take out the last deployment of model group {group!r}, which {where} "
                    f"names; keep a deployment in {group!r}, or {_REBUILD}",
                )
        settings = {k: v for k, v in spec.router_settings.items() if k != "timeout"}  # applied once
        _, problems = spec_problems(
            entries,
            router_settings=settings,
            policy=spec.policy,
            fallbacks=[{k: v} for k, v in spec.fallbacks.items()],
            context_window_fallbacks=[{k: v} for k, v in spec.context_window_fallbacks.items()],
            content_policy_fallbacks=[{k: v} for k, v in spec.content_policy_fallbacks.items()],
            default_fallbacks=list(spec.default_fallbacks),
        )
        raise_errors(problems)
        refuse_url_credentials(entries)
        dispatch_plan(self.inner, spec.router_settings, spec.policy.dispatch, deployments=entries)
        infos = [deployment_info(e) for e in changed]
        for guard in router.guards:  # e.g. a CostGuard prices them (ConfigError for an unknown price)
            check = getattr(guard, "check_deployments", None)
            if callable(check):
                check(infos)
        return spec.model_copy(update={"model_list": entries})

    # -- the change ------------------------------------------------------------------------------

    def _commit(self, entries: list[dict[str, Any]], op: str, change: Callable[[], Any]) -> Any:
        before = {id_of(e): e for e in self.entries}
        live = {str(id_of(e)): e for e in entries}
        changed = [i for i, e in live.items() if before.get(i) != e]
        spec = self._check(entries, op, [live[i] for i in changed])
        router = self.router
        engine = router.engine
        old = (engine.deployments, engine.breakers, engine.paces)
        wanted = {i: deployment_info(e) for i, e in live.items()}
        policies = group_policies(engine.policy, spec, wanted, _groups(wanted))
        # 1. the engine knows the new deployments (and a changed one's new breaker and pace)
        start = len(self.wiring.members)
        dropped: list[Any] = []  # shared-state members of replaced breakers
        fresh = {i: wanted[i] for i in changed}
        known = {i: old[0][i] for i in changed if i in old[0]}
        breakers = self._breakers(fresh, known, policies, dropped)
        paces = self._new_paces(fresh, known)
        added = self.wiring.members[start:]
        engine.deployments = Retiring({**old[0], **fresh}, retired=old[0].retired)  # type: ignore[attr-defined]
        engine.breakers = _registry(old[1], breakers, ())
        engine.paces = self._paces(old[2], paces, ())
        holds = {i: SecretHold(secrets_of([live[i]])) for i in changed}  # before a call can reach one
        with held(self._loops()):  # LiteLLM's registry is not safe to read while it changes
            try:
                result = change()  # 2. the wrapped Router
            except BaseException:
                engine.deployments, engine.breakers, engine.paces = old
                self._leave(added)
                for hold in holds.values():
                    hold.release()
                raise
            gone = self._settle(engine, spec, old, breakers, dropped)
        # 4. outside the hold (the Router serves every group meanwhile): the direct dispatcher,
        # the secrets, the shared state, the guards
        engine.dispatcher, self.plan = dispatcher_for(
            self.inner, engine, self.via_router, spec.router_settings, spec.policy.dispatch
        )
        self.entries = copy.deepcopy(entries)
        for i, hold in holds.items():
            prior, self._holds[i] = self._holds.get(i), hold
            if prior is not None:
                prior.release()
        self._leave([*dropped, *(m for i in gone for m in self.wiring.by_deployment.pop(i, []))])
        if self.wiring.shared is not None and len(self.wiring.members) > start:
            self.wiring.shared.prime(self.wiring.members[start:])
        for guard in router.guards:
            bind = getattr(guard, "bind_router", None)
            if callable(bind):
                bind(router)
        return result

    def _loops(self) -> set[asyncio.AbstractEventLoop]:
        """The loops this router's calls run on: those of the calls in flight, the private one."""
        calls = self.router.calls
        loops = calls.shutdown.loops()
        private = calls.sync.started()
        if private is not None:
            loops.add(private)
        return loops

    def _settle(
        self,
        engine: Any,
        spec: RouterSpec,
        old: tuple[Any, Any, Any],
        replaced_breakers: Mapping[str, DeploymentBreaker],
        dropped: list[Any],
    ) -> list[str]:
        """Step 3, while the loops are held: the engine routes to what the wrapped Router now
        serves, every group through the Router until the dispatch plan is rebuilt; the ids gone."""
        router = self.router
        replaced = [i for i in replaced_breakers if i in old[1]]  # their old state no longer counts
        served = {info.id: info for info in map(deployment_info, _litellm.deployments_of(self.inner))}
        current = engine.deployments
        gone = [i for i in current if i not in served]
        groups = _groups(served)
        policies = {**engine.policies, **group_policies(engine.policy, spec, served, groups)}
        lacking = {i: info for i, info in served.items() if i not in engine.breakers}  # never expected
        breakers = self._breakers(lacking, {}, policies, dropped)
        paces = self._new_paces({i: info for i, info in served.items() if i not in engine.paces}, {})
        engine.dispatcher = self.via_router  # the direct one's deployments are the old ones
        engine.spec = router.spec = router.calls.spec = spec
        engine.policies = policies
        self._group_state(engine, policies, groups)
        retired = _kept({**current.retired, **{i: current[i] for i in gone}})  # type: ignore[attr-defined]
        engine.deployments = Retiring(served, retired=retired)
        engine.breakers = _registry(engine.breakers, breakers, gone)
        engine.paces = self._paces(engine.paces, paces, gone)
        left: dict[str, list[str]] = {g: [] for g in engine.group_deployments if g not in groups}
        retired_groups = {**engine.group_deployments.retired, **left}  # type: ignore[attr-defined]
        engine.group_deployments = Retiring(groups, retired=_kept(retired_groups))
        engine.retire([*gone, *replaced])
        return gone

    def _breakers(
        self,
        infos: Mapping[str, DeploymentInfo],
        known: Mapping[str, DeploymentInfo],
        policies: Mapping[str, EffectivePolicy],
        dropped: list[Any],
    ) -> dict[str, DeploymentBreaker]:
        """Breakers for new deployments, and for changed ones whose requests now go elsewhere (a
        changed deployment that still calls the same model at the same place keeps its own)."""
        engine = self.router.engine
        out: dict[str, DeploymentBreaker] = {}
        for i, info in infos.items():
            prior = known.get(i)
            if prior is not None and _endpoint(prior) == _endpoint(info) and i in engine.breakers:
                continue
            eff = policies[info.model_group]
            dropped.extend(self.wiring.by_deployment.pop(i, []))
            backend = self.wiring.backend_for(info, eff) if self.wiring.shared is not None else None
            out[i] = make_breaker(engine, info, eff, backend)
        return out

    def _new_paces(
        self, infos: Mapping[str, DeploymentInfo], known: Mapping[str, DeploymentInfo]
    ) -> dict[str, Pace]:
        """Paces for new deployments, and for changed ones whose configured limits changed."""
        engine = self.router.engine
        pacing = engine.policy.pacing
        pace_for = self.wiring.pace_for if self.wiring.shared is not None else None
        out: dict[str, Pace] = {}
        for i, info in infos.items():
            prior = known.get(i)
            if prior is not None and prior.model_group == info.model_group and i in engine.paces:
                override = pacing.limits_for(i, info.model_group)
                o = override.model_dump() if override else None
                if configured_limits(prior.params, o) == configured_limits(info.params, o):
                    continue
            out[i] = Paces(engine.policy, [info], engine.clock, pace_for)[i]
        return out

    def _paces(self, old: Paces, new: Mapping[str, Pace], gone: Sequence[str]) -> Paces:
        """A new map of paces: ``old``'s, ``new`` ones in, ``gone`` ones retired."""
        engine = self.router.engine
        out = Paces(engine.policy, [], engine.clock)
        out.update({i: p for i, p in {**old, **new}.items() if i not in gone})
        out.retired = _kept(
            {**old.retired, **{i: old[i] for i in new if i in old}, **{i: old[i] for i in gone}}
        )
        out.on = old.on or (out.enabled and bool(new))  # admission turns it off once nothing is paced
        return out

    def _group_state(
        self, engine: Any, policies: Mapping[str, EffectivePolicy], groups: Mapping[str, Any]
    ) -> None:
        """Retry budgets, timings and hedging for groups that are new (a group that stays keeps its
        own; one that left keeps them for the calls still in it)."""
        new = [g for g in groups if g not in engine.budgets]
        if not new:
            return
        bucket_for = self.wiring.bucket_for if self.wiring.shared is not None else None
        budgets = {
            g: RetryBudget(
                policies[g].retry_budget, shared=bucket_for(g, policies[g]) if bucket_for else None
            )
            for g in new
        }
        engine.budgets = {**engine.budgets, **budgets}
        engine.timings = {**engine.timings, **{g: StreamTimings() for g in new}}
        hedges = {g: HedgeState(h) for g in new if (h := policies[g].hedge) is not None and h.enabled}
        if hedges:
            engine.hedges = {**engine.hedges, **hedges}

    def _leave(self, members: Sequence[Any]) -> None:
        """Stop syncing these shared-state members (deployments that left, breakers replaced)."""
        shared = self.wiring.shared
        for m in members:
            if shared is not None:
                shared.unregister(m)
            if m in self.wiring.members:
                self.wiring.members.remove(m)


@contextmanager
def held(loops: set[asyncio.AbstractEventLoop]) -> Iterator[None]:
    """Hold each of ``loops`` (but the caller's own) in a callback until the block ends, so no call
    on them reads the wrapped Router while it changes (a change takes milliseconds; a loop busy
    elsewhere is waited for at most :data:`HOLD_LIMIT` seconds, and holds at most that long)."""
    try:
        here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        here = None
    release = threading.Event()
    parked: list[threading.Event] = []
    for loop in loops:
        if loop is here or loop.is_closed() or not loop.is_running():
            continue
        ready = threading.Event()

        def park(ready: threading.Event = ready) -> None:
            ready.set()
            release.wait(HOLD_LIMIT)

        try:
            loop.call_soon_threadsafe(park)
        except RuntimeError:  # closed meanwhile
            continue
        parked.append(ready)
    try:
        for ready in parked:
            ready.wait(HOLD_LIMIT)
        yield
    finally:
        release.set()


def _release_all(holds: dict[str, SecretHold]) -> None:
    for hold in holds.values():
        hold.release()


def _groups(deployments: Mapping[str, DeploymentInfo]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for info in deployments.values():
        out.setdefault(info.model_group, []).append(info.id)
    return out


def _registry(
    old: BreakerRegistry, new: Mapping[str, DeploymentBreaker], gone: Sequence[str]
) -> BreakerRegistry:
    """A new breaker registry: ``old``'s breakers, ``new`` ones in, ``gone`` ones retired."""
    retired = {**old.retired, **{i: old[i] for i in [*new, *gone] if i in old}}
    live = {i: b for i, b in {**old, **new}.items() if i not in gone}
    return BreakerRegistry(live, retired=_kept(retired))


def _as_deployment(given: Any, entry: dict[str, Any]) -> Deployment:
    """What the wrapped Router's method takes: the caller's ``Deployment``, or one from the entry."""
    return given if isinstance(given, Deployment) else Deployment(**copy.deepcopy(entry))


def _named_groups(spec: RouterSpec) -> dict[str, str]:
    """Every model group the fallbacks or the policy name, and where (construction refuses a
    config that names a group it has no deployment of)."""
    out: dict[str, str] = {}
    for key in ("fallbacks", "context_window_fallbacks", "content_policy_fallbacks"):
        for src, targets in getattr(spec, key).items():
            out.setdefault(src, f"{key}.{src}")
            for t in targets:
                out.setdefault(t, f"{key}.{src}")
    for g in spec.default_fallbacks:
        out.setdefault(g, "default_fallbacks")
    for g in spec.policy.groups:
        out.setdefault(g, f"resilience.groups.{g}")
    return out


__all__ = [
    "RETIRED_KEPT",
    "ModelList",
    "deployment_info",
    "entry_of",
    "id_of",
    "refuse_url_credentials",
    "secrets_of",
    "with_readable_ids",
]
