"""How a router joins a fleet's shared state on Redis: which breaker backend and retry-budget
bucket each deployment and group gets (docs/scaling-out.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.events import DeploymentInfo
from llm_resilience_plugin.policy import EffectivePolicy, RouterSpec


@dataclass(slots=True)
class SharedWiring:
    """The shared state a router uses (None: local only) and the members it created there."""

    spec: RouterSpec
    wanted: bool = False
    shared: Any = None
    router_key: str = ""
    members: list[Any] = field(default_factory=list)
    # Each deployment's members (its breaker backend): a model-list change stops syncing them.
    by_deployment: dict[str, list[Any]] = field(default_factory=dict)

    @classmethod
    def for_router(
        cls, spec: RouterSpec, deployments: Mapping[str, DeploymentInfo], shared_state: Any
    ) -> SharedWiring:
        """``shared_state``: None (use ``router_settings.redis_url`` if set), a redis:// URL, a
        ``RedisSharedState``, or False (local state even with a redis_url)."""
        wiring = cls(spec, wanted=shared_state is not None and shared_state is not False)
        if shared_state is None and spec.policy.shared_state.enabled:
            rs = spec.router_settings
            wiring.wanted = bool(rs.get("redis_url") or rs.get("redis_host"))
        if not wiring.wanted:
            return wiring
        try:
            from llm_resilience_plugin import shared_state as redis_state
        except ImportError as e:
            raise ConfigError(
                "router_settings.redis_url",
                f"shared state needs redis-py: pip install 'llm-resilience-plugin[redis]' ({e})",
            ) from None
        wiring.shared = redis_state.attach_router(spec, shared_state)
        if wiring.shared is not None:
            wiring.router_key = spec.policy.shared_state.router_name or redis_state.router_key(
                spec.model_list, [(i.model_group, i.id) for i in deployments.values()]
            )
        return wiring

    def backend_for(self, info: DeploymentInfo, eff: EffectivePolicy) -> Any:
        """The shared breaker backend of one deployment."""
        lease = self.spec.policy.shared_state.probe_lease or eff.deadline
        backend = self.shared.breaker_backend(self.router_key, info.id, eff.breaker, lease=lease)
        self.members.append(backend)
        self.by_deployment.setdefault(info.id, []).append(backend)
        return backend

    def bucket_for(self, group: str, eff: EffectivePolicy) -> Any:
        """The shared retry-budget bucket of one model group."""
        bucket = self.shared.token_bucket(self.router_key, group, eff.retry_budget.capacity)
        self.members.append(bucket)
        return bucket

    def pace_for(self, info: DeploymentInfo) -> Any:
        """The fleet-wide rate limit of one deployment (its configured rpm/tpm, shared)."""
        fail_closed = self.spec.policy.pacing.on_shared_state_error == "fail_closed"
        return self.shared.pace(self.router_key, info.id, fail_closed=fail_closed)
