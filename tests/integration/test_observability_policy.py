"""The policy's ``observability:`` section: the router instruments itself when built (``auto`` is
on when the package imports), ``on`` without the package is a ConfigError naming the extra, and
with it off (or absent) no OpenTelemetry or Prometheus object is touched on the healthy path."""

from __future__ import annotations

import sys
from collections import Counter as Calls
from typing import Any

import opentelemetry.metrics
import opentelemetry.trace
import pytest
from prometheus_client import REGISTRY
from prometheus_client.metrics import MetricWrapperBase

from llm_resilience_plugin import ConfigError, ResilientRouter
from llm_resilience_plugin.policy import ResiliencePolicy
from llm_resilience_plugin.testing._simulator import ProviderSimulator
from tests.conftest import FAST_POLICY, MSG, RouterFactory, deployment


def _calls(group: str) -> float:
    return (
        REGISTRY.get_sample_value(
            "llm_resilience_calls_total", {"group": group, "outcome": "success", "error_class": ""}
        )
        or 0.0
    )


async def test_the_section_instruments_the_router_when_built(make_router: RouterFactory) -> None:
    router = make_router({"obs_policy": ["a"]}, policy={"observability": {"otel": "off", "prometheus": "on"}})
    assert router.events.active  # subscribed at construction, no instrument() call
    before = _calls("obs_policy")
    await router.acompletion(model="obs_policy", messages=MSG, max_tokens=3)
    assert _calls("obs_policy") == before + 1
    router.close()  # close() detaches
    assert not router.events.active


def test_no_section_and_off_subscribe_nothing(make_router: RouterFactory) -> None:
    assert not make_router({"g": ["a"]}).events.active
    off = {"observability": {"otel": "off", "prometheus": "off"}}
    assert not make_router({"g": ["a"]}, policy=off).events.active


def test_auto_is_off_when_nothing_is_installed(
    make_router: RouterFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)
    router = make_router({"g": ["a"]}, policy={"observability": {}})
    assert not router.events.active


@pytest.mark.parametrize(
    ("backend", "module"), [("otel", "opentelemetry.trace"), ("prometheus", "prometheus_client")]
)
def test_on_without_the_package_is_a_config_error_naming_the_extra(
    sim: ProviderSimulator, monkeypatch: pytest.MonkeyPatch, backend: str, module: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    policy = {**FAST_POLICY, "observability": {backend: "on"}}
    with pytest.raises(ConfigError) as info:
        ResilientRouter(model_list=[deployment(sim, "g", "a")], policy=policy)
    assert info.value.field == f"observability.{backend}"
    assert f"pip install 'llm-resilience-plugin[{backend}]'" in str(info.value)


def test_the_section_is_validated_like_the_rest_of_the_policy() -> None:
    assert ResiliencePolicy.model_validate({"observability": {}}).observability.otel == "auto"  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=r"observability\.otel"):
        ResiliencePolicy.model_validate({"observability": {"otel": "yes"}})
    with pytest.raises(ValueError, match=r"observability\.grafana"):
        ResiliencePolicy.model_validate({"observability": {"grafana": "on"}})


async def test_off_creates_no_otel_or_prometheus_object_per_call(
    make_router: RouterFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Zero cost when off: the healthy path never asks for a tracer, a meter or a metric child."""
    calls: Calls[str] = Calls()

    def spy(name: str, real: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real(*args, **kwargs)

        return wrapper

    for mod, name in [
        (opentelemetry.trace, "get_tracer"),
        (opentelemetry.trace, "get_tracer_provider"),
        (opentelemetry.trace, "get_current_span"),
        (opentelemetry.metrics, "get_meter"),
        (opentelemetry.metrics, "get_meter_provider"),
    ]:
        monkeypatch.setattr(mod, name, spy(f"{mod.__name__}.{name}", getattr(mod, name)))
    monkeypatch.setattr(MetricWrapperBase, "labels", spy("prometheus.labels", MetricWrapperBase.labels))
    monkeypatch.setattr(MetricWrapperBase, "__init__", spy("prometheus.metric", MetricWrapperBase.__init__))
    routers = [
        make_router({"g": ["a"]}),
        make_router({"g": ["a"]}, policy={"observability": {"otel": "off", "prometheus": "off"}}),
    ]
    for router in routers:
        for _ in range(3):
            await router.acompletion(model="g", messages=MSG, max_tokens=3)
        stream = await router.acompletion(model="g", messages=MSG, max_tokens=3, stream=True)
        async for _ in stream:
            pass
    assert calls == Calls(), calls
