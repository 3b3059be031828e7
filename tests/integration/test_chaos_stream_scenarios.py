"""The chaos benchmark's stream scenarios, the plugin's cells, against the simulator over loopback:
where a route takes the prefill or a replay reproduces (a cut, an undecodable event, a stall; a
fallback refusing the prefill), a plain chunk loop and LangChain ``astream`` complete the call,
never garbled; where neither holds (a sampling request, no prefill route; replays that diverge),
the typed error arrives within the deadline carrying the complete replacement answer.

One call per cell, no warm-up; the stall scenarios' idle limit is pinned at 0.5 s here (the
benchmark waits out the default 10 s) so the test need not, and healthy streams come ten times
faster than the benchmark's (what is judged is the outcome, not the latency)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from benchmarks import _chaos_scenarios
from benchmarks._chaos_scenarios import Scenario, healthy, scenarios
from benchmarks._chaos_systems import Cell, Outcome, build
from benchmarks.chaos import timed
from llm_resilience_plugin.testing import ProviderSimulator

DEADLINE = 60.0  # the plugin's default deadline (the benchmark runs it on its defaults)
STALL_IDLE = 0.5

RECOVERABLE = [
    "stream-cut-prefill",
    "stream-cut-same",
    "stream-cut-prefill-refused",
    "stream-cut-prefill-refused-next",
    "malformed-text-prefill",
    "malformed-text-same",
    "stall-prefill",
    "stall-same",
]
UNRECOVERABLE = ["stream-cut", "stream-cut-diverge", "malformed-text", "stall"]
CALLERS = pytest.mark.parametrize("consumer", ["stream", "astream"])


@pytest.fixture(autouse=True)
def _fast_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scenarios' healthy first token and chunk pace, ten times shorter."""
    monkeypatch.setattr(_chaos_scenarios, "HEALTHY_TTFT", _chaos_scenarios.HEALTHY_TTFT / 10)
    monkeypatch.setattr(_chaos_scenarios, "HEALTHY_CHUNK_DELAY", _chaos_scenarios.HEALTHY_CHUNK_DELAY / 10)


def _scenario(name: str) -> Scenario:
    (sc,) = [s for s in scenarios(quick=True) if s.name == name]
    if name.startswith("stall"):
        policy = {**sc.plugin_policy, "stream_idle_timeout": STALL_IDLE}
        sc = dataclasses.replace(sc, plugin_policy=policy)
    return sc


async def _one_call(sim: ProviderSimulator, name: str, consumer: str) -> tuple[Cell, Outcome, float]:
    """The plugin's cell of scenario ``name`` for ``consumer``: healthy deployments, the fault
    injected, one call read to its end (the benchmark's own timing and judging)."""
    cell = Cell(_scenario(name), "plugin", consumer)
    for dep in cell.scenario.deployments:
        sim.set_default(cell.dep(dep), healthy(cell.answer(dep)))
    system = build(cell, sim)
    try:
        cell.scenario.inject(sim, cell)
        outcome, took = await timed(system)
    finally:
        system.close()
    return cell, outcome, took


@CALLERS
@pytest.mark.parametrize("name", RECOVERABLE)
async def test_a_recoverable_break_completes_unseen(sim, name: str, consumer: str) -> None:
    cell, outcome, _ = await _one_call(sim, name, consumer)
    assert outcome.ok, outcome
    assert not outcome.garbled and outcome.markers == ()  # nothing in-band on the default
    assert sim.count(cell.dep("p-a")) == 1  # the primary broke after content: recovered elsewhere
    if name.endswith("-same") or name == "stream-cut-prefill-refused":
        assert outcome.deployment == "f-a"  # the same model's replay, verified and gone on
    if name == "stream-cut-prefill-refused":
        # the fallback refused the prefill (400), then answered the replay from scratch
        assert [r.status for r in sim.requests(cell.dep("f-a"))] == [400, 200]
    if name.endswith("-prefill") or name == "stream-cut-prefill-refused-next":
        assert outcome.deployment == "p-a"  # the primary's answer, continued elsewhere
        went_on = cell.dep("l-a" if name.endswith("-next") else "f-a")
        (continued,) = [r for r in sim.requests(went_on) if r.status == 200]
        assert continued.body["messages"][-1]["role"] == "assistant"


@CALLERS
@pytest.mark.parametrize("name", UNRECOVERABLE)
async def test_no_way_on_is_the_typed_error_with_the_replacement(sim, name: str, consumer: str) -> None:
    started = time.monotonic()
    cell, outcome, took = await _one_call(sim, name, consumer)
    assert outcome.error == "StreamInterruptedError with replacement", outcome
    assert not outcome.garbled
    assert took < DEADLINE and time.monotonic() - started < DEADLINE
    assert sim.count(cell.dep("f-a")) >= 1  # the replacement came from the fallback
