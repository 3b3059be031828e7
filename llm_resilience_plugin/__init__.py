"""llm-resilience-plugin: retries, breakers, fallbacks, deadlines and a cost guard for LiteLLM's Router.

Importing this package sets ``LITELLM_LOCAL_MODEL_COST_MAP`` (LiteLLM's bundled price map) before
LiteLLM is imported, so nothing reaches the network at import time.
"""

from __future__ import annotations

from llm_resilience_plugin import _env  # noqa: F401  (must run before litellm is imported)
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
    ResilienceError,
    StreamInterruptedError,
    UnknownModelGroupError,
    classify,
)
from llm_resilience_plugin.events import AttemptRecord, CallReport
from llm_resilience_plugin.retry import Clock, FakeClock
from llm_resilience_plugin.router import ResilientRouter, ResilientStream, get_report

__version__ = "0.1.0"

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
    "ResilienceError",
    "ResiliencePolicy",
    "ResilientRouter",
    "ResilientStream",
    "RetryBudgetPolicy",
    "StreamInterruptedError",
    "UnknownModelGroupError",
    "classify",
    "get_report",
]
