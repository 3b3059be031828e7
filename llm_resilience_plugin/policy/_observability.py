"""The policy's ``observability:`` section: which exporters a router turns on when it is built.

``otel`` / ``prometheus`` take ``auto`` (on when the package imports), ``on`` (required: a
:class:`ConfigError` naming the extra when missing) or ``off``; the router applies them with
:func:`llm_resilience_plugin.observability.instrument` at construction.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ObservabilitySwitch = Literal["auto", "on", "off"]


class ObservabilityPolicy(BaseModel):
    """``observability: {otel: auto|on|off, prometheus: auto|on|off, capture_content: false,
    budget_scope_values: false}``."""

    # The policy's strictness (policy/_models.py Model), restated: that module imports this one.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, strict=True)

    otel: ObservabilitySwitch = Field(
        default="auto", description="OpenTelemetry traces and metrics (the `otel` extra)."
    )
    prometheus: ObservabilitySwitch = Field(
        default="auto", description="Prometheus metrics in the default registry (the `prometheus` extra)."
    )
    capture_content: bool = Field(default=False, description="Put message content on spans (opt-in).")
    budget_scope_values: bool = Field(
        default=False,
        description="A scoped cost budget's gauges per scope value (a tenant becomes a label; opt-in).",
    )

    @field_validator("otel", "prometheus", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: Any) -> Any:
        """YAML reads a bare ``on`` / ``off`` as true / false: take them as the switch meant."""
        if isinstance(value, bool):
            return "on" if value else "off"
        return value
