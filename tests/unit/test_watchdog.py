"""The attempt watchdog: the hard bound that ends an attempt LiteLLM's own timeout did not end."""

from __future__ import annotations

import asyncio
import time

import pytest

from llm_resilience_plugin._engine import watchdog
from llm_resilience_plugin._engine.watchdog import SWEEP_INTERVAL, AttemptWatchdog


async def test_overrun_becomes_timeout_error_shortly_after_the_bound() -> None:
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"exceeded 0\.10s"):
        with AttemptWatchdog(0.1):
            await asyncio.sleep(5)
    elapsed = time.monotonic() - t0
    assert 0.1 <= elapsed < 0.1 + 2 * SWEEP_INTERVAL + 0.1
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_finished_attempt_is_untouched_and_forgotten() -> None:
    with AttemptWatchdog(1.0) as dog:
        await asyncio.sleep(0)
    assert not dog.fired
    loop_dog = watchdog.loop_watchdog(asyncio.get_running_loop())
    assert loop_dog is not None and loop_dog.in_flight == 0
    await asyncio.sleep(SWEEP_INTERVAL * 2)  # the sweep stops once nothing is in flight
    assert not loop_dog.armed


async def test_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    async def attempt() -> None:
        with AttemptWatchdog(5.0):
            await asyncio.sleep(5)

    task = asyncio.create_task(attempt())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_many_concurrent_attempts_each_get_their_own_bound() -> None:
    async def attempt(bound: float, work: float) -> str:
        try:
            with AttemptWatchdog(bound):
                await asyncio.sleep(work)
            return "done"
        except TimeoutError:
            return "timeout"

    results = await asyncio.gather(*(attempt(0.1, 0.3 if i % 2 else 0.0) for i in range(200)))
    assert results.count("timeout") == 100 and results.count("done") == 100


def test_each_event_loop_has_its_own_sweep() -> None:
    async def overrun() -> str:
        try:
            with AttemptWatchdog(0.05):
                await asyncio.sleep(1)
        except TimeoutError:
            return "timeout"
        return "done"

    assert asyncio.run(overrun()) == "timeout"
    assert asyncio.run(overrun()) == "timeout"


def test_outside_a_task_is_an_error() -> None:
    errors: list[BaseException] = []

    def enter() -> None:  # a plain loop callback: a running loop, but no task
        try:
            with AttemptWatchdog(1.0):
                pass
        except RuntimeError as e:
            errors.append(e)

    loop = asyncio.new_event_loop()
    try:
        loop.call_soon(enter)
        loop.run_until_complete(asyncio.sleep(0.01))
    finally:
        loop.close()
    assert len(errors) == 1 and "running task" in str(errors[0])


def test_a_finished_loop_is_not_kept_alive() -> None:
    import gc
    import weakref

    async def guarded() -> asyncio.AbstractEventLoop:
        with AttemptWatchdog(1.0):
            await asyncio.sleep(0)
        return asyncio.get_running_loop()

    loop = asyncio.new_event_loop()
    loop.run_until_complete(guarded())
    loop.close()
    ref = weakref.ref(loop)
    del loop
    gc.collect()
    assert ref() is None
    # and a new loop gets its own watchdog, not the dead loop's cached one
    assert asyncio.run(guarded()) is not None
