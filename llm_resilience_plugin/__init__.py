"""llm-resilience-plugin: retries, breakers, fallbacks, deadlines and a cost guard for LiteLLM's Router.

Importing this package sets ``LITELLM_LOCAL_MODEL_COST_MAP`` (LiteLLM's bundled price map) before
LiteLLM is imported, so nothing reaches the network at import time. Names are loaded lazily: the
simulator and the config/error types do not pay LiteLLM's multi-second import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from llm_resilience_plugin import _env  # noqa: F401  (must run before litellm is imported)

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "BackoffPolicy": "config",
    "BreakerPolicy": "config",
    "ClassPolicy": "config",
    "GroupPolicy": "config",
    "ResiliencePolicy": "config",
    "RetryBudgetPolicy": "config",
    "AllRoutesFailedError": "errors",
    "BudgetExceededError": "errors",
    "CircuitOpenError": "errors",
    "ConfigError": "errors",
    "DeadlineExceededError": "errors",
    "ErrorClass": "errors",
    "LoadShedError": "errors",
    "ResilienceError": "errors",
    "StreamInterruptedError": "errors",
    "UnknownModelGroupError": "errors",
    "classify": "errors",
    "AttemptRecord": "events",
    "CallReport": "events",
    "StreamRestart": "events",
    "Clock": "retry",
    "FakeClock": "retry",
    "ResilientRouter": "router",
    "get_report": "router",
    "ResilientStream": "streams",
}

__all__ = [
    "AllRoutesFailedError",
    "AttemptRecord",
    "BackoffPolicy",
    "BreakerPolicy",
    "BudgetExceededError",
    "CallReport",
    "CircuitOpenError",
    "ClassPolicy",
    "Clock",
    "ConfigError",
    "DeadlineExceededError",
    "ErrorClass",
    "FakeClock",
    "GroupPolicy",
    "LoadShedError",
    "ResilienceError",
    "ResiliencePolicy",
    "ResilientRouter",
    "ResilientStream",
    "RetryBudgetPolicy",
    "StreamInterruptedError",
    "StreamRestart",
    "UnknownModelGroupError",
    "classify",
    "get_report",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'llm_resilience_plugin' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"llm_resilience_plugin.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:
    from llm_resilience_plugin.config import (
        BackoffPolicy,
        BreakerPolicy,
        ClassPolicy,
        GroupPolicy,
        ResiliencePolicy,
        RetryBudgetPolicy,
    )
    from llm_resilience_plugin.errors import (
        AllRoutesFailedError,
        BudgetExceededError,
        CircuitOpenError,
        ConfigError,
        DeadlineExceededError,
        ErrorClass,
        LoadShedError,
        ResilienceError,
        StreamInterruptedError,
        UnknownModelGroupError,
        classify,
    )
    from llm_resilience_plugin.events import AttemptRecord, CallReport, StreamRestart
    from llm_resilience_plugin.retry import Clock, FakeClock
    from llm_resilience_plugin.router import ResilientRouter, get_report
    from llm_resilience_plugin.streams import ResilientStream
