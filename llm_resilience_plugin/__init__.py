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
    "Budget": "cost",
    "CostGuard": "cost",
    "BudgetAlert": "cost",
    "CostGuardCallbackHandler": "callbacks",
    "StructuredLogCallbackHandler": "callbacks",
    "JsonFormatter": "logs",
    "attach_router_logging": "logs",
    "MetricsCollector": "metrics",
    "MemoryLedger": "ledger",
    "SQLiteLedger": "ledger",
}

__all__ = [
    "AllRoutesFailedError",
    "AttemptRecord",
    "BackoffPolicy",
    "BreakerPolicy",
    "Budget",
    "BudgetAlert",
    "BudgetExceededError",
    "CallReport",
    "CircuitOpenError",
    "ClassPolicy",
    "Clock",
    "ConfigError",
    "CostGuard",
    "CostGuardCallbackHandler",
    "DeadlineExceededError",
    "ErrorClass",
    "FakeClock",
    "GroupPolicy",
    "JsonFormatter",
    "LoadShedError",
    "MemoryLedger",
    "MetricsCollector",
    "ResilienceError",
    "ResiliencePolicy",
    "ResilientRouter",
    "ResilientStream",
    "RetryBudgetPolicy",
    "SQLiteLedger",
    "StreamInterruptedError",
    "StreamRestart",
    "StructuredLogCallbackHandler",
    "UnknownModelGroupError",
    "attach_router_logging",
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
    from llm_resilience_plugin.callbacks import CostGuardCallbackHandler, StructuredLogCallbackHandler
    from llm_resilience_plugin.config import (
        BackoffPolicy,
        BreakerPolicy,
        ClassPolicy,
        GroupPolicy,
        ResiliencePolicy,
        RetryBudgetPolicy,
    )
    from llm_resilience_plugin.cost import Budget, BudgetAlert, CostGuard
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
    from llm_resilience_plugin.ledger import MemoryLedger, SQLiteLedger
    from llm_resilience_plugin.logs import JsonFormatter, attach_router_logging
    from llm_resilience_plugin.metrics import MetricsCollector
    from llm_resilience_plugin.retry import Clock, FakeClock
    from llm_resilience_plugin.router import ResilientRouter, get_report
    from llm_resilience_plugin.streams import ResilientStream
