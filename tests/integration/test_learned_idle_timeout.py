"""The learned idle timeout end to end, as docs/streaming.md states it: after MIN_SAMPLES fast
streams the group's idle limit is the 1 s floor while ``effective_policy`` still shows the static
10 s, and a stream that pauses longer mid-answer is cut (recovery off: the caller gets the error)."""

from __future__ import annotations

import time

import pytest

from llm_resilience_plugin import ErrorClass, StreamInterruptedError
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
    sim.script("a", Fault.ok(chunk_delay=FLOOR + 0.4))  # healthy, but pauses 1.4 s between chunks
    stream = await router.acompletion(model="primary", messages=MSG, stream=True)
    t0 = time.monotonic()
    with pytest.raises(StreamInterruptedError) as info:
        async for _chunk in stream:
            pass
    # cut at the learned 1 s: before the next chunk (1.4 s), not after the static 10 s
    assert time.monotonic() - t0 < 5.0
    assert info.value.partial_text and info.value.report is not None
    assert info.value.report.error_class is ErrorClass.TIMEOUT
    assert sim.count("b") == 0  # recovery off: nowhere else to go for the broken stream
