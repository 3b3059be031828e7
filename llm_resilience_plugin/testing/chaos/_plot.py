"""The timeline plot: per scenario and system, one row per deployment with each upstream request
(green answered, red failed), the plugin's breaker states as bands, and the calls' outcomes.

matplotlib is optional (the ``notebooks`` extra): without it a ``.png`` is a clear error.
``.html`` writes a page with the scorecard (an HTML table), its advice and an interactive timeline
per scenario (inline SVG from :mod:`._svg`: hover a call, a request or a breaker band for its
details; no matplotlib needed),
and the static figure below it when matplotlib is installed.
"""

from __future__ import annotations

import base64
import html
import importlib.util
import io
from pathlib import Path
from typing import Any

from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.testing.chaos._metrics import request_failed, served_by
from llm_resilience_plugin.testing.chaos._report import Row, render_html_table
from llm_resilience_plugin.testing.chaos._run import RunResult
from llm_resilience_plugin.testing.chaos._svg import PAGE_SCRIPT, PAGE_STYLE, timeline_svg

__all__ = ["check_plot_path", "write_plot"]

_STATE_COLOURS = {"open": "#f4a6a6", "half_open": "#f9d99a"}


def _axes_for(ax: Any, run: RunResult) -> None:
    deps = run.target.deployments
    rows = {d.sim_name: i for i, d in enumerate(deps)}
    calls_row = len(deps)
    end = max([c.end for c in run.calls] + [run.offset(r) for r in run.requests] + [0.1])
    by_id = {d.id: rows[d.sim_name] for d in deps}
    # Breaker bands (the plugin only): from each transition to the next of the same deployment.
    per_dep: dict[str, list[tuple[float, str]]] = {}
    for dep_id, t, state in run.transitions:
        per_dep.setdefault(dep_id, []).append((t, state))
    for dep_id, changes in per_dep.items():
        row = by_id.get(dep_id)
        if row is None:
            continue
        for (t, state), nxt in zip(changes, [*changes[1:], (end, "closed")], strict=True):
            colour = _STATE_COLOURS.get(state)
            if colour is not None:
                ax.fill_between([t, nxt[0]], row - 0.4, row + 0.4, color=colour, linewidth=0)
    ok_x: list[float] = []
    ok_y: list[int] = []
    bad_x: list[float] = []
    bad_y: list[int] = []
    for r in run.requests:
        row = rows.get(r.deployment)
        if row is None:
            continue
        (bad_x if request_failed(r) else ok_x).append(run.offset(r))
        (bad_y if request_failed(r) else ok_y).append(row)
    ax.scatter(ok_x, ok_y, s=10, color="#2e8b57", marker="|", label="answered")
    ax.scatter(bad_x, bad_y, s=14, color="#c0392b", marker="x", label="failed")
    served = served_by(run)
    for c in run.calls:
        dep = served.get(c.tag)
        colour = "#2e8b57" if c.ok else "#c0392b"
        ax.plot([c.start, c.end], [calls_row, calls_row], color=colour, linewidth=1, alpha=0.5)
        if c.ok and dep is not None:
            ax.plot([c.end], [calls_row], marker=".", color=colour, markersize=3)
    ax.set_yticks(range(len(deps) + 1), [f"{d.group}/{d.id}" for d in deps] + ["calls"], fontsize=7)
    ax.set_ylim(-0.6, calls_row + 0.6)
    ax.set_xlim(0, end * 1.02)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(f"{run.scenario.name} - {run.system}", fontsize=8)


_NEEDS_MATPLOTLIB = "a .png needs matplotlib (pip install matplotlib, or the notebooks extra); .html does not"


def check_plot_path(path: str) -> None:
    """Refuse a ``--plot`` path before anything runs: a suffix other than .png/.html, or a .png
    without matplotlib installed."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".png", ".html", ".htm"):
        raise ConfigError("--plot", f"expected a .png or .html path, got {path!r}")
    if suffix == ".png" and importlib.util.find_spec("matplotlib") is None:
        raise ConfigError("--plot", _NEEDS_MATPLOTLIB)


def _figure(runs: list[tuple[RunResult, RunResult]]) -> bytes:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot", _NEEDS_MATPLOTLIB) from None
    rows = max(1, len(runs))
    fig, axes = plt.subplots(rows, 2, figsize=(12, 1.9 * rows), squeeze=False, sharex="row")
    for i, (plugin, plain) in enumerate(runs):
        _axes_for(axes[i][0], plugin)
        _axes_for(axes[i][1], plain)
    axes[0][0].legend(loc="upper right", fontsize=6)
    fig.supxlabel("seconds from the scenario's start (breaker bands: red open, amber half-open)", fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return buffer.getvalue()


def write_plot(path: str, runs: list[tuple[RunResult, RunResult]], rows: list[Row]) -> Path:
    """Write the timeline to ``path`` (``.png``, or ``.html`` with the scorecard as a table and
    its advice); returns the path."""
    check_plot_path(path)
    out = Path(path)
    if out.suffix.lower() == ".png":
        out.write_bytes(_figure(runs))
        return out
    out.write_text(_page(runs, rows))
    return out


def _page(runs: list[tuple[RunResult, RunResult]], rows: list[Row]) -> str:
    """The HTML report: the table, the advice, the interactive timelines, the static figure if
    available."""
    tips = [tip for row in rows for tip in row.advice]
    advice = (
        "<h2>Advice</h2><ul>" + "".join(f"<li>{html.escape(t)}</li>" for t in tips) + "</ul>" if tips else ""
    )
    parts = [
        "<!doctype html><meta charset='utf-8'><title>llm-resilience chaos</title>",
        f"<style>{PAGE_STYLE}</style>",
        f"<h1>llm-resilience chaos</h1>{render_html_table(rows)}{advice}",
        "<p class='legend'>Hover any mark for its details.",
        "<span style='background:#2e8b57'></span>answered <span style='background:#c0392b'></span>failed",
        "<span style='background:#f4a6a6'></span>breaker open",
        "<span style='background:#f9d99a'></span>half-open</p>",
    ]
    for plugin, plain in runs:
        name = html.escape(plugin.scenario.name)
        description = html.escape(plugin.scenario.description)
        parts.append(f"<section><h2>{name}</h2><p>{description}</p><div class='pair'>")
        for run in (plugin, plain):
            parts.append(
                f"<figure><figcaption>{html.escape(run.system)}</figcaption>{timeline_svg(run)}</figure>"
            )
        parts.append("</div></section>")
    try:
        image = base64.b64encode(_figure(runs)).decode()
    except ConfigError:  # no matplotlib: the interactive timelines are the report
        image = None
    if image is not None:
        parts.append(
            "<details><summary>Static figure</summary>"
            f"<img alt='timeline' style='max-width:100%' src='data:image/png;base64,{image}'></details>"
        )
    parts.append(f"<div id='tip'></div><script>{PAGE_SCRIPT}</script>\n")
    return "".join(parts)
