"""docs/grafana/llm-resilience.json queries exactly the metrics the Prometheus exporter emits: every
metric a panel's PromQL names exists in a CollectorRegistry after a simulator run, and every
query evaluates (scripts/render_dashboard.py's evaluator) to a non-empty result."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from llm_resilience_plugin.cost import Budget, CostGuard
from llm_resilience_plugin.observability import instrument
from llm_resilience_plugin.testing import Clock, Fault
from llm_resilience_plugin.testing._simulator import ProviderSimulator
from tests.conftest import MSG, RouterFactory

ROOT = Path(__file__).resolve().parents[2]
BOARD = json.loads((ROOT / "docs" / "grafana" / "llm-resilience.json").read_text())
EXPRS = [t["expr"] for p in BOARD["panels"] for t in p["targets"]]


def _renderer():
    spec = importlib.util.spec_from_file_location(
        "render_dashboard", ROOT / "scripts" / "render_dashboard.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dashboard_has_the_panels_the_issue_asks_for() -> None:
    titles = " ".join(p["title"].lower() for p in BOARD["panels"])
    for word in ("success", "p99", "amplification", "breaker", "budget"):
        assert word in titles
    assert all(p["datasource"]["type"] == "prometheus" for p in BOARD["panels"])


async def test_every_metric_in_the_dashboard_is_emitted(
    make_router: RouterFactory, sim: ProviderSimulator
) -> None:
    registry = CollectorRegistry()
    guard = CostGuard([Budget.daily(5.0, name="daily")])
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"breaker": {"fail_max": 1}},
        guards=[guard],
    )
    instrument(router, otel="off", registry=registry)
    # Hedges (real time): the slow deployment's calls are hedged to the fast one, which wins.
    hedged = make_router(
        {"hedged": ["c", "d"]}, policy={"hedge": {"delay": 0.05, "max_extra_fraction": 1.0}}, clock=Clock()
    )
    instrument(hedged, otel="off", registry=registry)
    sim.set_default("c", Fault.ok(latency=0.4))
    render = _renderer()
    history = [render.scrape(registry, 0.0)]
    sim.script("a", Fault.server_error(500), Fault.server_error(500))  # a retry, a fallback, a trip
    for _ in range(3):
        await router.acompletion(model="primary", messages=MSG, max_tokens=5)
    stream = await router.acompletion(model="primary", messages=MSG, max_tokens=5, stream=True)
    async for _ in stream:
        pass
    for _ in range(12):  # the Router picks c or d at random: 12 calls all on d is a 1-in-4096 chance
        await hedged.acompletion(model="hedged", messages=MSG, max_tokens=5)
    history.append(render.scrape(registry, 60.0))

    emitted = {s.name for family in registry.collect() for s in family.samples}
    referenced = {n for expr in EXPRS for n in re.findall(r"\bllm_resilience_\w+", expr)}
    assert referenced and referenced <= emitted, sorted(referenced - emitted)
    for expr in EXPRS:
        assert render.evaluate(expr, history, 1), expr  # each query gives a value
