"""Chaos testing for a user's own config: scenario files, the runner behind ``llm-resilience chaos``."""

from llm_resilience_plugin.testing.chaos._command import ChaosConfig, load_chaos_config, run_chaos
from llm_resilience_plugin.testing.chaos._metrics import Metrics, measure
from llm_resilience_plugin.testing.chaos._report import ChaosSettings, chaos_problems
from llm_resilience_plugin.testing.chaos._run import CallResult, RunResult, run_scenario
from llm_resilience_plugin.testing.chaos._scenario import (
    Phase,
    Scenario,
    builtin_scenarios,
    load_scenario,
    scenario_from_mapping,
)

__all__ = [
    "CallResult",
    "ChaosConfig",
    "ChaosSettings",
    "Metrics",
    "Phase",
    "RunResult",
    "Scenario",
    "builtin_scenarios",
    "chaos_problems",
    "load_chaos_config",
    "load_scenario",
    "measure",
    "run_chaos",
    "run_scenario",
    "scenario_from_mapping",
]
