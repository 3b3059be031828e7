"""Structured JSON logs, in-process metrics, and OpenTelemetry / Prometheus instrumentation
(:func:`instrument`) of calls, attempts and breakers."""

from llm_resilience_plugin.observability._from_policy import apply_observability
from llm_resilience_plugin.observability._instrumentation import instrument
from llm_resilience_plugin.observability._logs import (
    JsonFormatter,
    RouterEventLogger,
    RouterObserver,
    attach_router_logging,
    configure_json_logging,
    iso_ts,
    provider_of,
    redact,
    register_secret,
    safe_metadata,
)
from llm_resilience_plugin.observability._metrics import (
    MetricsCollector,
    MetricsSummary,
    percentile,
    summarize,
)

__all__ = [
    "JsonFormatter",
    "MetricsCollector",
    "MetricsSummary",
    "RouterEventLogger",
    "RouterObserver",
    "apply_observability",
    "attach_router_logging",
    "configure_json_logging",
    "instrument",
    "iso_ts",
    "percentile",
    "provider_of",
    "redact",
    "register_secret",
    "safe_metadata",
    "summarize",
]
