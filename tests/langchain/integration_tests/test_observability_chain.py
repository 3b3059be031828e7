"""A LangChain chain run (prompt | ResilientChatModel | parser) under a caller's OpenTelemetry span:
the router's call and attempt spans nest under it, a retry shows as an error attempt and a span
event, and the OTel and Prometheus metrics record the run (in-memory exporter and reader, a
CollectorRegistry)."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry

from llm_resilience_plugin.langchain import ResilientChatModel
from llm_resilience_plugin.observability import instrument
from llm_resilience_plugin.testing import Fault
from llm_resilience_plugin.testing._simulator import ProviderSimulator
from tests.conftest import RouterFactory


def _metric_count(reader: InMemoryMetricReader, name: str) -> float:
    data = reader.get_metrics_data()
    total = 0.0
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    total += sum(
                        getattr(p, "count", None) or getattr(p, "value", 0) for p in m.data.data_points
                    )
    return total


@pytest.mark.parametrize("mode", ["ainvoke", "invoke"])
async def test_a_chain_run_nests_the_router_spans_and_records_metrics(
    make_router: RouterFactory, sim: ProviderSimulator, mode: str
) -> None:
    spans, tp = InMemorySpanExporter(), TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    registry = CollectorRegistry()
    router = make_router({"primary": ["a"]})
    instrument(router, tracer_provider=tp, meter_provider=mp, registry=registry)
    chain = (
        ChatPromptTemplate.from_messages([("user", "Answer briefly: {question}")])
        | ResilientChatModel(router=router, model="primary", max_tokens=6)
        | StrOutputParser()
    )
    sim.script("a", Fault.server_error(500))  # one retry inside the chain's call

    with tp.get_tracer("app").start_as_current_span("chain run") as parent:
        args: Any = {"question": "what is a circuit breaker?"}
        answer = await chain.ainvoke(args) if mode == "ainvoke" else chain.invoke(args)
    assert answer.startswith("Hello from a")

    finished = spans.get_finished_spans()
    (call,) = [s for s in finished if s.name == "chat primary"]
    ctx = parent.get_span_context()
    assert call.parent is not None and call.parent.span_id == ctx.span_id
    assert call.context.trace_id == ctx.trace_id
    attempts = sorted(
        (s for s in finished if s.parent is not None and s.parent.span_id == call.context.span_id),
        key=lambda s: s.attributes["llm_resilience.attempt"],  # type: ignore[index]
    )
    assert [a.status.status_code for a in attempts] == [StatusCode.ERROR, StatusCode.UNSET]
    assert attempts[0].attributes["llm_resilience.error_class"] == "server"
    assert [e.name for e in call.events] == ["llm_resilience.retry"]
    assert call.attributes["gen_ai.usage.output_tokens"] == 6

    assert _metric_count(reader, "gen_ai.client.operation.duration") == 1
    assert _metric_count(reader, "gen_ai.client.token.usage") >= 1
    sample = registry.get_sample_value
    assert (
        sample("llm_resilience_calls_total", {"group": "primary", "outcome": "success", "error_class": ""})
        == 1
    )
    assert sample("llm_resilience_retries_total", {"group": "primary", "error_class": "server"}) == 1
    assert sample("llm_resilience_upstream_requests_per_call_sum", {"group": "primary"}) == 2
    tp.shutdown()
    mp.shutdown()
