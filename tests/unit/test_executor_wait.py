"""quiet_cancel: a coroutine cancelled while it waits for an executor leaves no never-awaited
coroutine; everything else behaves as a plain await (results, errors, prompt cancellation)."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import warnings
from typing import Any

import pytest

from llm_resilience_plugin._engine.executor_wait import quiet_cancel

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")


async def _provider_call() -> str:
    await asyncio.sleep(0)
    return "answer"


def _prepare(started: threading.Event, release: threading.Event) -> Any:
    """What LiteLLM's blocking completion() does for an async call: returns a coroutine."""
    started.set()
    release.wait(5)
    return _provider_call()


async def _like_acompletion(started: threading.Event, release: threading.Event) -> str:
    loop = asyncio.get_running_loop()
    coro = await loop.run_in_executor(None, _prepare, started, release)
    return await coro  # type: ignore[no-any-return]


async def _cancel_mid_executor(wrap: bool) -> list[str]:
    started, release = threading.Event(), threading.Event()
    call = _like_acompletion(started, release)
    task = asyncio.ensure_future(quiet_cancel(call) if wrap else call)
    await asyncio.sleep(0)  # the task starts and hands _prepare to the executor
    assert started.wait(5)  # the executor's thread is in _prepare: the task waits for it
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", RuntimeWarning)
        await asyncio.sleep(0.05)  # the executor's thread hands back its coroutine
        gc.collect()
    return [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]


async def test_a_cancel_while_the_executor_runs_leaves_no_never_awaited_coroutine() -> None:
    assert await _cancel_mid_executor(wrap=True) == []
    assert any("never awaited" in m for m in await _cancel_mid_executor(wrap=False))  # the problem


async def test_results_errors_and_executor_values_pass_through() -> None:
    started, release = threading.Event(), threading.Event()
    release.set()
    assert await quiet_cancel(_like_acompletion(started, release)) == "answer"

    async def fails() -> None:
        await asyncio.get_running_loop().run_in_executor(None, time.sleep, 0)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await quiet_cancel(fails())

    async def executor_error() -> None:
        await asyncio.get_running_loop().run_in_executor(None, int, "x")

    with pytest.raises(ValueError):
        await quiet_cancel(executor_error())


async def test_a_cancel_elsewhere_is_as_prompt_as_a_plain_await() -> None:
    cleaned: list[str] = []

    async def long_wait() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.append("finally")

    task = asyncio.ensure_future(quiet_cancel(long_wait()))
    await asyncio.sleep(0.01)
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < 0.5 and cleaned == ["finally"]
