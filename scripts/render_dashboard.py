"""Render docs/img/dashboard.png: the Grafana dashboard docs/grafana/llm-resilience.json evaluated
over Prometheus samples collected from a simulator run with faults (no Grafana involved).

Traffic runs through a ResilientRouter instrumented into a private CollectorRegistry; after each
tick the registry is scraped and stamped with a virtual time (``--tick`` seconds apart, so a
``[5m]`` window spans 20 ticks). Each panel's PromQL is evaluated by the small evaluator below,
which supports exactly the forms the dashboard uses: selectors with ``=``/``!=`` matchers,
``rate``/``increase`` over a range, ``sum``/``max`` with ``by (...)``, ``histogram_quantile`` and
``/`` between two scalars or vectors. Then matplotlib draws the panels.

    .venv/bin/python scripts/render_dashboard.py [--ticks 60] [--calls-per-tick 12]

Needs prometheus-client (the ``prometheus`` extra) and matplotlib (the ``notebooks`` extra).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
from pathlib import Path
from typing import Any

import llm_resilience_plugin  # noqa: F401  (offline LiteLLM settings first)
from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin.cost import Budget, CostGuard
from llm_resilience_plugin.observability import instrument
from llm_resilience_plugin.testing import Fault, ProviderSimulator

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "docs" / "grafana" / "llm-resilience.json"
Labels = frozenset[tuple[str, str]]
Vector = dict[Labels, float]
Scrape = tuple[float, dict[tuple[str, Labels], float]]  # (virtual time, samples)


def scrape(registry: Any, t: float) -> Scrape:
    samples: dict[tuple[str, Labels], float] = {}
    for family in registry.collect():
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return t, samples


# -- a PromQL evaluator for the dashboard's expressions -------------------------------------------

_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _split_args(text: str) -> list[str]:
    depth, start, out = 0, 0, []
    for i, ch in enumerate(text):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:].strip())
    return out


def _matching_paren(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        depth += text[i] == "("
        depth -= text[i] == ")"
        if depth == 0:
            return i
    raise ValueError(f"unbalanced parentheses in {text!r}")


def _select(name: str, matchers: str, samples: dict[tuple[str, Labels], float]) -> Vector:
    tests = re.findall(r'(\w+)\s*(!?=)\s*"([^"]*)"', matchers)
    out: Vector = {}
    for (sample_name, labels), value in samples.items():
        d = dict(labels)
        if sample_name == name and all((d.get(k, "") == v) == (op == "=") for k, op, v in tests):
            out[labels] = value
    return out


def evaluate(expr: str, history: list[Scrape], at: int) -> Vector:
    """``expr`` at scrape index ``at`` (instant vector: label set -> value; {} when empty)."""
    expr = expr.strip()
    depth = 0
    for i in range(len(expr) - 1, -1, -1):  # a top-level division
        depth += expr[i] == ")"
        depth -= expr[i] == "("
        if expr[i] == "/" and depth == 0:
            left, right = evaluate(expr[:i], history, at), evaluate(expr[i + 1 :], history, at)
            if set(left) == {frozenset()} or set(right) == {frozenset()} or set(left) == set(right):
                return {k: v / right.get(k, right.get(frozenset(), math.nan)) for k, v in left.items()}
            return {}
    m = re.match(r"(sum|max)\s*(?:by\s*\(([^)]*)\))?\s*\(", expr)
    if m:
        end = _matching_paren(expr, m.end() - 1)
        inner = evaluate(expr[m.end() : end], history, at)
        keys = [k.strip() for k in (m.group(2) or "").split(",") if k.strip()]
        out: Vector = {}
        for labels, value in inner.items():
            key = frozenset((k, v) for k, v in labels if k in keys)
            out[key] = (
                value
                if key not in out
                else (out[key] + value if m.group(1) == "sum" else max(out[key], value))
            )
        return out
    m = re.match(r"histogram_quantile\s*\(", expr)
    if m:
        q_text, inner_text = _split_args(expr[m.end() : _matching_paren(expr, m.end() - 1)])
        return _quantile(float(q_text), evaluate(inner_text, history, at))
    m = re.match(r"(rate|increase)\s*\(\s*(\w+)\s*(\{[^}]*\})?\s*\[(\d+)([smhd])\]\s*\)$", expr)
    if m:
        window = int(m.group(4)) * _DURATION[m.group(5)]
        t_now, now = history[at]
        first = next(i for i, (t, _) in enumerate(history) if t >= t_now - window)
        t_then, then = history[max(0, min(first, at - 1))]
        a, b = _select(m.group(2), m.group(3) or "", then), _select(m.group(2), m.group(3) or "", now)
        span = max(t_now - t_then, 1e-9)
        return {k: (v - a.get(k, 0.0)) / (span if m.group(1) == "rate" else 1.0) for k, v in b.items()}
    m = re.match(r"(\w+)\s*(\{[^}]*\})?$", expr)
    if m:
        return _select(m.group(1), m.group(2) or "", history[at][1])
    raise ValueError(f"unsupported PromQL: {expr!r}")


def _quantile(q: float, buckets: Vector) -> Vector:
    """Prometheus's histogram_quantile: linear interpolation inside the bucket that holds q."""
    groups: dict[Labels, list[tuple[float, float]]] = {}
    for labels, count in buckets.items():
        d = dict(labels)
        rest = frozenset((k, v) for k, v in labels if k != "le")
        groups.setdefault(rest, []).append((float(d["le"]), count))
    out: Vector = {}
    for rest, pairs in groups.items():
        pairs.sort()
        total = pairs[-1][1]
        if total <= 0:
            continue
        rank, prev_le, prev_count = q * total, 0.0, 0.0
        for le, count in pairs:
            if count >= rank:
                if math.isinf(le):
                    out[rest] = prev_le
                else:
                    width = count - prev_count
                    out[rest] = prev_le + (le - prev_le) * ((rank - prev_count) / width if width else 1.0)
                break
            prev_le, prev_count = le, count
    return out


