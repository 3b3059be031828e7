"""llm-resilience-plugin: retries, breakers, fallbacks, deadlines and cost guard for LiteLLM's Router."""

from __future__ import annotations

from llm_resilience_plugin import _env  # noqa: F401  (must run before litellm is imported)

__version__ = "0.1.0"
