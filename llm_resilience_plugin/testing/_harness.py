"""A user's router YAML pointed at a running simulator, with scenario faults applied by selector:
what the pytest plugin's ``llm_chaos`` fixture hands a test (usable without pytest too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llm_resilience_plugin.routing import ResilientRouter
from llm_resilience_plugin.testing._fault_spec import behavior_from_data
from llm_resilience_plugin.testing._faults import Behavior
from llm_resilience_plugin.testing._simulator import ProviderSimulator, RequestRecord
from llm_resilience_plugin.testing.chaos._command import ChaosConfig, load_chaos_config, primary_group
from llm_resilience_plugin.testing.chaos._scenario import Scenario, builtin_scenarios, load_scenario
from llm_resilience_plugin.testing.chaos._target import Target, simulated_target

__all__ = ["ChaosHarness"]


class ChaosHarness:
    """A :class:`ResilientRouter` built from a config whose deployments the simulator serves."""

    def __init__(
        self, config: ChaosConfig, sim: ProviderSimulator, *, clock: Any = None, model: str | None = None
    ) -> None:
        self.sim = sim
        self.config = config
        primary = model or primary_group(config)
        self.target: Target = simulated_target(
            config.spec.model_list,
            base_url=sim.base_url,
            prefix="t",
            primary=primary,
            fallbacks=config.spec.fallback_chain(primary, None),
        )
        spec = config.spec.model_copy(update={"model_list": self.target.model_list})
        self.router = ResilientRouter.from_spec(spec, clock=clock, seed=7, shared_state=False)

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
        """Apply a scenario's faults as they stand at its start (phases from ``at: 0``): a built-in
        name, a YAML path or a :class:`Scenario`. Later phases are the chaos command's business."""
        if isinstance(scenario, Scenario):
            chosen = scenario
        elif str(scenario).endswith((".yaml", ".yml")):
            chosen = load_scenario(scenario)
        else:
            by_name = {s.name: s for s in builtin_scenarios()}
            if str(scenario) not in by_name:
                raise ValueError(f"no built-in scenario {scenario!r}; choose from {', '.join(by_name)}")
            chosen = by_name[str(scenario)]
        for selector, phases in chosen.timeline.items():
            for phase in phases:
                if phase.at <= 0:
                    self.fault(selector, phase.fault.behavior())
        return chosen

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
