"""instrument(router) with prometheus-client over real router traffic to the simulator: calls by
outcome and error class, attempts, retries, fallbacks, upstream requests per call, breaker state
and transitions, time to first token - with low-cardinality labels only."""

from __future__ import annotations

import sys

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from llm_resilience_plugin.observability import instrument
from llm_resilience_plugin.testing import Fault
from llm_resilience_plugin.testing._simulator import ProviderSimulator
from tests.conftest import MSG, RouterFactory


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    got = registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


async def test_calls_attempts_retries_and_upstream_requests(
    make_router: RouterFactory, sim: ProviderSimulator
):
    registry = CollectorRegistry()
    router = make_router({"primary": ["a"]})
    detach = instrument(router, otel="off", registry=registry)
    await router.acompletion(model="primary", messages=MSG, max_tokens=5)
    sim.script("a", Fault.server_error(500))
    await router.acompletion(model="primary", messages=MSG, max_tokens=5)

    calls = "llm_resilience_calls_total"
    assert value(registry, calls, group="primary", outcome="success", error_class="") == 2
    attempts = "llm_resilience_attempts_total"
    assert value(registry, attempts, group="primary", deployment="a", outcome="success", error_class="") == 2
    assert (
        value(registry, attempts, group="primary", deployment="a", outcome="failure", error_class="server")
        == 1
    )
    assert value(registry, "llm_resilience_retries_total", group="primary", error_class="server") == 1
    upstream = "llm_resilience_upstream_requests_per_call"
    assert value(registry, f"{upstream}_count", group="primary") == 2
    assert value(registry, f"{upstream}_sum", group="primary") == 3
    assert value(registry, f"{upstream}_bucket", group="primary", le="1.0") == 1
    assert (
        value(registry, "llm_resilience_call_duration_seconds_count", group="primary", outcome="success") == 2
    )
    assert value(registry, "llm_resilience_tokens_total", group="primary", type="output") == 10
    text = generate_latest(registry).decode()
    assert "call_id" not in text and "chatcmpl" not in text  # no per-call labels

    detach()
    await router.acompletion(model="primary", messages=MSG, max_tokens=5)
    assert value(registry, calls, group="primary", outcome="success", error_class="") == 2
    assert not router.events.active


async def test_fallbacks_breakers_and_failures(make_router: RouterFactory, sim: ProviderSimulator):
    registry = CollectorRegistry()
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"breaker": {"fail_max": 1}},
    )
    instrument(router, otel="off", prometheus="on", registry=registry)
    state = "llm_resilience_breaker_state"
    assert value(registry, state, group="primary", deployment="a") == 0
    assert registry.get_sample_value(state, {"group": "backup", "deployment": "b"}) == 0
    sim.script("a", Fault.server_error(500))
    await router.acompletion(model="primary", messages=MSG, max_tokens=5)

    assert value(registry, state, group="primary", deployment="a") == 2
    assert value(registry, state, group="backup", deployment="b") == 0
    transitions = "llm_resilience_breaker_transitions_total"
    assert value(registry, transitions, group="primary", deployment="a", new_state="open") == 1
    fallbacks = "llm_resilience_fallbacks_total"  # the group's only deployment is open: it moves on
    assert value(registry, fallbacks, group="primary", to_group="backup", error_class="circuit_open") == 1
    skipped = {"group": "primary", "deployment": "", "outcome": "skipped", "error_class": "circuit_open"}
    assert value(registry, "llm_resilience_attempts_total", **skipped) == 1

    sim.script("b", Fault.http_error(400, message="bad request"))
    with pytest.raises(Exception, match="bad request"):
        await router.acompletion(model="backup", messages=MSG, max_tokens=5)
    failed = value(
        registry, "llm_resilience_calls_total", group="backup", outcome="failure", error_class="bad_request"
    )
    assert failed == 1


async def test_stream_time_to_first_token(make_router: RouterFactory):
    registry = CollectorRegistry()
    router = make_router({"primary": ["a"]})
    instrument(router, otel="off", registry=registry)
    stream = await router.acompletion(model="primary", messages=MSG, max_tokens=5, stream=True)
    assert value(registry, "llm_resilience_time_to_first_token_seconds_count", group="primary") == 0
    async for _ in stream:
        pass
    assert value(registry, "llm_resilience_time_to_first_token_seconds_count", group="primary") == 1
    assert value(registry, "llm_resilience_time_to_first_token_seconds_sum", group="primary") > 0


def test_two_routers_share_one_registry(make_router: RouterFactory):
    registry = CollectorRegistry()
    first, second = make_router({"primary": ["a"]}), make_router({"other": ["b"]})
    instrument(first, otel="off", registry=registry)
    instrument(second, otel="off", registry=registry)  # registered once, no duplicate error
    assert value(registry, "llm_resilience_breaker_state", group="other", deployment="b") == 0


def test_auto_is_off_when_the_package_does_not_import(
    make_router: RouterFactory, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)
    router = make_router({"primary": ["a"]})
    instrument(router)  # both "auto": nothing imports, nothing subscribes
    assert not router.events.active
    with pytest.raises(ImportError, match="prometheus-client"):
        instrument(router, otel="off", prometheus="on")
    with pytest.raises(ImportError, match="opentelemetry-api"):
        instrument(router, otel="on", prometheus="off")
    assert not router.events.active
