"""The interactive timeline of the HTML report: one inline SVG per scenario and system, drawn
without any plotting library, where every mark says what it is on hover.

Rows: one per deployment (each upstream request a tick, green answered, red failed; the plugin's
breaker states as bands, red open, amber half-open), then the calls, one lane each (a bar from
start to end). Hovering a mark shows its details (a native tooltip and the line under the figure):
for a call its outcome, latency and the deployment that answered it; for a request its deployment,
time, behaviour and status; for a band the breaker state and when.
"""

from __future__ import annotations

import html
import math

from llm_resilience_plugin.testing.chaos._metrics import request_failed, served_by
from llm_resilience_plugin.testing.chaos._run import RunResult

__all__ = ["PAGE_SCRIPT", "PAGE_STYLE", "timeline_svg"]

_LABEL_W = 150
_PLOT_W = 520
_ROW_H = 20
_LANE_H = 4
_MAX_LANES = 80
_AXIS_H = 22
_OK, _BAD = "#2e8b57", "#c0392b"
_BANDS = {"open": "#f4a6a6", "half_open": "#f9d99a"}

PAGE_STYLE = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
pre{font-size:12px;background:#f6f6f6;padding:.6em;overflow:auto}
section{margin:1.2em 0}.pair{display:flex;flex-wrap:wrap;gap:1.2em}figure{margin:0}
svg text{font:10px system-ui,sans-serif;fill:#333}
svg [data-tip]{cursor:crosshair}svg [data-tip]:hover{stroke:#000;stroke-width:1}
#tip{position:sticky;bottom:0;background:#fffbe6;border-top:1px solid #ccc;padding:.4em;
min-height:1.3em;font-size:13px}
.legend span{display:inline-block;width:.9em;height:.9em;margin:0 .3em 0 1em;vertical-align:middle}
table.scorecard{border-collapse:collapse;font-size:13px}
.scorecard th,.scorecard td{padding:.2em .6em;border-bottom:1px solid #ddd;text-align:left}
.scorecard td.num{text-align:right;font-variant-numeric:tabular-nums}
.scorecard tr.first td{border-top:1px solid #999}.note{font-size:12px;color:#555}
"""

PAGE_SCRIPT = """
document.addEventListener('mouseover', function (e) {
  var t = e.target.closest && e.target.closest('[data-tip]');
  if (t) { document.getElementById('tip').textContent = t.getAttribute('data-tip'); }
});
"""


def _tip(text: str) -> str:
    safe = html.escape(text, quote=True)
    return f' data-tip="{safe}"><title>{html.escape(text)}</title>'


def _ticks(end: float) -> list[float]:
    raw = end / 6 if end > 0 else 1.0
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(int(end / step) + 1)]


def timeline_svg(run: RunResult) -> str:
    """One run's timeline as an inline ``<svg>`` (see module docs)."""
    deps = run.target.deployments
    rows = {d.sim_name: i for i, d in enumerate(deps)}
    label = {d.sim_name: f"{d.group}/{d.id}" for d in deps}
    by_id = {d.id: d.sim_name for d in deps}
    end = max([c.end for c in run.calls] + [run.offset(r) for r in run.requests] + [0.1]) * 1.02
    lanes = min(len(run.calls), _MAX_LANES) or 1
    calls_top = len(deps) * _ROW_H + 6
    height = calls_top + lanes * _LANE_H + 6 + _AXIS_H
    width = _LABEL_W + _PLOT_W + 10

    def x(t: float) -> float:
        return round(_LABEL_W + max(0.0, t) / end * _PLOT_W, 1)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="{html.escape(run.scenario.name)} on {run.system}">'
    ]
    for i, d in enumerate(deps):
        y = i * _ROW_H
        name = html.escape(f"{label[d.sim_name]} ({d.provider})")
        out.append(f'<rect x="{_LABEL_W}" y="{y + 1}" width="{_PLOT_W}" height="{_ROW_H - 2}" fill="#eee"/>')
        out.append(f'<text x="4" y="{y + 14}">{name}</text>')
    out.append(f'<text x="4" y="{calls_top + 10}">calls ({len(run.calls)})</text>')
    # Breaker bands, from each transition to the next of the same deployment.
    changes: dict[str, list[tuple[float, str]]] = {}
    for dep_id, t, state in run.transitions:
        changes.setdefault(dep_id, []).append((t, state))
    for dep_id, seq in changes.items():
        sim_name = by_id.get(dep_id)
        if sim_name is None:
            continue
        for (t, state), (t_next, _) in zip(seq, [*seq[1:], (end, "closed")], strict=True):
            colour = _BANDS.get(state)
            if colour is None:
                continue
            y = rows[sim_name] * _ROW_H + 1
            tip = f"breaker of {label[sim_name]} {state.replace('_', '-')} from {t:.2f} s to {t_next:.2f} s"
            out.append(
                f'<rect x="{x(t)}" y="{y}" width="{max(1.0, x(t_next) - x(t))}" height="{_ROW_H - 2}" '
                f'fill="{colour}"{_tip(tip)}</rect>'
            )
    for r in run.requests:
        row = rows.get(r.deployment)
        if row is None:
            continue
        failed = request_failed(r)
        took = f", took {r.finished_at - r.started_at:.3f} s" if r.finished_at is not None else ""
        tip = (
            f"request to {label[r.deployment]} at {run.offset(r):.3f} s: {r.behavior}, "
            f"status {r.status if r.status is not None else 'none (dropped)'}{took}"
        )
        out.append(
            f'<rect x="{x(run.offset(r)) - 1}" y="{row * _ROW_H + 3}" width="3" height="{_ROW_H - 6}" '
            f'fill="{_BAD if failed else _OK}"{_tip(tip)}</rect>'
        )
    served = served_by(run)
    for i, c in enumerate(sorted(run.calls, key=lambda c: c.start)):
        dep = served.get(c.tag)
        where = f"answered by {dep.group}/{dep.id}" if dep is not None else "no deployment answered"
        outcome = "ok" if c.ok else f"failed ({c.error})"
        tip = (
            f"call {c.tag}: {outcome}, latency {c.latency:.3f} s (from {c.start:.3f} s), {where}, "
            f"tokens {c.prompt_tokens}+{c.completion_tokens}"
        )
        y = calls_top + (i % _MAX_LANES) * _LANE_H
        out.append(
            f'<rect x="{x(c.start)}" y="{y}" width="{max(1.5, x(c.end) - x(c.start))}" '
            f'height="{_LANE_H - 1}" fill="{_OK if c.ok else _BAD}" fill-opacity="0.7"{_tip(tip)}</rect>'
        )
    axis_y = height - _AXIS_H + 4
    out.append(f'<line x1="{_LABEL_W}" x2="{_LABEL_W + _PLOT_W}" y1="{axis_y}" y2="{axis_y}" stroke="#999"/>')
    for t in _ticks(end):
        out.append(f'<line x1="{x(t)}" x2="{x(t)}" y1="{axis_y}" y2="{axis_y + 4}" stroke="#999"/>')
        out.append(f'<text x="{x(t)}" y="{axis_y + 15}" text-anchor="middle">{t:g} s</text>')
    out.append("</svg>")
    return "".join(out)
