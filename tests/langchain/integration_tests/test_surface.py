"""ResilientChatModel's LangChain surface against the simulator: what dumps and reprs show, LLM
cache keys, router state shared by configured copies, sync callbacks kept off the router's loop,
the provider named in metadata, a clean interpreter exit, and no echoed key in what a caller sees."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import tenacity
from langchain_core.callbacks import BaseCallbackHandler

from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin.langchain import ResilientChatModel
from llm_resilience_plugin.testing import FakeClock
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator
from tests.conftest import FAST_POLICY, deployment

# Not key-shaped (no "sk-" prefix): only knowing it is a credential can mask it.
LITERAL_KEY = "literal-credential-0123456789"
URL_SECRET = "url-pass-9876"
LOOP_THREAD = "llm-resilience-sync"


def model_list(sim: ProviderSimulator, key: str = LITERAL_KEY) -> list[dict[str, Any]]:
    return [
        deployment(sim, "primary", "p1", api_key=key),
        deployment(sim, "backup", "b1", api_key=key),
    ]


def own_model(sim: ProviderSimulator, **kwargs: Any) -> ResilientChatModel:
    """A model that builds its own router (literal keys: it serializes as "not implemented")."""
    kwargs.setdefault("model", "primary")
    kwargs.setdefault("policy", FAST_POLICY)
    return ResilientChatModel(model_list=model_list(sim), **kwargs)


def loop_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == LOOP_THREAD)


@pytest.fixture
def router(sim: ProviderSimulator) -> Iterator[ResilientRouter]:
    r = ResilientRouter(
        model_list=model_list(sim),
        policy=FAST_POLICY,
        fallbacks=[{"primary": ["backup"]}],
        clock=FakeClock(),
        seed=5,
    )
    yield r
    r.close()


# -- 4. sync callbacks never run on the router's loop -------------------------------------------------


class Slow(BaseCallbackHandler):
    """Sleeps in ``on_retry`` or in the retry's custom event, noting the threads it ran on."""

    def __init__(self, where: str, seconds: float) -> None:
        self.where = where
        self.seconds = seconds
        self.threads: list[str] = []
        self.lock = threading.Lock()

    def _slow(self) -> None:
        with self.lock:
            self.threads.append(threading.current_thread().name)
        time.sleep(self.seconds)

    def on_retry(self, retry_state: tenacity.RetryCallState, *, run_id: UUID, **kw: Any) -> None:
        if self.where == "on_retry":
            self._slow()

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kw: Any) -> None:
        if self.where == "custom_event" and name == "llm_resilience.retry":
            self._slow()


@pytest.mark.parametrize("where", ["on_retry", "custom_event"])
def test_a_slow_sync_callback_holds_up_only_its_own_call(
    sim: ProviderSimulator, router: ResilientRouter, where: str
) -> None:
    llm = ResilientChatModel(router=router, model="primary")
    llm.invoke("warm up")  # the loop thread and the HTTP client exist before timing
    calls = 4
    sim.script("p1", *[Fault.rate_limit() for _ in range(calls)])  # one retry per call
    handler = Slow(where, 0.5)
    start = threading.Barrier(calls)
    answers: list[str] = []

    def call() -> None:
        start.wait()
        answers.append(str(llm.invoke("hi", config={"callbacks": [handler]}).content))

    threads = [threading.Thread(target=call) for _ in range(calls)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    elapsed = time.monotonic() - t0
    assert len(answers) == calls and all(a.startswith("Hello from p1") for a in answers)
    assert len(handler.threads) == calls and LOOP_THREAD not in handler.threads
    assert elapsed < 1.4, f"{calls} calls with a 0.5 s callback each took {elapsed:.2f}s (serialized?)"


def test_sync_stream_events_arrive_in_order_on_the_calling_thread(
    sim: ProviderSimulator, router: ResilientRouter
) -> None:
    seen: list[tuple[str, str]] = []

    class Rec(BaseCallbackHandler):
        def on_retry(self, retry_state: tenacity.RetryCallState, **kw: Any) -> None:
            seen.append(("on_retry", threading.current_thread().name))

        def on_custom_event(self, name: str, data: Any, **kw: Any) -> None:
            seen.append((name, threading.current_thread().name))

    llm = ResilientChatModel(router=router, model="primary")
    sim.script("p1", Fault.rate_limit())
    chunks = list(llm.stream("hi", config={"callbacks": [Rec()]}))
    assert "".join(str(c.content) for c in chunks).startswith("Hello from p1")
    assert [n for n, _ in seen] == [
        "llm_resilience.attempt", "llm_resilience.retry", "on_retry", "llm_resilience.attempt",
    ]  # fmt: skip
    assert all(t != LOOP_THREAD for _, t in seen)
    assert seen[-1][1] == threading.current_thread().name


# -- 6. a clean exit ---------------------------------------------------------------------------------

EXIT_SCRIPT = """
import asyncio, gc, sys
import llm_resilience_plugin
from llm_resilience_plugin.testing._simulator import ProviderSimulator
from llm_resilience_plugin.langchain import ResilientChatModel

sim = ProviderSimulator().__enter__()
deps = [{{"model_name": "a", "litellm_params": {{"model": "openai/gpt-4o-mini",
        "api_base": sim.api_base("a1"), "api_key": "sk-sim-secret"}}, "model_info": {{"id": "a1"}}}}]
llm = ResilientChatModel(model_list=deps, model="a")
llm.invoke("hi")
asyncio.run(llm.ainvoke("hi"))
{extra}
print("done", file=sys.stderr)
"""


def run_exit_script(extra: str) -> str:
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "PYTHONWARNINGS": "default"}
    proc = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT.format(extra=textwrap.dedent(extra))],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=Path(__file__).parents[3],
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done" in proc.stderr
    return proc.stderr


@pytest.mark.parametrize(
    "extra",
    [
        "llm.close()",
        "",  # never closed: the model's hold is released at exit
        "it = llm.stream('hi'); next(it)",  # a stream left open, collected at exit
        "it = llm.stream('hi'); next(it); llm.close()",
    ],
)
def test_no_pending_task_or_unawaited_coroutine_at_exit(extra: str) -> None:
    stderr = run_exit_script(extra)
    assert "Task was destroyed but it is pending" not in stderr
    assert "was never awaited" not in stderr


@pytest.mark.xfail(
    strict=True,
    reason=(
        "LiteLLM's process-wide LoggingWorker follows the loop of the latest call: after a sync "
        "call (the router's private loop) then an async one, it drops its worker task on the "
        "private loop, which nothing else references; collected while pending, it is reported. "
        "Fix in _engine/drivers.SyncRunner: hold every task created on the private loop until "
        "it is done (a task factory), so close() cancels it instead"
    ),
)
def test_no_pending_task_reported_when_collected_before_close() -> None:
    stderr = run_exit_script("gc.collect()\nllm.close()")
    assert "Task was destroyed but it is pending" not in stderr
