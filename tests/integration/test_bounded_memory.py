"""Memory that does not grow with traffic: metric attributes from provider-chosen names are a
bounded set, per-request budget keys expire with the call, logged content is not kept after its
line is logged or the logging is detached. Real calls against the simulator."""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from llm_resilience_plugin import Budget, CallReport, CostGuard, ResilientRouter
from llm_resilience_plugin.cost import MemoryLedger
from llm_resilience_plugin.observability import attach_router_logging, instrument
from llm_resilience_plugin.observability._logs import RouterObserver
from llm_resilience_plugin.testing import ProviderSimulator
from tests.conftest import MSG, RouterFactory, deployment

PRICED = {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}


def _attribute_sets(reader: InMemoryMetricReader, name: str) -> list[dict[str, Any]]:
    data = reader.get_metrics_data()
    out: list[dict[str, Any]] = []
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    out.extend(dict(p.attributes) for p in m.data.data_points)
    return out


async def test_provider_chosen_model_names_do_not_grow_metric_attributes(make_router: RouterFactory):
    router = make_router({"primary": ["a"]})
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    detach = instrument(router, prometheus="off", otel="on", meter_provider=provider)
    try:
        resp = await router.acompletion(model="primary", messages=MSG)  # a real call, its real name
        served = resp.model
        for i in range(1_000):  # a provider answering with a new model name every time
            report = CallReport(f"c{i}", "primary", False, 0.0, served_model=f"gpt-4o-mini-{i:04d}")
            report.outcome, report.deployment_id = "success", "a"
            router.events.emit(report)
        sets = _attribute_sets(reader, "gen_ai.client.operation.duration")
        models = {s.get("gen_ai.response.model") for s in sets}
        assert served in models and "other" in models
        assert len(sets) <= 1 + 16 + 1  # the configured name, 16 others, "other" (was +1,000)
    finally:
        detach()
        provider.shutdown()


def test_per_request_budget_keys_expire_with_the_call(sim: ProviderSimulator) -> None:
    now = [1_000_000.0]
    ledger = MemoryLedger()
    guard = CostGuard(
        [Budget.per_request(1.0), Budget.daily(100.0)], ledger=ledger, now=lambda: now[0], reservation_ttl=60
    )
    router = ResilientRouter(model_list=[deployment(sim, "g", "a", **PRICED)], guards=[guard])
    try:
        for _ in range(20):
            router.completion(model="g", messages=MSG)
        assert len(ledger.list_usage(window="request")) == 20
        ledger.prune(now[0] + 61)  # the calls are long over: their keys go (they stayed a day)
        assert ledger.list_usage(window="request") == []
        assert ledger.list_usage(budget="daily")  # the daily budget's key stays
    finally:
        router.close()


def test_logged_content_is_not_retained(sim: ProviderSimulator, caplog: Any) -> None:
    router = ResilientRouter(model_list=[deployment(sim, "g", "a")])
    try:
        detach = attach_router_logging(router, include_content=True)
        observer = RouterObserver.for_router(router)
        big = [{"role": "user", "content": "x" * 100_000}]
        with caplog.at_level(logging.INFO, logger="llm_resilience.router"):
            for _ in range(5):
                router.completion(model="g", messages=big)
        logged = [r for r in caplog.records if getattr(r, "llm_event_name", "") == "llm_call"]
        assert len(logged) == 5 and all(r.llm_event["input"] for r in logged)  # logged...
        assert observer.content_held == 0  # ...and let go once its line is written
        # A call in flight when the logging is detached: nothing is kept after detach either.
        router.completion(model="g", messages=big)
        other = attach_router_logging(router)  # keeps the observer alive past the first detach
        detach()
        assert observer.content_held == 0 and not observer.include_content
        other()
    finally:
        router.close()
