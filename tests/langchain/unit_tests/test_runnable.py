"""resilient(runnable): taxonomy-driven retries, on_retry, breakers, deadlines, batch alignment,
stream retries before the first chunk only, run tree and input hygiene."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any
from uuid import UUID

import httpx
import pytest
import tenacity
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableGenerator, RunnableLambda
from langchain_core.tracers.base import BaseTracer
from langchain_core.tracers.schemas import Run

from llm_resilience_plugin import (
    AllRoutesFailedError,
    CircuitOpenError,
    DeadlineExceededError,
    ErrorClass,
    StreamInterruptedError,
    get_report,
)
from llm_resilience_plugin.langchain import ResilientRunnable, resilient
from llm_resilience_plugin.testing import FakeClock
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator

FAST = {"backoff": {"initial": 0.01, "maximum": 0.05}, "breaker": {"fail_max": 50, "reset_timeout": 5}}


def flaky(failures: list[BaseException], result: Any = "ok") -> tuple[RunnableLambda[Any, Any], list[Any]]:
    """A runnable raising ``failures`` in order, then returning ``result``; logs its inputs."""
    seen: list[Any] = []
    queue = list(failures)

    def fn(x: Any) -> Any:
        seen.append(x)
        if queue:
            raise queue.pop(0)
        return result if not callable(result) else result(x)

    return RunnableLambda(fn), seen


class Recorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.retries: list[tuple[int, UUID]] = []
        self.custom: list[tuple[str, dict[str, Any], UUID]] = []
        self.chain_runs: dict[str, UUID] = {}

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID, **kw: Any) -> None:
        self.chain_runs.setdefault(kw.get("name") or "", run_id)

    def on_retry(self, retry_state: tenacity.RetryCallState, *, run_id: UUID, **kw: Any) -> None:
        self.retries.append((retry_state.attempt_number, run_id))

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kw: Any) -> None:
        self.custom.append((name, data, run_id))


class Collect(BaseTracer):
    def __init__(self) -> None:
        super().__init__()
        self.runs: list[Run] = []

    def _persist_run(self, run: Run) -> None:
        self.runs.append(run)

    def all_runs(self) -> list[Run]:
        out: list[Run] = []

        def walk(r: Run) -> None:
            out.append(r)
            for c in r.child_runs:
                walk(c)

        for r in self.runs:
            walk(r)
        return out


# -- invoke --------------------------------------------------------------------------------------


def test_retryable_failures_are_retried_with_on_retry_and_events() -> None:
    inner, seen = flaky([ConnectionError("connection reset by peer"), TimeoutError("slow")])
    clock = FakeClock()
    step = resilient(inner, policy=FAST, clock=clock, name="search")
    rec = Recorder()
    assert step.invoke("q", config={"callbacks": [rec]}) == "ok"
    assert seen == ["q", "q", "q"]
    wrapper_run = rec.chain_runs["Resilient[search]"]
    assert rec.retries == [(1, wrapper_run), (2, wrapper_run)]
    names = [n for n, _, _ in rec.custom]
    assert names == [
        "llm_resilience.attempt", "llm_resilience.retry", "llm_resilience.attempt",
        "llm_resilience.retry", "llm_resilience.attempt",
    ]  # fmt: skip
    assert all(r == wrapper_run for _, _, r in rec.custom)
    assert [d["error_class"] for n, d, _ in rec.custom if n == "llm_resilience.attempt"] == [
        "connection", "timeout", None,
    ]  # fmt: skip
    assert len(clock.slept) == 2  # backoff sleeps, instant on the fake clock


async def test_async_retries_fire_on_retry() -> None:
    inner, seen = flaky([ConnectionError("connection refused")])
    step = resilient(inner, policy=FAST, clock=FakeClock())
    rec = Recorder()
    assert await step.ainvoke("q", config={"callbacks": [rec]}) == "ok"
    assert len(seen) == 2 and len(rec.retries) == 1
    assert [n for n, _, _ in rec.custom].count("llm_resilience.attempt") == 2


def test_unknown_errors_fail_at_once_as_themselves() -> None:
    inner, seen = flaky([ValueError("bad input")])
    step = resilient(inner, policy=FAST, clock=FakeClock())
    with pytest.raises(ValueError, match="bad input") as ei:
        step.invoke("q")
    assert len(seen) == 1
    report = get_report(ei.value)
    assert report is not None and report.attempts[0].error_class is ErrorClass.UNKNOWN


def test_retry_on_makes_other_exceptions_retryable() -> None:
    class Flaky(Exception):
        pass

    inner, seen = flaky([Flaky(), Flaky()])
    assert resilient(inner, retry_on=Flaky, policy=FAST, clock=FakeClock()).invoke("q") == "ok"
    assert len(seen) == 3
    inner2, seen2 = flaky([Flaky(), Flaky(), Flaky()])
    step = resilient(inner2, retry_on=lambda e: isinstance(e, Flaky), max_retries=1, policy=FAST,
                     clock=FakeClock())  # fmt: skip
    with pytest.raises(AllRoutesFailedError) as ei:
        step.invoke("q")
    assert len(seen2) == 2 and len(ei.value.attempts) == 2


def test_exhausted_retries_raise_one_error_with_every_attempt() -> None:
    first = ConnectionError("connection reset (first)")
    inner, seen = flaky([first, TimeoutError("t"), ConnectionError("c"), ConnectionError("c")] * 3)
    step = resilient(inner, policy=FAST, clock=FakeClock(), name="db")
    with pytest.raises(AllRoutesFailedError) as ei:
        step.invoke("q")
    err = ei.value
    assert err.__cause__ is first
    assert [a.error_class for a in err.attempts] == [
        ErrorClass.CONNECTION,
        ErrorClass.TIMEOUT,
        ErrorClass.CONNECTION,
        ErrorClass.CONNECTION,
    ]
    assert len(seen) == 4  # connection: 2 retries, timeout: 1 (the policy's defaults)
    assert "db" in str(err) and get_report(err) is err.report


def test_a_later_non_retryable_error_wins() -> None:
    inner, _ = flaky([ConnectionError("connection reset"), KeyError("missing")])
    with pytest.raises(KeyError):
        resilient(inner, policy=FAST, clock=FakeClock()).invoke("q")


def test_input_dict_is_never_mutated_and_each_attempt_gets_a_fresh_copy() -> None:
    seen: list[dict[str, Any]] = []

    def fn(d: dict[str, Any]) -> str:
        seen.append(copy.deepcopy(d))
        d["touched"] = True
        d["nested"]["n"] += 1
        if len(seen) == 1:
            raise ConnectionError("connection reset")
        return "ok"

    payload = {"q": "x", "nested": {"n": 0}}
    assert resilient(RunnableLambda(fn), policy=FAST, clock=FakeClock()).invoke(payload) == "ok"
    assert payload == {"q": "x", "nested": {"n": 0}}
    assert seen == [{"q": "x", "nested": {"n": 0}}] * 2


def test_child_runs_keep_their_parent() -> None:
    inner, _ = flaky([ConnectionError("connection reset")])
    step = resilient(inner.with_config(run_name="inner"), policy=FAST, clock=FakeClock(), name="s")
    chain = RunnableLambda(lambda x: x).with_config(run_name="pre") | step
    tracer = Collect()
    chain.invoke("q", config={"callbacks": [tracer]})
    runs = {r.id: r for r in tracer.all_runs()}
    wrapper = next(r for r in runs.values() if r.name == "Resilient[s]")
    seq = runs[wrapper.parent_run_id]  # type: ignore[index]
    assert seq.name == "RunnableSequence"
    inners = [r for r in runs.values() if r.name == "inner"]
    assert len(inners) == 2 and all(r.parent_run_id == wrapper.id for r in inners)
    assert inners[0].error and not inners[1].error


# -- batch ---------------------------------------------------------------------------------------


def _by_input() -> RunnableLambda[str, str]:
    calls: dict[str, int] = {}

    def fn(x: str) -> str:
        calls[x] = calls.get(x, 0) + 1
        if x == "always-bad":
            raise ValueError("no")
        if x == "flaky" and calls[x] == 1:
            raise ConnectionError("connection reset")
        return x.upper()

    return RunnableLambda(fn)


def test_batch_with_return_exceptions_keeps_outputs_aligned() -> None:
    step = resilient(_by_input(), policy=FAST, clock=FakeClock())
    out = step.batch(["a", "always-bad", "flaky", "b"], return_exceptions=True)
    assert out[0] == "A" and isinstance(out[1], ValueError) and out[2] == "FLAKY" and out[3] == "B"


async def test_abatch_with_return_exceptions_keeps_outputs_aligned() -> None:
    step = resilient(_by_input(), policy=FAST, clock=FakeClock())
    out = await step.abatch(["always-bad", "flaky", "c"], return_exceptions=True)
    assert isinstance(out[0], ValueError) and out[1] == "FLAKY" and out[2] == "C"


# -- breaker and deadline ------------------------------------------------------------------------


def test_breaker_opens_fails_fast_and_probes_after_reset_timeout() -> None:
    clock = FakeClock()
    always = RunnableLambda(lambda x: (_ for _ in ()).throw(ConnectionError("connection refused")))
    calls: list[str] = []
    inner = RunnableLambda(lambda x: calls.append(x)) | always
    step = resilient(inner, policy={**FAST, "breaker": {"fail_max": 3, "reset_timeout": 10}}, clock=clock,
                     name="flaky-api")  # fmt: skip
    rec = Recorder()
    with pytest.raises(AllRoutesFailedError):
        step.invoke("q", config={"callbacks": [rec]})
    assert len(calls) == 3 and step.breaker.state == "open"
    br = [d for n, d, _ in rec.custom if n == "llm_resilience.breaker"]
    assert br and br[0]["new_state"] == "open" and br[0]["deployment_id"] == "flaky-api"
    with pytest.raises(CircuitOpenError):
        step.invoke("q")
    assert len(calls) == 3  # refused without calling the step
    clock.advance(11)
    with pytest.raises(AllRoutesFailedError):
        step.invoke("q")  # one half-open probe, which fails and reopens
    assert len(calls) == 4 and step.breaker.state == "open"


async def test_async_attempt_timeout_and_deadline() -> None:
    async def slow(x: str) -> str:
        await asyncio.sleep(2)
        return x

    step = resilient(RunnableLambda(slow), policy=FAST, attempt_timeout=0.1, deadline=0.35, max_retries=10)
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceededError) as ei:
        await step.ainvoke("q")
    assert time.monotonic() - t0 < 1.0
    assert all(a.error_class is ErrorClass.TIMEOUT for a in ei.value.attempts)


def test_sync_attempt_timeout_on_a_helper_thread() -> None:
    def slow(x: str) -> str:
        time.sleep(0.4)
        return x

    step = resilient(RunnableLambda(slow), policy=FAST, attempt_timeout=0.05, deadline=0.3, max_retries=10,
                     enforce_sync_timeout=True)  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        step.invoke("q")
    assert time.monotonic() - t0 < 0.45


# -- streams -------------------------------------------------------------------------------------


def _gen_step(plan: list[list[Any]]) -> tuple[RunnableGenerator[Any, Any], list[int]]:
    """Each attempt streams the next list; an exception in it is raised at that point."""
    starts: list[int] = []

    def gen(inputs: Iterator[Any]) -> Iterator[Any]:
        list(inputs)
        starts.append(1)
        for item in plan[len(starts) - 1]:
            if isinstance(item, BaseException):
                raise item
            yield item

    async def agen(inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for _ in inputs:
            pass
        starts.append(1)
        for item in plan[len(starts) - 1]:
            if isinstance(item, BaseException):
                raise item
            yield item

    return RunnableGenerator(gen, agen), starts


def test_stream_retried_before_the_first_chunk() -> None:
    inner, starts = _gen_step([[ConnectionError("connection reset")], ["a", "b", "c"]])
    rec = Recorder()
    out = list(resilient(inner, policy=FAST, clock=FakeClock()).stream("q", config={"callbacks": [rec]}))
    assert out == ["a", "b", "c"] and len(starts) == 2 and len(rec.retries) == 1


def test_stream_failure_after_the_first_chunk_is_not_spliced() -> None:
    inner, starts = _gen_step([["a", "b", ConnectionError("connection reset")], ["x", "y"]])
    got: list[str] = []
    with pytest.raises(StreamInterruptedError) as ei:
        for c in resilient(inner, policy=FAST, clock=FakeClock()).stream("q"):
            got.append(c)
    assert got == ["a", "b"] and len(starts) == 1
    assert ei.value.partial_text == "ab" and isinstance(ei.value.cause, ConnectionError)
    assert ei.value.report is not None and ei.value.report.outcome == "failure"


def test_sync_stream_chunk_wait_is_bounded_with_enforce_sync_timeout() -> None:
    """A sync stream that stalls after its first chunk ends at the attempt timeout (as astream
    does), when sync waits may run on a helper thread."""
    release = threading.Event()

    def gen(inputs: Iterator[Any]) -> Iterator[Any]:
        list(inputs)
        yield "a"
        release.wait(5)  # a stall
        yield "late"

    step = resilient(RunnableGenerator(gen), policy=FAST, clock=FakeClock(), attempt_timeout=0.2,
                     deadline=5, enforce_sync_timeout=True)  # fmt: skip
    got: list[str] = []
    t0 = time.monotonic()
    try:
        with pytest.raises(StreamInterruptedError) as ei:
            for c in step.stream("q"):
                got.append(c)
    finally:
        release.set()
    assert time.monotonic() - t0 < 2.0 and got == ["a"]
    assert ei.value.report is not None and ei.value.report.error_class is ErrorClass.TIMEOUT


async def test_astream_retried_before_and_not_after_the_first_chunk() -> None:
    inner, starts = _gen_step([[TimeoutError("t")], ["a", ConnectionError("connection reset")]])
    step = resilient(inner, policy=FAST, clock=FakeClock())
    got: list[str] = []
    with pytest.raises(StreamInterruptedError):
        async for c in step.astream("q"):
            got.append(c)
    assert got == ["a"] and len(starts) == 2


async def test_astream_events_show_the_wrapper_and_its_attempts() -> None:
    inner, _ = _gen_step([[ConnectionError("connection reset")], ["a", "b"]])
    step = resilient(inner, policy=FAST, clock=FakeClock(), name="gen")
    events = [e async for e in step.astream_events("q", version="v2")]
    wrapper = next(e for e in events if e["event"] == "on_chain_start" and e["name"] == "Resilient[gen]")
    custom = [e for e in events if e["event"] == "on_custom_event"]
    assert [e["name"] for e in custom] == [
        "llm_resilience.attempt", "llm_resilience.retry", "llm_resilience.attempt",
    ]  # fmt: skip
    assert all(e["run_id"] == wrapper["run_id"] for e in custom)
    streamed = [
        e["data"]["chunk"]
        for e in events
        if e["event"] == "on_chain_stream" and e["name"] == "Resilient[gen]"
    ]
    assert streamed == ["a", "b"]


# -- other runnables -----------------------------------------------------------------------------


class FlakyRetriever(BaseRetriever):
    failures: int = 1
    calls: int = 0

    def _get_relevant_documents(self, query: str, *, run_manager: Any) -> list[Document]:
        self.calls += 1
        if self.calls <= self.failures:
            raise httpx.ConnectError("connection refused")
        return [Document(page_content=f"about {query}")]


def test_a_retriever_keeps_answering() -> None:
    retriever = FlakyRetriever()
    safe = resilient(retriever, policy=FAST, clock=FakeClock())
    assert isinstance(safe, ResilientRunnable)
    docs = safe.invoke("cats")
    assert docs[0].page_content == "about cats" and retriever.calls == 2


def test_another_providers_chat_model_429_then_ok(sim: ProviderSimulator) -> None:
    from langchain_litellm import ChatLiteLLM

    other = ChatLiteLLM(model="openai/other-model", api_base=sim.api_base("other"), api_key="sk-sim",
                        max_retries=0, model_kwargs={"max_retries": 0})  # fmt: skip
    sim.script("other", Fault.rate_limit(), Fault.server_error(503))
    rec = Recorder()
    msg = resilient(other, policy=FAST, clock=FakeClock()).invoke("hi", config={"callbacks": [rec]})
    assert str(msg.content).startswith("Hello from other")
    assert sim.count("other") == 3 and len(rec.retries) == 2


def test_callables_are_wrapped_and_bad_arguments_rejected() -> None:
    assert resilient(lambda x: x * 2, clock=FakeClock()).invoke(21) == 42
    with pytest.raises(TypeError):
        resilient(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        resilient(lambda x: x, deadline=0)
