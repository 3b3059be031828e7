"""The metrics issue #17 lists beyond calls and breakers, over real router traffic to the simulator,
through the OTel SDK's in-memory metric reader and a prometheus-client ``CollectorRegistry``:
hedges sent and won, retry-budget tokens in a budget-limited outage, cost-budget spend and
remaining (scoped budgets collapsed unless asked), the operation name of every endpoint, and
``llm-resilience check`` failing clearly when ``observability`` asks for a package that is missing.
"""

from __future__ import annotations

import logging
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest

from llm_resilience_plugin import AllRoutesFailedError, ResilientRouter, get_report
from llm_resilience_plugin.cli import main
from llm_resilience_plugin.cost import Budget, CostGuard
from llm_resilience_plugin.events import AttemptRecord, HedgeSent
from llm_resilience_plugin.observability import attach_router_logging, instrument
from llm_resilience_plugin.testing import Clock, FakeClock, Fault
from llm_resilience_plugin.testing._simulator import ProviderSimulator
from tests.conftest import FAST_POLICY, MSG, RouterFactory, _merge


class _ListHandler(logging.Handler):
    def __init__(self, into: list[logging.LogRecord]) -> None:
        super().__init__()
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record)


class Telemetry:
    """One in-memory OTel pipeline (spans and metrics) and one Prometheus registry."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.registry = CollectorRegistry()

    def instrument(self, router: ResilientRouter, **kw: Any) -> Any:
        return instrument(
            router,
            tracer_provider=self.tracer_provider,
            meter_provider=self.meter_provider,
            registry=self.registry,
            **kw,
        )

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        return [
            p
            for rm in (data.resource_metrics if data else [])
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == name
            for p in m.data.data_points
        ]

    def otel(self, name: str, **attrs: Any) -> float:
        """Sum of counter/gauge values (histogram counts) whose attributes include ``attrs``."""
        return sum(
            (p.value if hasattr(p, "value") else p.count)
            for p in self.points(name)
            if all(p.attributes.get(k) == v for k, v in attrs.items())
        )

    def prom(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def close(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


@pytest.fixture
def tel() -> Iterator[Telemetry]:
    t = Telemetry()
    yield t
    t.close()


async def test_a_hedged_call_counts_a_hedge_sent_and_won(
    make_router: RouterFactory, sim: ProviderSimulator, tel: Telemetry
) -> None:
    router = make_router(
        {"primary": ["a", "b"]}, policy={"hedge": {"delay": 0.05, "max_extra_fraction": 1.0}}, clock=Clock()
    )
    tel.instrument(router)
    events: list[Any] = []
    router.subscribe(events.append)
    sim.set_default("a", Fault.ok(latency=0.8))  # a hedge to the fast deployment answers first
    # The first deployment is a random pick: call until a has started (and been hedged) once.
    for i in range(40):
        await router.acompletion(model="primary", messages=MSG, max_tokens=5)
        sent = [e for e in events if isinstance(e, HedgeSent)]
        # b is hedged too when a loaded machine keeps it past the 0.05 s delay; then b itself answers
        from_a = [h for h in sent if h.first_deployment == "a"]
        if i >= 5 and from_a:
            break
    assert from_a

    assert tel.prom("llm_resilience_hedges_total", group="primary") == len(sent)
    assert tel.prom("llm_resilience_hedges_won_total", group="primary") == len(from_a)
    assert tel.otel("llm_resilience.hedges", **{"llm_resilience.model_group": "primary"}) == len(sent)
    assert tel.otel("llm_resilience.hedges.won", **{"llm_resilience.model_group": "primary"}) == len(from_a)
    for p in tel.points("llm_resilience.hedges.won"):
        assert set(p.attributes) == {"llm_resilience.model_group"}  # no call id, no deployment


async def test_a_hedge_the_first_attempt_beats_is_sent_not_won(
    make_router: RouterFactory, sim: ProviderSimulator, tel: Telemetry
) -> None:
    router = make_router(
        {"primary": ["a", "b"]}, policy={"hedge": {"delay": 0.05, "max_extra_fraction": 1.0}}, clock=Clock()
    )
    tel.instrument(router)
    events: list[Any] = []
    router.subscribe(events.append)
    sim.set_default("a", Fault.ok(latency=0.15))  # the hedge goes out at 0.05 s ...
    sim.set_default("b", Fault.ok(latency=0.6))  # ... and b answers far later than a
    # The first deployment is a random pick: call until a has started (and been hedged) twice.
    for i in range(40):
        await router.acompletion(model="primary", messages=MSG, max_tokens=5)
        hedged_from_a = [e for e in events if isinstance(e, HedgeSent) and e.first_deployment == "a"]
        if i >= 5 and len(hedged_from_a) >= 2:
            break
    assert hedged_from_a
    won = tel.prom("llm_resilience_hedges_won_total", group="primary") or 0.0
    sent = tel.prom("llm_resilience_hedges_total", group="primary") or 0.0
    assert won == sent - len(hedged_from_a)  # every hedge sent from a's slow start lost to a


async def test_retry_budget_tokens_in_a_budget_limited_outage(
    make_router: RouterFactory, sim: ProviderSimulator, tel: Telemetry
) -> None:
    router = make_router(
        {"primary": ["a"]},
        policy={"breaker": {"enabled": False}, "retry_budget": {"capacity": 4, "min_fraction": 0.5}},
    )
    tel.instrument(router)
    assert tel.prom("llm_resilience_retry_budget_tokens", group="primary") == 4
    assert tel.prom("llm_resilience_retry_budget_capacity", group="primary") == 4
    sim.set_default("a", Fault.server_error(500))
    for _ in range(4):
        with pytest.raises(AllRoutesFailedError):
            await router.acompletion(model="primary", messages=MSG, max_tokens=5)

    budget = router.retry_budget("primary")
    assert not budget.allows_retry()  # the budget, not the policy's retry count, stopped retries
    tokens = tel.prom("llm_resilience_retry_budget_tokens", group="primary")
    assert tokens == budget.tokens and tokens is not None and tokens < 2
    assert (
        tel.otel("llm_resilience.retry_budget.tokens", **{"llm_resilience.model_group": "primary"}) == tokens
    )
    assert tel.otel("llm_resilience.retry_budget.capacity", **{"llm_resilience.model_group": "primary"}) == 4
    retries = tel.prom("llm_resilience_retries_total", group="primary", error_class="server") or 0.0
    assert retries < sim.count("a")  # later calls got one attempt each: amplification bounded
    assert (
        tel.prom("llm_resilience_calls_total", group="primary", outcome="failure", error_class="server") == 4
    )

    sim.set_default("a", Fault.ok())
    await router.acompletion(model="primary", messages=MSG, max_tokens=5)  # a success refunds
    assert tel.prom("llm_resilience_retry_budget_tokens", group="primary") == pytest.approx(tokens + 0.1)


async def test_budget_spend_and_remaining_per_budget_and_scope(
    make_router: RouterFactory, tel: Telemetry
) -> None:
    guard = CostGuard([Budget.daily(1.0), Budget.scoped("tenant", 0.5), Budget.per_request(0.1)])
    router = make_router({"primary": ["a"]}, guards=[guard])
    tel.instrument(router)
    labels = {"budget": "daily", "period": "day", "scope": ""}
    assert tel.prom("llm_resilience_budget_spent_usd", **labels) == 0
    assert tel.prom("llm_resilience_budget_remaining_usd", **labels) == 1.0
    for tenant in ("acme", "acme", "beta"):
        await router.acompletion(model="primary", messages=MSG, max_tokens=5, metadata={"tenant": tenant})

    rows = {(u.budget, u.scope): u for u in guard.report().budgets}
    daily, acme, beta = (
        rows[("daily", "")],
        rows[("tenant/day", "tenant=acme")],
        rows[("tenant/day", "tenant=beta")],
    )
    assert daily.spent > 0 and acme.spent > beta.spent > 0
    assert tel.prom("llm_resilience_budget_spent_usd", **labels) == pytest.approx(daily.spent)
    assert tel.prom("llm_resilience_budget_remaining_usd", **labels) == pytest.approx(1.0 - daily.spent)
    scoped = {"budget": "tenant/day", "period": "day", "scope": "tenant"}  # the key, not a tenant
    assert tel.prom("llm_resilience_budget_spent_usd", **scoped) == pytest.approx(acme.spent + beta.spent)
    assert tel.prom("llm_resilience_budget_remaining_usd", **scoped) == pytest.approx(0.5 - acme.spent)
    assert tel.prom("llm_resilience_budget_limit_usd", budget="tenant/day", period="day") == 0.5
    assert "acme" not in generate_latest(tel.registry).decode()  # no tenant label unless asked
    per_request = {"budget": "per_request", "period": "request", "scope": ""}
    assert tel.prom("llm_resilience_budget_spent_usd", **per_request) is None  # one call's, not a gauge

    attrs = {"llm_resilience.budget": "tenant/day", "llm_resilience.budget.scope": "tenant"}
    assert tel.otel("llm_resilience.budget.spent", **attrs) == pytest.approx(acme.spent + beta.spent)
    assert tel.otel("llm_resilience.budget.remaining", **attrs) == pytest.approx(0.5 - acme.spent)
    assert tel.otel("llm_resilience.budget.limit", **{"llm_resilience.budget": "daily"}) == 1.0


async def test_budget_scope_values_only_when_asked(make_router: RouterFactory, tel: Telemetry) -> None:
    guard = CostGuard([Budget.scoped("tenant", 0.5)])
    router = make_router({"primary": ["a"]}, guards=[guard])
    tel.instrument(router, budget_scope_values=True)
    await router.acompletion(model="primary", messages=MSG, max_tokens=5, metadata={"tenant": "acme"})
    (row,) = guard.report().budgets
    acme = {"budget": "tenant/day", "period": "day", "scope": "tenant=acme"}
    assert tel.prom("llm_resilience_budget_spent_usd", **acme) == pytest.approx(row.spent)
    assert tel.prom("llm_resilience_budget_remaining_usd", **acme) == pytest.approx(0.5 - row.spent)
    assert tel.otel("llm_resilience.budget.spent", **{"llm_resilience.budget.scope": "tenant=acme"}) > 0


def test_detached_routers_leave_the_gauges(make_router: RouterFactory, tel: Telemetry) -> None:
    router = make_router({"primary": ["a"]})
    detach = tel.instrument(router)
    assert tel.prom("llm_resilience_retry_budget_tokens", group="primary") == 20
    assert tel.otel("llm_resilience.retry_budget.tokens") == 20
    detach()
    assert tel.prom("llm_resilience_retry_budget_tokens", group="primary") is None
    assert tel.points("llm_resilience.retry_budget.tokens") == []


# -- the operation name ---------------------------------------------------------------------------

ENDPOINTS: dict[str, tuple[str, dict[str, Any], str, dict[str, str]]] = {
    # operation -> (model, model_info, gen_ai.operation.name, other attributes on the spans)
    "embedding": ("openai/text-embedding-3-small", {"mode": "embedding"}, "embeddings", {}),
    "text_completion": (
        "openai/gpt-3.5-turbo-instruct",
        {"mode": "completion", "base_model": "gpt-3.5-turbo-instruct"},
        "text_completion",
        {},
    ),
    "responses": ("openai/gpt-4o-mini", {"mode": "responses"}, "chat", {"openai.api.type": "responses"}),
    "image_generation": (
        "openai/dall-e-3",
        {"mode": "image_generation", "output_cost_per_image": 0.04},
        "generate_content",
        {"gen_ai.output.type": "image"},
    ),
}


async def _call(router: ResilientRouter, operation: str) -> Any:
    if operation == "embedding":
        return await router.aembedding(model="g", input=["alpha", "beta"])
    if operation == "text_completion":
        return await router.atext_completion(model="g", prompt="Say hello")
    if operation == "image_generation":
        return await router.aimage_generation(model="g", prompt="a red cube")
    return await router.aresponses(model="g", input="Say hello")


@pytest.mark.parametrize("operation", list(ENDPOINTS))
async def test_every_endpoint_names_its_operation(
    sim: ProviderSimulator, tel: Telemetry, operation: str
) -> None:
    model, info, name, extra = ENDPOINTS[operation]
    deployment = {
        "model_name": "g",
        "litellm_params": {"model": model, "api_base": sim.api_base("a"), "api_key": "sk-sim-secret"},
        "model_info": {"id": "a", **info},
    }
    router = ResilientRouter([deployment], policy=_merge(FAST_POLICY, {}), clock=FakeClock())
    logged: list[logging.LogRecord] = []
    handler = _ListHandler(logged)
    logger = logging.getLogger(f"llm_resilience.test.{operation}")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        tel.instrument(router)
        records: list[Any] = []
        router.subscribe(records.append)
        detach_logs = attach_router_logging(router, logger)
        resp = await _call(router, operation)
        detach_logs()
    finally:
        router.close()
        logger.removeHandler(handler)

    report = get_report(resp)
    assert report is not None and report.operation == operation
    assert report.to_dict()["operation"] == operation
    assert [r.operation for r in records if isinstance(r, AttemptRecord)] == [operation]
    spans = {s.name: s for s in tel.finished()}
    call = spans[f"{name} g"]
    (attempt,) = [
        s for s in tel.finished() if s.parent is not None and s.parent.span_id == call.context.span_id
    ]
    assert attempt.name.startswith(f"{name} ")
    for span in (call, attempt):
        assert span.attributes["gen_ai.operation.name"] == name
        assert span.attributes["llm_resilience.operation"] == operation
        for key, value in extra.items():
            assert span.attributes[key] == value
    duration = tel.points("gen_ai.client.operation.duration")
    assert [p.attributes["gen_ai.operation.name"] for p in duration] == [name]
    assert tel.otel("llm_resilience.calls", **{"gen_ai.operation.name": name}) == 1
    assert tel.otel("llm_resilience.attempts", **{"gen_ai.operation.name": name}) == 1
    by_name = {r.llm_event_name: r.llm_event for r in logged}  # type: ignore[attr-defined]
    assert by_name["llm_call"]["operation"] == by_name["llm_attempt"]["operation"] == operation


async def test_a_chat_call_stays_chat(make_router: RouterFactory, tel: Telemetry) -> None:
    router = make_router({"primary": ["a"]})
    tel.instrument(router)
    resp = await router.acompletion(model="primary", messages=MSG, max_tokens=5)
    assert get_report(resp).operation == "completion"  # type: ignore[union-attr]
    (call,) = [s for s in tel.finished() if s.name == "chat primary"]
    assert call.attributes["gen_ai.operation.name"] == "chat"
    assert call.attributes["openai.api.type"] == "chat_completions"  # the deployment is openai/...


# -- llm-resilience check -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "module", "dist"),
    [
        ("otel", "opentelemetry.trace", "opentelemetry-api"),
        ("prometheus", "prometheus_client", "prometheus-client"),
    ],
)
def test_check_fails_clearly_when_observability_needs_a_missing_package(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
    module: str,
    dist: str,
) -> None:
    cfg = tmp_path / "router.yaml"
    cfg.write_text(
        textwrap.dedent(
            f"""
            model_list:
              - model_name: primary
                litellm_params: {{model: openai/gpt-4o-mini, api_key: sk-x}}
            resilience:
              observability: {{{backend}: on}}
            """
        )
    )
    monkeypatch.setitem(sys.modules, module, None)  # as if the extra were not installed
    assert main(["check", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"error    resilience.observability.{backend}:" in err  # the field, as the file names it
    assert dist in err and f"pip install 'llm-resilience-plugin[{backend}]'" in err  # the fix
    assert "sk-x" not in err

    monkeypatch.undo()  # installed again: the same file checks OK
    assert main(["check", str(cfg)]) == 0


def test_yaml_booleans_are_the_switches_they_look_like() -> None:
    from llm_resilience_plugin.policy import ResiliencePolicy

    section = ResiliencePolicy.model_validate({"observability": {"otel": True, "prometheus": False}})
    assert section.observability is not None
    assert (section.observability.otel, section.observability.prometheus) == ("on", "off")
    with pytest.raises(ValueError, match=r"observability\.otel"):
        ResiliencePolicy.model_validate({"observability": {"otel": 1}})


def test_gauges_through_the_global_meter_provider_cover_every_router(tmp_path: Path) -> None:
    """The policy section instruments through the global providers; the global proxy provider
    hands out a new meter per request, so the gauges are made once per provider and a second
    router is reported too (a subprocess: the global provider can be set once per process)."""
    script = tmp_path / "global_provider.py"
    script.write_text(
        textwrap.dedent(
            """
            import llm_resilience_plugin
            from opentelemetry import metrics
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import InMemoryMetricReader
            from llm_resilience_plugin import ResilientRouter

            def router(group):
                deployment = {"model_name": group, "litellm_params": {"model": "openai/gpt-4o-mini"}}
                policy = {"observability": {"otel": "on", "prometheus": "off"}}
                return ResilientRouter([deployment], policy=policy)

            first, second = router("one"), router("two")
            reader = InMemoryMetricReader()
            metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
            seen = sorted(
                p.attributes["llm_resilience.model_group"]
                for rm in reader.get_metrics_data().resource_metrics
                for sm in rm.scope_metrics
                for m in sm.metrics
                if m.name == "llm_resilience.retry_budget.tokens"
                for p in m.data.data_points
            )
            second.close()
            after = [
                m.data.data_points
                for rm in reader.get_metrics_data().resource_metrics
                for sm in rm.scope_metrics
                for m in sm.metrics
                if m.name == "llm_resilience.retry_budget.tokens"
            ]
            print(seen, [p.attributes["llm_resilience.model_group"] for ps in after for p in ps])
            first.close()
            """
        )
    )
    import subprocess

    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "['one', 'two'] ['one']"  # closed: not reported


async def test_a_stream_span_carries_the_conventions_time_to_first_chunk(
    make_router: RouterFactory, tel: Telemetry
) -> None:
    router = make_router({"primary": ["a"]})
    tel.instrument(router)
    stream = await router.acompletion(model="primary", messages=MSG, max_tokens=5, stream=True)
    async for _ in stream:
        pass
    (call,) = [s for s in tel.finished() if s.name == "chat primary"]
    ttft = call.attributes["gen_ai.response.time_to_first_chunk"]
    assert ttft == call.attributes["llm_resilience.ttft_s"] and ttft > 0
    assert tel.prom("llm_resilience_time_to_first_token_seconds_count", group="primary") == 1
    assert tel.otel("gen_ai.client.operation.time_to_first_chunk", **{"gen_ai.operation.name": "chat"}) == 1
