"""Overhead benchmark rows for observability: what instrumentation costs a healthy call.

Four plugin routers over the same deployments, one call at a time, alternating in blocks (ABBA
against the first): no ``observability:`` section (the baseline: nothing instrumented), the
section with both switches ``off``, the section on ``auto`` with neither package importable (as
when they are not installed), and ``instrument()`` with both on (OTel SDK providers without
exporters, a private Prometheus registry). Each ratio is the median of per-block-pair throughput
ratios against the baseline: 1.0 means no cost.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from llm_resilience_plugin import ResilientRouter

MSG = [{"role": "user", "content": "Say hello in five words."}]
Call = Callable[[], Awaitable[Any]]


def _router(model_list: list[dict[str, Any]], section: dict[str, Any] | None) -> ResilientRouter:
    policy = {"observability": section} if section is not None else None
    return ResilientRouter(model_list=model_list, policy=policy)


def _not_installed(model_list: list[dict[str, Any]]) -> ResilientRouter:
    """``auto`` while neither package imports: built with both hidden from ``import``."""
    saved = {m: sys.modules.get(m) for m in ("opentelemetry.trace", "prometheus_client")}
    try:
        for m in saved:
            sys.modules[m] = None  # type: ignore[assignment]  # import raises ImportError
        return _router(model_list, {"otel": "auto", "prometheus": "auto"})
    finally:
        for m, mod in saved.items():
            if mod is None:
                sys.modules.pop(m, None)
            else:
                sys.modules[m] = mod


def _instrumented(model_list: list[dict[str, Any]]) -> ResilientRouter:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from prometheus_client import CollectorRegistry

    from llm_resilience_plugin.observability import instrument

    router = _router(model_list, None)
    instrument(
        router, tracer_provider=TracerProvider(), meter_provider=MeterProvider(), registry=CollectorRegistry()
    )
    return router


async def observability_rows(model_list: list[dict[str, Any]], pairs: int, block: int) -> dict[str, Any]:
    """Throughput of each variant relative to the uninstrumented plugin (median of block pairs)."""
    routers = {
        "no section": _router(model_list, None),
        "policy off": _router(model_list, {"otel": "off", "prometheus": "off"}),
        "auto, not installed": _not_installed(model_list),
        "otel + prometheus on": _instrumented(model_list),
    }
    calls: dict[str, Call] = {
        name: (lambda r=r: r.acompletion(model="primary", messages=MSG)) for name, r in routers.items()
    }
    for call in calls.values():  # warm connections and code paths
        for _ in range(20):
            await call()
    wall: dict[str, list[float]] = {}  # "<variant>" and "no section|<variant>" (its paired baseline)
    base = "no section"
    for i in range(pairs):
        for name in calls:
            if name == base:
                continue
            order = (base, name) if i % 2 == 0 else (name, base)
            for kind in order:
                t0 = time.perf_counter()
                for _ in range(block):
                    await calls[kind]()
                wall.setdefault(f"{kind}|{name}" if kind == base else kind, []).append(
                    time.perf_counter() - t0
                )
    for router in routers.values():
        router.close()
    out: dict[str, Any] = {"pairs": pairs, "block": block}
    for name in calls:
        if name == base:
            continue
        ratios = [b / v for b, v in zip(wall[f"{base}|{name}"], wall[name], strict=True)]
        out[name] = {
            "ratio": statistics.median(ratios),
            "calls_per_s": block * len(wall[name]) / sum(wall[name]),
            "baseline_calls_per_s": block * len(wall[f"{base}|{name}"]) / sum(wall[f"{base}|{name}"]),
        }
    return out


def print_rows(rows: dict[str, Any]) -> None:
    """Markdown rows: each variant against the uninstrumented plugin."""
    print("\n| observability (sequential, vs the plugin without instrumentation) | calls/s | ratio |")
    print("|---|---:|---:|")
    for name, r in rows.items():
        if isinstance(r, dict):
            print(
                f"| {name} | {r['calls_per_s']:.1f}/s (baseline {r['baseline_calls_per_s']:.1f}/s) "
                f"| {r['ratio']:.3f} |"
            )
