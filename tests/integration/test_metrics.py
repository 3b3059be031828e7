"""MetricsCollector over real router traffic to the simulator: success rate, latency and TTFT
percentiles, retry amplification, fallback rate, errors per deployment, cost per call."""

from __future__ import annotations

import json

import pytest

from llm_resilience_plugin.cost._guard import Budget, CostGuard
from llm_resilience_plugin.events import hidden_params_of
from llm_resilience_plugin.observability._metrics import MetricsCollector, percentile
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator
from tests.conftest import MSG, RouterFactory

IN, OUT = 1.5e-7, 6e-7


async def test_summary_of_mixed_traffic(make_router: RouterFactory, sim: ProviderSimulator):
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    metrics = MetricsCollector(router)
    costs: list[float] = []
    for _ in range(6):  # healthy
        r = await router.acompletion(model="primary", messages=MSG, max_tokens=5)
        costs.append(hidden_params_of(r)["response_cost"])
    for _ in range(2):  # one retry each
        sim.script("a", Fault.server_error(500))
        r = await router.acompletion(model="primary", messages=MSG, max_tokens=5)
        costs.append(hidden_params_of(r)["response_cost"])
    sim.script("a", Fault.auth())  # fails over at once
    r = await router.acompletion(model="primary", messages=MSG, max_tokens=5)
    costs.append(hidden_params_of(r)["response_cost"])
    stream = await router.acompletion(model="primary", messages=MSG, max_tokens=5, stream=True)
    async for _ in stream:
        pass
    assert stream.usage is not None
    costs.append(stream.usage["prompt_tokens"] * IN + stream.usage["completion_tokens"] * OUT)
    sim.script("a", Fault.http_error(400, message="bad request"))  # fails, no fallback
    with pytest.raises(Exception, match="bad request"):
        await router.acompletion(model="primary", messages=MSG, max_tokens=5)

    s = metrics.summary()
    assert s.calls == 11 and s.successes == 10 and s.failures == 1
    assert s.success_rate == pytest.approx(10 / 11)
    assert s.upstream_requests == sim.count() == 6 + 4 + 2 + 1 + 1
    assert s.upstream_per_call == pytest.approx(14 / 11)
    assert s.retries == 3  # two same-group retries and one fallback request
    assert s.fallbacks == 1 and s.fallback_rate == pytest.approx(1 / 11) and s.served_by_fallback == 1
    assert s.errors_by_deployment == {"a": {"server": 2, "auth": 1, "bad_request": 1}}
    assert s.errors_by_class == {"server": 2, "auth": 1, "bad_request": 1}
    lat = s.latency_s
    assert lat["count"] == 11 and 0 < lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"]
    assert s.ttft_s["count"] == 1 and s.ttft_s["p50"] > 0
    assert s.cost_total == pytest.approx(sum(costs), abs=1e-12)
    assert s.cost_per_call == pytest.approx(sum(costs) / 11, abs=1e-12)  # the failed call cost 0
    assert s.by_group["primary"]["calls"] == 11
    assert json.loads(json.dumps(s.to_dict()))["calls"] == 11
    text = str(s)
    assert "success rate 90.9%" in text and "errors a:" in text

    metrics.detach()
    await router.acompletion(model="primary", messages=MSG, max_tokens=5)
    assert metrics.summary().calls == 11
    assert router.guards == []  # the shared observer left with the last user
    metrics.reset()
    assert metrics.summary().calls == 0 and metrics.summary().success_rate is None


async def test_cost_per_call_with_a_guard(make_router: RouterFactory, sim: ProviderSimulator):
    guard = CostGuard([Budget.daily(1.0)])
    router = make_router({"primary": ["a"]}, guards=[guard])
    metrics = MetricsCollector(router, guard=guard)
    for _ in range(3):
        await router.acompletion(model="primary", messages=MSG, max_tokens=5)
    s = metrics.summary()
    spent = guard.report().total
    assert s.cost_total == pytest.approx(spent, abs=1e-12) and s.cost_per_call == pytest.approx(spent / 3)
    assert router.guards == [guard]  # observers subscribe to events; they never register as guards


def test_percentiles_interpolate_linearly():
    xs = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    assert percentile(xs, 50) == pytest.approx(5.5)
    assert percentile(xs, 95) == pytest.approx(9.55)
    assert percentile(xs, 99) == pytest.approx(9.91)
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 10.0
    assert percentile([3.0], 99) == 3.0 and percentile([], 50) is None
