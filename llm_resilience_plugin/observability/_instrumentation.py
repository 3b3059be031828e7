"""``instrument(router)``: OpenTelemetry and Prometheus instrumentation chosen by what is installed.

Like stamina's instrumentation: each backend is ``"auto"`` (on when its package imports),
``"on"`` (required: ImportError when missing) or ``"off"``. With none on, nothing subscribes and
calls pay nothing::

    from llm_resilience_plugin.observability import instrument

    detach = instrument(router)                 # OTel traces + metrics, Prometheus metrics
    detach = instrument(router, prometheus="off", tracer_provider=provider)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from llm_resilience_plugin.events import Event
    from llm_resilience_plugin.routing._router import ResilientRouter

Switch = Literal["auto", "on", "off"]

_PACKAGES = {
    "otel": ("opentelemetry.trace", "opentelemetry-api"),
    "prometheus": ("prometheus_client", "prometheus-client"),
}


def wanted(backend: str, switch: Switch) -> bool:
    """Whether ``backend`` ("otel" or "prometheus") is on: "auto" means its package imports."""
    if switch not in ("auto", "on", "off"):
        raise ValueError(f"{backend}= must be 'auto', 'on' or 'off', not {switch!r}")
    if switch == "off":
        return False
    module, dist = _PACKAGES[backend]
    try:
        importlib.import_module(module)
    except ImportError as exc:
        if switch == "on":
            raise ImportError(
                f"{backend}='on' needs {dist}: pip install 'llm-resilience-plugin[{backend}]'"
            ) from exc
        return False
    return True


def instrument(
    router: ResilientRouter,
    *,
    otel: Switch = "auto",
    prometheus: Switch = "auto",
    tracer_provider: Any = None,
    meter_provider: Any = None,
    registry: Any = None,
    capture_content: bool = False,
    budget_scope_values: bool = False,
) -> Callable[[], None]:
    """Trace and measure ``router``'s calls; returns a function that detaches the instrumentation.

    OpenTelemetry (``opentelemetry-api``): a ``chat {group}`` CLIENT span per logical call under
    the caller's current span, a child span per attempt, GenAI-convention attributes plus
    ``llm_resilience.*``, and the ``gen_ai.client.*`` / ``llm_resilience.*`` metrics, through
    ``tracer_provider`` / ``meter_provider`` (default: the global ones). Prometheus
    (``prometheus-client``): ``llm_resilience_*`` metrics in ``registry`` (default: the global
    ``REGISTRY``). Message content reaches spans only with ``capture_content=True``. A scoped
    cost budget's gauges are one series per budget (spend summed, the tightest value's remaining)
    unless ``budget_scope_values=True`` (one series per scope value: a tenant becomes a label).
    """
    listeners: list[Callable[[Event], None]] = []
    closers: list[Callable[[], None]] = []
    if wanted("otel", otel):
        from llm_resilience_plugin.observability._otel import OtelMetrics, OtelTracer

        tracer = OtelTracer(router, tracer_provider, capture_content=capture_content)
        meters = OtelMetrics(router, meter_provider, scope_values=budget_scope_values)
        listeners += [tracer, meters]
        closers += [tracer.close, meters.close]
    if wanted("prometheus", prometheus):
        from llm_resilience_plugin.observability._prometheus import PrometheusRecorder

        recorder = PrometheusRecorder(router, registry, scope_values=budget_scope_values)
        listeners.append(recorder)
        closers.append(recorder.close)
    unsubscribes = [router.subscribe(listener) for listener in listeners]

    def detach() -> None:
        while unsubscribes:
            unsubscribes.pop()()
        while closers:
            closers.pop()()

    return detach
