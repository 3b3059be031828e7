"""The learned idle timeout end to end, as docs/streaming.md states it: after MIN_SAMPLES fast
streams the group's idle limit is the 1 s floor for a stream whose break is recovered (it resumes
elsewhere), while ``effective_policy`` still shows the static 10 s; without recovery a healthy
pause longer than the floor is not cut (a cut would end the caller's answer)."""

from __future__ import annotations

import time

from llm_resilience_plugin import ErrorClass
from llm_resilience_plugin._engine.learned import FLOOR, MIN_SAMPLES
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator
from tests.conftest import RouterFactory

MSG = [{"role": "user", "content": "tell me a story"}]


async def test_fast_streams_teach_the_floor_and_a_longer_pause_is_cut(
    make_router: RouterFactory, sim: ProviderSimulator
) -> None:
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"deadline": 60, "attempt_timeout": 30},  # the defaults
    )
    for _ in range(MIN_SAMPLES):
        stream = await router.acompletion(model="primary", messages=MSG, stream=True)
        async for _chunk in stream:
            pass
    assert router.effective_policy("primary").stream_idle_timeout == 10.0  # the static default
    assert router.effective_policy("primary").learn_idle_timeouts  # ... which is learned over
    # healthy, but pausing 1.4 s between its few chunks
    sim.script("a", Fault.ok(text="Once upon", chunk_delay=FLOOR + 0.4))
    stream = await router.acompletion(model="primary", messages=MSG, stream=True)
    async for _chunk in stream:  # recovery off: nothing learned below the static 10 s, no cut
        pass
    assert stream.report.outcome == "success" and sim.count("b") == 0
    sim.script("a", Fault.ok(text="Once upon", chunk_delay=FLOOR + 0.4))
    stream = await router.acompletion(model="primary", messages=MSG, stream=True, recover_streams=True)
    t0 = time.monotonic()
    async for _chunk in stream:
        pass
    # recovered: cut at the learned 1 s (before the next chunk at 1.4 s), resumed on the fallback
    assert time.monotonic() - t0 < 5.0
    assert stream.report.outcome == "success" and stream.report.stream_restarts == 1
    assert stream.report.attempts[0].error_class is ErrorClass.TIMEOUT
    assert sim.count("b") == 1
