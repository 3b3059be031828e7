"""Offline testing: the fault-injecting provider simulator and a clock that sleeps instantly."""

from llm_resilience_plugin._engine.clock import Clock, FakeClock
from llm_resilience_plugin.testing._endpoints import embedding_vector
from llm_resilience_plugin.testing._fault_spec import FaultSpec
from llm_resilience_plugin.testing._harness import ChaosHarness
from llm_resilience_plugin.testing._simulator import (
    Behavior,
    Fault,
    ProviderSimulator,
    RequestRecord,
    estimate_prompt_tokens,
    estimate_tokens,
)

__all__ = [
    "Behavior",
    "ChaosHarness",
    "Clock",
    "FakeClock",
    "Fault",
    "FaultSpec",
    "ProviderSimulator",
    "RequestRecord",
    "embedding_vector",
    "estimate_prompt_tokens",
    "estimate_tokens",
]
