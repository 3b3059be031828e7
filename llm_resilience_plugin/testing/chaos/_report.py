"""The scorecard: the config's ``chaos:`` thresholds, the side-by-side table, the JSON document."""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.testing.chaos._metrics import Metrics

__all__ = [
    "MIN_SAMPLE",
    "ChaosSettings",
    "Row",
    "chaos_settings",
    "render_html_table",
    "render_table",
    "threshold_failures",
    "to_json",
]

MIN_SAMPLE = 20  # calls below which a run's p50/p99 are one or two calls' latency, not a percentile


class ChaosSettings(BaseModel):
    """The config's ``chaos:`` section: the thresholds the plugin must meet on every gated
    scenario (the command exits 1 when one is missed), and the group the calls ask for."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    min_success: float | None = Field(default=None, ge=0, le=1)
    max_p99_s: float | None = Field(default=None, gt=0)
    max_upstream_per_call: float | None = Field(default=None, gt=0)
    max_to_dead_route: int | None = Field(default=None, ge=0)
    model: str | None = Field(default=None, description="The model group the calls ask for.")


def chaos_settings(raw: Any) -> ChaosSettings:
    """The ``chaos:`` section of a parsed config (``ConfigError`` naming the field)."""
    section = raw.get("chaos") if isinstance(raw, Mapping) else None
    try:
        return ChaosSettings.model_validate(section or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"chaos.{where}", str(first["msg"]).removeprefix("Value error, ")) from None


@dataclass(frozen=True)
class Row:
    """One scenario: its description, both systems' numbers, the plugin's advice."""

    scenario: str
    description: str
    gate: bool
    plugin: Metrics
    litellm: Metrics
    advice: list[str]


def threshold_failures(rows: list[Row], settings: ChaosSettings) -> list[str]:
    """Every threshold the plugin missed on a gated scenario, one line each."""
    out = []
    for row in rows:
        if not row.gate:
            continue
        m = row.plugin
        if settings.min_success is not None and m.success_rate < settings.min_success:
            out.append(f"{row.scenario}: success {m.success_rate:.1%} < min_success {settings.min_success:g}")
        if settings.max_p99_s is not None and m.p99_s > settings.max_p99_s:
            out.append(f"{row.scenario}: p99 {m.p99_s:.2f} s > max_p99_s {settings.max_p99_s:g}")
        limit = settings.max_upstream_per_call
        if limit is not None and m.upstream_per_call > limit:
            out.append(
                f"{row.scenario}: {m.upstream_per_call:.2f} upstream/call > max_upstream_per_call {limit:g}"
            )
        dead = settings.max_to_dead_route
        if dead is not None and m.to_dead_route > dead:
            out.append(
                f"{row.scenario}: {m.to_dead_route} requests to a dead route > max_to_dead_route {dead}"
            )
    return out


def _recover(m: Metrics) -> str:
    if m.observed_after_recovery_s is None:
        return "-"
    if m.recover_s is None:
        return f"never (>{m.observed_after_recovery_s:.0f})"
    return f"{m.recover_s:.1f}"


HEADINGS = ("scenario", "system", "calls", "success", "p50 s", "p99 s", "upstream/call",
            "to dead route", "recover s", "spend $")  # fmt: skip
SMALL_SAMPLE_NOTE = (
    f"~ fewer than {MIN_SAMPLE} calls: p50/p99 are single calls' latencies, not a percentile "
    "(inconclusive; a scenario file with more calls gives a real one)"
)


def _latency(value: float, m: Metrics) -> str:
    return f"~{value:.2f}" if m.calls < MIN_SAMPLE else f"{value:.2f}"


def _cells(rows: list[Row]) -> list[list[str]]:
    """The table's cells, one list per scenario and system (the text and HTML tables share them)."""
    out = []
    for row in rows:
        for system, m in (("plugin", row.plugin), ("litellm", row.litellm)):
            out.append([
                row.scenario if system == "plugin" else "", system, str(m.calls), f"{m.success_rate:.0%}",
                _latency(m.p50_s, m), _latency(m.p99_s, m), f"{m.upstream_per_call:.2f}",
                str(m.to_dead_route), _recover(m), f"{m.spend:.6f}",
            ])  # fmt: skip
    return out


def _small(rows: list[Row]) -> bool:
    return any(m.calls < MIN_SAMPLE for r in rows for m in (r.plugin, r.litellm))


def render_table(rows: list[Row]) -> str:
    """The side-by-side table (Markdown): one line per scenario and system, and a note when a
    run's sample is too small for its percentiles to mean much."""
    lines = ["| " + " | ".join(HEADINGS) + " |", "|---|---|" + "---:|" * (len(HEADINGS) - 2)]
    lines += ["| " + " | ".join(cells) + " |" for cells in _cells(rows)]
    if _small(rows):
        lines.append(f"\n{SMALL_SAMPLE_NOTE}")
    return "\n".join(lines)


def render_html_table(rows: list[Row]) -> str:
    """The same table as an HTML ``<table>`` (for the ``--plot x.html`` report)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADINGS)
    body = []
    for cells in _cells(rows):
        tds = "".join(
            f"<td>{html.escape(c)}</td>" if i < 2 else f"<td class='num'>{html.escape(c)}</td>"
            for i, c in enumerate(cells)
        )
        body.append(f"<tr class='{'first' if cells[0] else 'second'}'>{tds}</tr>")
    note = f"<p class='note'>{html.escape(SMALL_SAMPLE_NOTE)}</p>" if _small(rows) else ""
    return (
        f"<table class='scorecard'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{note}"
    )


def to_json(
    config: str, rows: list[Row], settings: ChaosSettings, failures: list[str], wall_s: float
) -> dict[str, Any]:
    """The JSON document ``--json`` writes."""
    return {
        "config": config,
        "thresholds": settings.model_dump(exclude_none=True),
        "passed": not failures,
        "failures": failures,
        "wall_s": round(wall_s, 2),
        "scenarios": [
            {
                "name": r.scenario,
                "description": r.description,
                "gate": r.gate,
                "plugin": r.plugin.to_dict(),
                "litellm": r.litellm.to_dict(),
                "advice": r.advice,
            }
            for r in rows
        ],
    }