# -- the simulator run ----------------------------------------------------------------------------


async def run(ticks: int, per_tick: int, tick_s: float) -> list[Scrape]:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    history: list[Scrape] = []
    with ProviderSimulator() as sim:
        model_list = [
            {
                "model_name": group,
                "litellm_params": {
                    "model": "openai/gpt-4o-mini",
                    "api_base": sim.api_base(dep),
                    "api_key": "sk-sim",
                },
                "model_info": {"id": dep},
            }
            for group, dep in (("primary", "a"), ("primary", "b"), ("backup", "c"))
        ]
        guard = CostGuard([Budget.daily(0.02, name="daily")])
        router = ResilientRouter(
            model_list=model_list,
            fallbacks=[{"primary": ["backup"]}],
            policy={
                "deadline": 5,
                "attempt_timeout": 2,
                "backoff": {"initial": 0.01, "maximum": 0.05},
                "breaker": {"fail_max": 3, "reset_timeout": 2},
                "hedge": {"delay": 0.05, "max_extra_fraction": 0.1},
            },
            guards=[guard],
            seed=7,
        )
        instrument(router, otel="off", registry=registry)
        msg = [{"role": "user", "content": "Summarise the incident report in three sentences, please."}]
        history.append(scrape(registry, 0.0))
        for tick in range(ticks):
            phase = tick / ticks
            # faults by phase: healthy, a flaky provider, an outage of b (its breaker opens), recovery
            sim.set_default(  # a is slow when healthy: some of its calls are hedged to b
                "a",
                Fault.flaky(0.35, Fault.server_error(503))
                if 0.25 <= phase < 0.75
                else Fault.ok(latency=0.08),
            )
            sim.set_default("b", Fault.server_error(500) if 0.45 <= phase < 0.65 else Fault.ok(latency=0.02))
            sim.set_default("c", Fault.ok(latency=0.05))

            async def one() -> None:
                try:
                    await router.acompletion(model="primary", messages=msg, max_tokens=40)
                except Exception:
                    pass  # failures are what the dashboard shows

            await asyncio.gather(*(one() for _ in range(per_tick)))
            history.append(scrape(registry, (tick + 1) * tick_s))
        router.close()
    return history


def render(history: list[Scrape], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    board = json.loads(DASHBOARD.read_text())
    panels = board["panels"]
    rows = math.ceil(len(panels) / 2)
    fig, axes = plt.subplots(rows, 2, figsize=(13, 3.2 * rows), constrained_layout=True)
    fig.suptitle(
        f"{board['title']} - rendered by scripts/render_dashboard.py from a simulator run (not Grafana)"
    )
    minutes = [t / 60 for t, _ in history]
    for ax, panel in zip(axes.flat, panels, strict=False):
        for target in panel["targets"]:
            series: dict[Labels, list[float]] = {}
            for i in range(1, len(history)):
                for labels, value in evaluate(target["expr"], history, i).items():
                    series.setdefault(labels, [math.nan] * (len(history) - 1))[i - 1] = value
            for labels, values in sorted(series.items(), key=lambda kv: sorted(kv[0])):
                names = dict(labels)
                legend = re.sub(
                    r"\{\{(\w+)\}\}", lambda m, n=names: n.get(m.group(1), ""), target["legendFormat"]
                )
                ax.plot(minutes[1:], values, label=legend)
        ax.set_title(panel["title"], fontsize=10)
        ax.set_xlabel("minutes (virtual time)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ticks", type=int, default=60)
    ap.add_argument("--calls-per-tick", type=int, default=12)
    ap.add_argument("--tick", type=float, default=15.0, help="virtual seconds between scrapes")
    ap.add_argument("--out", default=str(ROOT / "docs" / "img" / "dashboard.png"))
    args = ap.parse_args()
    render(asyncio.run(run(args.ticks, args.calls_per_tick, args.tick)), Path(args.out))


if __name__ == "__main__":
    main()
