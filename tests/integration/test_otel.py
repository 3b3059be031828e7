"""instrument(router) with OpenTelemetry over real router traffic to the simulator: a span per call
under the caller's span, a child span per attempt, GenAI-convention attributes, resilience
events, and the gen_ai.client.* / llm_resilience.* metrics (in-memory exporter and reader)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from llm_resilience_plugin import StreamInterruptedError
from llm_resilience_plugin.cost import Budget, CostGuard
from llm_resilience_plugin.observability import instrument
from llm_resilience_plugin.testing import Fault
from llm_resilience_plugin.testing._simulator import ProviderSimulator
from tests.conftest import MSG, RouterFactory


@dataclass
class Otel:
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider
    meter_provider: MeterProvider

    def finished(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if name is None or s.name == name]

    def call(self, group: str = "primary") -> ReadableSpan:
        (span,) = self.finished(f"chat {group}")
        return span

    def attempts(self, call: ReadableSpan) -> list[ReadableSpan]:
        kids = [
            s for s in self.finished() if s.parent is not None and s.parent.span_id == call.context.span_id
        ]
        return sorted(kids, key=lambda s: s.attributes["llm_resilience.attempt"])  # type: ignore[index]

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        out: list[Any] = []
        for rm in data.resource_metrics if data else []:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == name:
                        out.extend(m.data.data_points)
        return out

    def total(self, name: str, **attrs: Any) -> float:
        """Sum of counter values (or histogram counts) whose attributes include ``attrs``."""
        found = 0.0
        for p in self.points(name):
            if all(p.attributes.get(k) == v for k, v in attrs.items()):
                found += getattr(p, "value", None) if hasattr(p, "value") else p.count
        return found


@pytest.fixture
def otel() -> Iterator[Otel]:
    spans = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    yield Otel(spans, reader, tp, mp)
    tp.shutdown()
    mp.shutdown()


def _instrument(router: Any, otel: Otel, **kw: Any) -> Any:
    return instrument(
        router,
        prometheus="off",
        tracer_provider=otel.tracer_provider,
        meter_provider=otel.meter_provider,
        **kw,
    )


async def test_a_healthy_call_is_one_client_span_with_one_attempt(make_router: RouterFactory, otel: Otel):
    router = make_router({"primary": ["a"]})
    detach = _instrument(router, otel)
    await router.acompletion(model="primary", messages=MSG, max_tokens=5)

    call = otel.call()
    assert call.kind is SpanKind.CLIENT and call.status.status_code is StatusCode.UNSET
    a = call.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "primary"
    assert a["gen_ai.provider.name"] == "openai" and a["gen_ai.response.model"]
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] == 5
    assert a["llm_resilience.outcome"] == "success" and a["llm_resilience.upstream_requests"] == 1
    assert a["llm_resilience.retries"] == 0 and a["llm_resilience.fallback_level"] == 0
    assert a["llm_resilience.deployment_id"] == "a" and a["llm_resilience.hedged"] is False
    assert "gen_ai.input.messages" not in a  # content only when asked
    (att,) = otel.attempts(call)
    assert att.name == "chat gpt-4o-mini" and att.kind is SpanKind.CLIENT
    aa = att.attributes
    assert aa["llm_resilience.deployment_id"] == "a" and aa["llm_resilience.breaker_state"] == "closed"
    assert aa["server.address"] == "127.0.0.1" and aa["gen_ai.request.model"] == "gpt-4o-mini"
    assert call.start_time <= att.start_time <= att.end_time <= call.end_time  # type: ignore[operator]

    assert otel.total("gen_ai.client.operation.duration", **{"gen_ai.request.model": "primary"}) == 1
    assert otel.total("gen_ai.client.token.usage", **{"gen_ai.token.type": "output"}) == 1
    assert otel.total("llm_resilience.calls", **{"llm_resilience.outcome": "success"}) == 1
    assert otel.total("llm_resilience.upstream_requests") == 1
    for p in otel.points("llm_resilience.calls"):
        assert not any("call_id" in k for k in p.attributes)  # no high-cardinality labels

    detach()
    await router.acompletion(model="primary", messages=MSG, max_tokens=5)
    assert len(otel.finished("chat primary")) == 1
    assert not router.events.active  # nothing left subscribed


async def test_content_is_captured_only_when_asked(make_router: RouterFactory, otel: Otel):
    router = make_router({"primary": ["a"]})
    _instrument(router, otel, capture_content=True)
    await router.acompletion(model="primary", messages=MSG, max_tokens=5)
    assert "Hello there" in otel.call().attributes["gen_ai.input.messages"]  # type: ignore[operator]


async def test_a_retry_is_an_error_attempt_and_a_span_event(
    make_router: RouterFactory, sim: ProviderSimulator, otel: Otel
):
    router = make_router({"primary": ["a"]})
    _instrument(router, otel)
    sim.script("a", Fault.server_error(500))
    await router.acompletion(model="primary", messages=MSG, max_tokens=5)

    call = otel.call()
    assert call.status.status_code is StatusCode.UNSET and call.attributes["llm_resilience.retries"] == 1
    (retry,) = [e for e in call.events if e.name == "llm_resilience.retry"]
    assert retry.attributes["llm_resilience.error_class"] == "server"
    first, second = otel.attempts(call)
    assert first.status.status_code is StatusCode.ERROR and first.attributes["error.type"] == "server"
    assert first.attributes["http.response.status_code"] == 500
    assert second.attributes["llm_resilience.retry_number"] == 1
    assert second.attributes["llm_resilience.outcome"] == "success" and "error.type" not in second.attributes
    assert otel.total("llm_resilience.retries", **{"llm_resilience.error_class": "server"}) == 1
    assert otel.total("llm_resilience.attempts", **{"llm_resilience.outcome": "failure"}) == 1


async def test_a_fallback_is_an_event_and_the_served_group(
    make_router: RouterFactory, sim: ProviderSimulator, otel: Otel
):
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    _instrument(router, otel)
    sim.script("a", Fault.auth())
    await router.acompletion(model="primary", messages=MSG, max_tokens=5)

    call = otel.call()
    assert call.attributes["llm_resilience.fallback_level"] == 1
    assert call.attributes["llm_resilience.served_group"] == "backup"
    (fb,) = [e for e in call.events if e.name == "llm_resilience.fallback"]
    assert fb.attributes["llm_resilience.to_group"] == "backup"
    assert fb.attributes["llm_resilience.error_class"] == "auth"
    failed, served = otel.attempts(call)
    assert (
        failed.attributes["error.type"] == "auth" and served.attributes["llm_resilience.fallback_level"] == 1
    )
    assert otel.total("llm_resilience.fallbacks", **{"llm_resilience.to_group": "backup"}) == 1


async def test_a_failed_call_has_error_status(make_router: RouterFactory, sim: ProviderSimulator, otel: Otel):
    router = make_router({"primary": ["a"]})
    _instrument(router, otel)
    sim.script("a", Fault.http_error(400, message="bad request"))
    with pytest.raises(Exception, match="bad request"):
        await router.acompletion(model="primary", messages=MSG, max_tokens=5)
    call = otel.call()
    assert call.status.status_code is StatusCode.ERROR and call.attributes["error.type"] == "bad_request"
    assert otel.total("llm_resilience.calls", **{"llm_resilience.error_class": "bad_request"}) == 1
    assert otel.total("gen_ai.client.operation.duration", **{"error.type": "bad_request"}) == 1


async def test_a_breaker_trip_is_an_event_and_the_gauge_reads_open(
    make_router: RouterFactory, sim: ProviderSimulator, otel: Otel
):
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"breaker": {"fail_max": 1}},
    )
    _instrument(router, otel)
    gauge = {
        p.attributes["llm_resilience.deployment_id"]: p.value
        for p in otel.points("llm_resilience.breaker.state")
    }
    assert gauge == {"a": 0, "b": 0}
    sim.script("a", Fault.server_error(500))
    await router.acompletion(model="primary", messages=MSG, max_tokens=5)

    call = otel.call()
    tripped = [
        e
        for s in otel.attempts(call)
        for e in s.events
        if e.name == "llm_resilience.breaker_transition"
        and e.attributes["llm_resilience.breaker.new_state"] == "open"
    ]
    assert len(tripped) == 1 and tripped[0].attributes["llm_resilience.deployment_id"] == "a"
    gauge = {
        p.attributes["llm_resilience.deployment_id"]: p.value
        for p in otel.points("llm_resilience.breaker.state")
    }
    assert gauge["a"] == 2 and gauge["b"] == 0
    assert (
        otel.total(
            "llm_resilience.breaker.transitions",
            **{"llm_resilience.deployment_id": "a", "llm_resilience.breaker.new_state": "open"},
        )
        == 1
    )


async def test_a_stream_span_ends_when_the_stream_ends(make_router: RouterFactory, otel: Otel):
    router = make_router({"primary": ["a"]})
    _instrument(router, otel)
    stream = await router.acompletion(model="primary", messages=MSG, max_tokens=5, stream=True)
    assert otel.finished("chat primary") == []  # still open while the caller reads
    async for _ in stream:
        pass
    call = otel.call()
    assert call.attributes["llm_resilience.stream"] is True and call.attributes["llm_resilience.ttft_s"] > 0
    (att,) = otel.attempts(call)
    assert att.attributes["llm_resilience.ttft_s"] > 0
    assert otel.total("gen_ai.client.operation.time_to_first_chunk") == 1


async def test_calls_nest_under_the_callers_span(make_router: RouterFactory, otel: Otel):
    router = make_router({"primary": ["a"]})
    _instrument(router, otel)
    tracer = otel.tracer_provider.get_tracer("caller")
    with tracer.start_as_current_span("handle request") as parent:
        await router.acompletion(model="primary", messages=MSG, max_tokens=5)
        router.completion(model="primary", messages=MSG, max_tokens=5)  # the blocking twin too
    calls = otel.finished("chat primary")
    assert len(calls) == 2
    for call in calls:
        assert call.parent is not None and call.parent.span_id == parent.get_span_context().span_id
        assert call.context.trace_id == parent.get_span_context().trace_id
        (att,) = otel.attempts(call)
        assert att.context.trace_id == parent.get_span_context().trace_id


async def test_a_budget_refusal_is_marked(make_router: RouterFactory, otel: Otel):
    guard = CostGuard([Budget.per_request(1e-6)])
    router = make_router({"primary": ["a"]}, guards=[guard])
    _instrument(router, otel)
    with pytest.raises(Exception, match="per_request"):
        await router.acompletion(model="primary", messages=MSG, max_tokens=5)
    call = otel.call()
    assert call.attributes["llm_resilience.budget_refused"] is True
    assert call.status.status_code is StatusCode.ERROR and call.attributes["error.type"] == "budget"
    assert otel.attempts(call) == []  # nothing was sent
    assert [e.name for e in call.events] == ["llm_resilience.route_skipped"]


def test_nothing_subscribes_when_both_are_off(make_router: RouterFactory):
    router = make_router({"primary": ["a"]})
    detach = instrument(router, otel="off", prometheus="off")
    assert not router.events.active
    detach()
    with pytest.raises(ValueError, match="otel="):
        instrument(router, otel="yes")  # type: ignore[arg-type]


async def test_how_a_broken_stream_ended_is_an_event_on_the_call_span(
    make_router: RouterFactory, otel: Otel, sim: ProviderSimulator
):
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    _instrument(router, otel)
    sim.script("a", Fault.stream_cut(after_chunks=3))
    stream = await router.acompletion(model="primary", messages=MSG, stream=True)
    with pytest.raises(StreamInterruptedError):
        async for _ in stream:
            pass
    (event,) = [e for e in otel.call().events if e.name == "llm_resilience.stream_break"]
    assert event.attributes["llm_resilience.end"] == "given_up"
    assert event.attributes["llm_resilience.broken_deployment"] == "a"
    assert event.attributes["llm_resilience.deployment_id"] == "b"  # the replacement's
