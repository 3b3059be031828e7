"""No "coroutine ... was never awaited" from the plugin's normal use (real HTTP, the simulator).

LiteLLM's ``acompletion`` runs the blocking ``completion()`` in the loop's executor, which returns
the provider's coroutine; a cancellation while it waits for that thread (the caller's, a
deadline, the router's shutdown) used to drop that coroutine unawaited. Warnings from a
collected coroutine cannot raise (they happen in a finalizer), so each test also records them.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin.testing import Fault, ProviderSimulator
from tests.conftest import FAST_POLICY, MSG, deployment

pytestmark = [
    pytest.mark.filterwarnings("error::RuntimeWarning"),
    pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning"),
]

# A large request keeps LiteLLM's blocking preparation in its executor thread long enough to be
# caught in the middle of it.
BIG = [{"role": "user", "content": "lorem ipsum dolor sit amet " * 40_000}]


@contextlib.contextmanager
def no_runtime_warning() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", RuntimeWarning)
        yield seen
        gc.collect()
    assert not [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]


def _router(sim: ProviderSimulator, **kw: Any) -> ResilientRouter:
    for d in ("a", "b"):
        sim.set_default(d, Fault.ok(latency=0.02))
    return ResilientRouter(model_list=[deployment(sim, "g", d) for d in ("a", "b")], policy=FAST_POLICY, **kw)


def _in_litellm_executor() -> bool:
    """Is a worker thread inside LiteLLM's blocking ``completion()`` right now?"""
    me = threading.get_ident()
    for ident, frame in sys._current_frames().items():
        f: Any = frame
        while ident != me and f is not None:
            code = f.f_code
            if code.co_name == "completion" and code.co_filename.endswith("litellm/main.py"):
                return True
            f = f.f_back
    return False


@pytest.fixture
def fine_switching() -> Iterator[None]:
    """Threads switch every 10 us: the loop thread sees the executor's thread mid-way."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


async def _cancel_in_executor(call: Any) -> bool:
    """Start ``call``, cancel it while LiteLLM waits for its executor (True: caught there)."""
    task = asyncio.ensure_future(call)
    caught = False
    end = time.monotonic() + 2
    while not task.done() and time.monotonic() < end:
        if _in_litellm_executor():
            caught = True
            break
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    return caught


async def test_a_call_cancelled_while_litellm_waits_for_its_executor_leaves_no_coroutine(
    sim: ProviderSimulator, fine_switching: None
) -> None:
    router = _router(sim)
    try:
        with no_runtime_warning():
            # Catching the executor mid-way is a race the loop thread wins only some of the time
            # (a loaded CI machine less often): try until four calls were caught there.
            caught = 0
            for i in range(40):
                stream = i % 2 == 1
                caught += await _cancel_in_executor(
                    router.acompletion(model="g", messages=BIG, stream=stream)
                )
                if caught >= 4:
                    break
            assert caught >= 4, "never caught LiteLLM in its executor"
            # Nothing was left half-done: the router still answers.
            assert (await router.acompletion(model="g", messages=MSG)).choices[0].message.content
    finally:
        await router.aclose()


async def test_common_paths_emit_no_runtime_warning(sim: ProviderSimulator) -> None:
    with no_runtime_warning():
        router = _router(sim)
        await router.acompletion(model="g", messages=MSG)
        [c async for c in await router.acompletion(model="g", messages=MSG, stream=True)]
        await router.aembedding(model="g", input="x")
        # Callers' cancellations, calls past their deadline, streams dropped half-read.
        for _ in range(20):
            task = asyncio.ensure_future(router.acompletion(model="g", messages=MSG))
            await asyncio.sleep(0.001)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(Exception):
            await router.acompletion(model="g", messages=MSG, deadline=0.005)
        half = await router.acompletion(model="g", messages=MSG, stream=True)
        await half.__aiter__().__anext__()
        del half
        # The router's shutdown with calls in flight (cut after a zero grace).
        calls = [asyncio.ensure_future(router.acompletion(model="g", messages=BIG)) for _ in range(8)]
        await asyncio.sleep(0.005)
        await router.aclose(grace=0)
        await asyncio.gather(*calls, return_exceptions=True)


def test_blocking_calls_and_a_close_with_calls_in_flight_emit_no_runtime_warning(
    sim: ProviderSimulator, fine_switching: None
) -> None:
    with no_runtime_warning():
        for _ in range(3):
            router = _router(sim)
            router.completion(model="g", messages=MSG)
            list(router.completion(model="g", messages=MSG, stream=True))

            def one(router: ResilientRouter) -> None:
                with contextlib.suppress(Exception):
                    router.completion(model="g", messages=BIG)

            threads = [threading.Thread(target=one, args=(router,)) for _ in range(8)]
            for t in threads:
                t.start()
            end = time.monotonic() + 2
            while not _in_litellm_executor() and time.monotonic() < end:
                time.sleep(0.0005)
            router.close(grace=0)  # cut while LiteLLM prepares them
            for t in threads:
                t.join(10)
