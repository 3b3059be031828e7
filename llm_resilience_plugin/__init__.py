"""llm-resilience-plugin: retries, breakers, fallbacks, deadlines and a cost guard for LiteLLM's Router.

Importing this package sets ``LITELLM_LOCAL_MODEL_COST_MAP`` (LiteLLM's bundled price map) before
LiteLLM is imported, so nothing reaches the network at import time. Names are loaded lazily, so
the policy and error types do not pay LiteLLM's multi-second import.

The names below are the whole top-level surface; everything else lives in the subpackage named
for its concern: ``policy``, ``events``, ``routing``, ``cost``, ``shared_state``,
``observability``, ``langchain`` and ``testing``.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from llm_resilience_plugin import _env  # noqa: F401  (must run before litellm is imported)

logging.getLogger("llm_resilience").addHandler(logging.NullHandler())  # a library prints no log itself

# The installed distribution's version, read on first access (importlib.metadata costs ~20 ms).
__version__: str

# The one source of truth for the top-level names: name -> the module that defines it.
# tests/unit/test_exported_members.py keeps __all__, this table and the TYPE_CHECKING block equal.
_EXPORTS: dict[str, str] = {
    "ResilientRouter": "routing",
    "get_report": "routing",
    "CallReport": "events",
    "ResiliencePolicy": "policy",
    "ErrorClass": "errors",
    "ResilienceError": "errors",
    "ConfigError": "errors",
    "AllRoutesFailedError": "errors",
    "DeadlineExceededError": "errors",
    "CircuitOpenError": "errors",
    "BudgetExceededError": "errors",
    "StreamInterruptedError": "errors",
    "LoadShedError": "errors",
    "CostGuard": "cost",
    "Budget": "cost",
}

__all__ = [
    "AllRoutesFailedError",
    "Budget",
    "BudgetExceededError",
    "CallReport",
    "CircuitOpenError",
    "ConfigError",
    "CostGuard",
    "DeadlineExceededError",
    "ErrorClass",
    "LoadShedError",
    "ResilienceError",
    "ResiliencePolicy",
    "ResilientRouter",
    "StreamInterruptedError",
    "get_report",
]


def _version() -> str:
    """The version of the installed ``llm-resilience-plugin``; ``0+unknown`` in a bare source tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llm-resilience-plugin")
    except PackageNotFoundError:
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = _version()
        return globals()[name]
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'llm_resilience_plugin' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"llm_resilience_plugin.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, "__version__"})


if TYPE_CHECKING:
    from llm_resilience_plugin.cost import Budget, CostGuard
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
    )
    from llm_resilience_plugin.events import CallReport
    from llm_resilience_plugin.policy import ResiliencePolicy
    from llm_resilience_plugin.routing import ResilientRouter, get_report
