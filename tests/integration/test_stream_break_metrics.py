"""Stream breaks as metrics: ``llm_resilience.stream_breaks`` (OTel) and
``llm_resilience_stream_breaks_total`` (Prometheus) count each break after content by the group,
the deployment that broke and how it ended, over real streams to the simulator."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from llm_resilience_plugin import StreamInterruptedError
from llm_resilience_plugin.testing import Fault
from tests.integration.test_observability_metrics import Telemetry
from tests.integration.test_stream_seamless import LONG, SAME, STORY, cut, make, read


@pytest.fixture
def tel() -> Iterator[Telemetry]:
    t = Telemetry()
    yield t
    t.close()


def _ends(tel: Telemetry) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for p in tel.points("llm_resilience.stream_breaks"):
        key = (p.attributes["llm_resilience.deployment_id"], p.attributes["llm_resilience.stream_break.end"])
        out[key] = out.get(key, 0) + p.value
    return out


async def test_each_break_is_counted_by_how_it_ended(sim, routers, tel) -> None:
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": True}, "last": {"c": False}})
    tel.instrument(router)
    sim.script("a", Fault.stream_cut(after_chunks=3), cut(4, STORY), cut(4, STORY))
    await read(await router.acompletion(model="primary", messages=LONG, stream=True))  # continued on b
    sim.set_default("b", Fault.refuse_prefill(Fault.ok(text=STORY)))
    sim.set_default("c", Fault.ok(text="Once there was a fox."))
    # b refuses the prefill; c's replay differs, then b's (asked from scratch) matches
    await read(await router.acompletion(model="primary", messages=LONG, stream=True, **SAME))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, temperature=0.9)
    with pytest.raises(StreamInterruptedError):  # sampling, nowhere takes a prefill: given up
        await read(stream)

    ends = {("a", "continued"): 1, ("a", "diverged"): 1, ("a", "replayed"): 1, ("a", "given_up"): 1}
    assert _ends(tel) == ends
    for p in tel.points("llm_resilience.stream_breaks"):
        assert set(p.attributes) == {
            "llm_resilience.model_group",
            "llm_resilience.deployment_id",
            "llm_resilience.stream_break.end",
            "llm_resilience.error_class",
        }  # no call id
        assert p.attributes["llm_resilience.model_group"] == "primary"

    def prom(end: str) -> Any:
        labels = {"group": "primary", "deployment": "a", "end": end, "error_class": "connection"}
        return tel.prom("llm_resilience_stream_breaks_total", **labels)

    assert [prom(end) for end in ("continued", "replayed", "diverged", "given_up")] == [1, 1, 1, 1]
