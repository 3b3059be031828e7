"""A user's router YAML pointed at a running simulator, with scenario faults applied by selector:
what the pytest plugin's ``llm_chaos`` fixture hands a test (usable without pytest too).

A scenario's timeline runs on the harness's clock (the test's ``FakeClock``, else real time): its
phases start at ``at`` and end at ``until`` seconds after :meth:`ChaosHarness.apply`, and are put
on the simulator before each attempt the router makes (an :class:`AttemptGuard`), so advancing a
``FakeClock`` (or the router's own backoff and breaker waits on it) moves the incident along
instantly, as the chaos command's real-time runner would."""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path
from typing import Any

from llm_resilience_plugin._engine.clock import Clock
from llm_resilience_plugin.events import AttemptInfo
from llm_resilience_plugin.policy import offline_spec
from llm_resilience_plugin.routing import ResilientRouter
from llm_resilience_plugin.testing._fault_spec import behavior_from_data
from llm_resilience_plugin.testing._faults import Behavior
from llm_resilience_plugin.testing._simulator import ProviderSimulator, RequestRecord
from llm_resilience_plugin.testing.chaos._command import ChaosConfig, load_chaos_config, primary_group
from llm_resilience_plugin.testing.chaos._run import timeline_events
from llm_resilience_plugin.testing.chaos._scenario import Scenario, builtin_scenarios, load_scenario
from llm_resilience_plugin.testing.chaos._target import Target, simulated_target

__all__ = ["ChaosHarness", "TimelineGuard"]


class TimelineGuard:
    """An :class:`AttemptGuard` that brings the simulator up to date with the harness's timeline
    before every attempt (first tries, retries, fallbacks)."""

    def __init__(self, harness: ChaosHarness) -> None:
        self._harness = harness

    def before_attempt(self, info: AttemptInfo) -> None:
        """Apply the phases that are due."""
        self._harness.tick()

    def after_attempt(self, token: Any, **outcome: Any) -> None:
        """Nothing to settle."""


class ChaosHarness:
    """A :class:`ResilientRouter` built from a config whose deployments the simulator serves."""

    def __init__(
        self, config: ChaosConfig, sim: ProviderSimulator, *, clock: Any = None, model: str | None = None
    ) -> None:
        self.sim = sim
        self.config = config
        self.clock: Any = clock if clock is not None else Clock()
        self._pending: deque[tuple[float, str, Behavior]] = deque()
        self._started = self.clock.monotonic()
        self._lock = threading.Lock()
        primary = model or primary_group(config)
        self.target: Target = simulated_target(
            config.spec.model_list,
            base_url=sim.base_url,
            prefix="t",
            primary=primary,
            fallbacks=config.spec.fallback_chain(primary, None),
        )
        # Offline: no Redis, cache, webhook or real ledger of the config reaches the router.
        spec = offline_spec(config.spec.model_copy(update={"model_list": self.target.model_list}))
        self.router = ResilientRouter.from_spec(
            spec, clock=clock, seed=7, guards=[TimelineGuard(self)], shared_state=False
        )

    @classmethod
    def from_config(
        cls, path: str | Path, sim: ProviderSimulator, *, clock: Any = None, model: str | None = None
    ) -> ChaosHarness:
        """Load ``path`` as ``llm-resilience check`` does (``ConfigError`` on a mistake)."""
        return cls(load_chaos_config(str(path)), sim, clock=clock, model=model)

    @property
    def primary(self) -> str:
        """The model group a scenario's ``primary`` selector means."""
        return self.target.primary

    def fault(self, selector: str, fault: Behavior | dict[str, Any]) -> None:
        """Every deployment ``selector`` names answers ``fault`` (a Behavior or a fault mapping)."""
        behavior = fault if isinstance(fault, Behavior) else behavior_from_data(fault)
        for dep in self.target.select(selector):
            self.sim.set_default(dep.sim_name, behavior)

    def apply(self, scenario: str | Path | Scenario) -> Scenario:
        """Start a scenario's timeline now (a built-in name, a YAML path or a :class:`Scenario`):
        phases from ``at: 0`` apply at once, later ones when the clock reaches them, and a phase
        with ``until`` hands its deployments back to the scenario's ``healthy`` behaviour then.
        A second ``apply`` replaces what is left of the first timeline."""
        if isinstance(scenario, Scenario):
            chosen = scenario
        elif str(scenario).endswith((".yaml", ".yml")):
            chosen = load_scenario(scenario)
        else:
            by_name = {s.name: s for s in builtin_scenarios()}
            if str(scenario) not in by_name:
                raise ValueError(f"no built-in scenario {scenario!r}; choose from {', '.join(by_name)}")
            chosen = by_name[str(scenario)]
        events = timeline_events(self.target, chosen)
        with self._lock:
            self._started = self.clock.monotonic()
            self._pending = deque(events)
        self.tick()
        return chosen

    @property
    def elapsed(self) -> float:
        """Seconds on the harness's clock since the last :meth:`apply`."""
        return float(self.clock.monotonic() - self._started)

    def pending(self) -> int:
        """How many timeline changes are still to come."""
        return len(self._pending)

    def tick(self) -> None:
        """Put every timeline change that is due by now on the simulator (the router does this
        before each attempt; call it yourself before talking to the simulator directly)."""
        with self._lock:
            now = self.elapsed
            while self._pending and self._pending[0][0] <= now:
                _, name, behavior = self._pending.popleft()
                self.sim.set_default(name, behavior)

    def requests(self, selector: str = "all") -> list[RequestRecord]:
        """The simulator's log for the deployments ``selector`` names."""
        names = {d.sim_name for d in self.target.select(selector)}
        return [r for r in self.sim.requests() if r.deployment in names]

    def count(self, selector: str = "all") -> int:
        """How many requests reached the deployments ``selector`` names."""
        return len(self.requests(selector))

    def close(self) -> None:
        """Close the router."""
        self.router.close()
