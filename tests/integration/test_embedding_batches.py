"""Split embedding calls send their batches concurrently (bounded), over real HTTP to the
simulator: vectors in input order, a fault in one batch retried whole, a lost batch failing the
call and stopping the rest, usage and cost per batch, the bound (policy, per call,
``max_parallel_requests``), blocking calls from many threads, and a cancelled caller."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from llm_resilience_plugin import ConfigError, ResilientRouter, get_report
from llm_resilience_plugin.cost import Budget, CostGuard
from llm_resilience_plugin.events import hidden_params_of
from llm_resilience_plugin.routing._batches import batch_concurrency
from llm_resilience_plugin.testing import FakeClock, Fault, ProviderSimulator, RequestRecord, embedding_vector

from ..conftest import FAST_POLICY, _merge

MODEL = "openai/text-embedding-3-small"
TEXTS = [f"chunk {i}" for i in range(8)]  # four batches of two


@pytest.fixture
def build(sim: ProviderSimulator) -> Iterator[Callable[..., ResilientRouter]]:
    made: list[ResilientRouter] = []

    def make(
        deps: tuple[str, ...] = ("a",),
        *,
        policy: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> ResilientRouter:
        model_list = [
            {
                "model_name": "g",
                "litellm_params": {
                    "model": MODEL,
                    "api_base": sim.api_base(d),
                    "api_key": "sk-sim",
                    **(params or {}),
                },
                "model_info": {"id": d, "mode": "embedding", "max_embedding_batch_size": 2},
            }
            for d in deps
        ]
        router = ResilientRouter(
            model_list, policy=_merge(FAST_POLICY, policy or {}), clock=FakeClock(), **kwargs
        )
        made.append(router)
        return router

    yield make
    for r in made:
        r.close()


def most_in_flight(records: list[RequestRecord]) -> int:
    """The largest number of requests the simulator was serving at one moment."""
    edges = sorted(
        [(r.started_at, 1) for r in records] + [(r.finished_at or r.started_at, -1) for r in records],
        key=lambda e: (e[0], e[1]),  # an end before a start at the same instant
    )
    now = top = 0
    for _, step in edges:
        now += step
        top = max(top, now)
    return top


async def test_batches_are_in_flight_together_and_joined_in_input_order(build, sim):
    router = build()
    sim.set_default("a", Fault.ok(latency=0.15))
    began = time.monotonic()
    resp = await router.aembedding(model="g", input=TEXTS)
    elapsed = time.monotonic() - began
    assert [d["index"] for d in resp.data] == list(range(8))
    assert [d["embedding"] for d in resp.data] == [embedding_vector("a", t, 16) for t in TEXTS]
    records = sim.requests("a")
    assert sorted(r.body["input"] for r in records) == [TEXTS[i : i + 2] for i in range(0, 8, 2)]
    assert most_in_flight(records) == 4  # the default bound: all four batches at once
    assert elapsed < 4 * 0.15  # one after another would take at least 0.6 s
    rep = get_report(resp)
    assert rep is not None and rep.upstream_requests == 4 and rep.outcome == "success"
    assert (
        rep.usage["prompt_tokens"]
        == resp.usage.prompt_tokens
        == sum(len(r.body["input"]) * 2 for r in records)
    )  # "chunk N" is two tokens
    assert rep.total_latency_s < 4 * 0.15  # the call's span, not the batches' sum


async def test_the_bound_comes_from_the_policy_the_call_and_max_parallel_requests(build, sim):
    sim.set_default("a", Fault.ok(latency=0.1))
    await build(policy={"embedding_batch_concurrency": 2}).aembedding(model="g", input=TEXTS)
    assert most_in_flight(sim.requests("a")) == 2
    sim.clear_log()
    await build().aembedding(model="g", input=TEXTS, batch_concurrency=1)
    assert most_in_flight(sim.requests("a")) == 1
    sim.clear_log()
    await build(params={"max_parallel_requests": 3}).aembedding(model="g", input=TEXTS)
    assert most_in_flight(sim.requests("a")) == 3
    with pytest.raises(ConfigError) as ei:
        await build().aembedding(model="g", input=TEXTS, batch_concurrency=0)
    assert "batch_concurrency" in str(ei.value)


def test_the_bound_is_the_smallest_limit_among_the_deployments():
    assert batch_concurrency(4, [{}, {}]) == 4
    assert batch_concurrency(4, [{"max_parallel_requests": 8}, {"max_parallel_requests": 2}]) == 2
    assert batch_concurrency(4, [{}, {"max_parallel_requests": 3}], default_max_parallel=1) == 1
    assert batch_concurrency(4, [{"max_parallel_requests": 0}]) == 4  # not a limit LiteLLM applies


async def test_a_fault_in_one_batch_retries_that_batch_whole(build, sim):
    router = build()
    sim.set_default("a", Fault.ok(latency=0.02))
    sim.script("a", Fault.ok(latency=0.02), Fault.server_error(500))  # whichever batch comes second
    resp = await router.aembedding(model="g", input=TEXTS)
    bodies = [r.body["input"] for r in sim.requests("a")]
    assert len(bodies) == 5  # four batches, one of them twice
    (again,) = [b for b in bodies if bodies.count(b) == 2][:1]
    assert again in [TEXTS[i : i + 2] for i in range(0, 8, 2)]  # the whole batch, not a part
    assert [d["embedding"] for d in resp.data] == [embedding_vector("a", t, 16) for t in TEXTS]
    rep = get_report(resp)
    assert rep is not None and rep.upstream_requests == 5
    assert len([a for a in rep.attempts if a.error_class is not None]) == 1


async def test_a_lost_batch_fails_the_call_and_starts_no_further_batch(build, sim):
    router = build(policy={"embedding_batch_concurrency": 2})
    texts = [f"chunk {i}" for i in range(20)]  # ten batches
    sim.script("a", Fault.ok())
    sim.set_default("a", Fault.server_error(500))
    with pytest.raises(Exception) as ei:
        await router.aembedding(model="g", input=texts)
    assert not isinstance(ei.value, ConfigError)
    assert get_report(ei.value) is not None  # the failing batch's report
    sent = {tuple(r.body["input"]) for r in sim.requests("a")}
    assert len(sent) < 10  # the batches after the failure were never sent
    await asyncio.sleep(0.05)
    assert {tuple(r.body["input"]) for r in sim.requests("a")} == sent  # nothing left running


async def test_each_batch_reserves_and_settles_once(build, sim):
    guard = CostGuard([Budget.daily(10)])
    router = build(guards=[guard])
    resp = await router.aembedding(model="g", input=TEXTS)
    entries = guard.ledger.entries()
    assert len(entries) == 4 and not any(e.estimated for e in entries)
    assert sum(e.cost for e in entries) == pytest.approx(hidden_params_of(resp)["response_cost"])
    assert get_report(resp).response_cost == pytest.approx(sum(e.cost for e in entries))  # type: ignore[union-attr]


def test_blocking_calls_from_many_threads(build, sim):
    router = build()
    sim.set_default("a", Fault.ok(latency=0.02))
    jobs = [[f"thread {t} chunk {i}" for i in range(6)] for t in range(6)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda texts: router.embedding("g", texts), jobs))
    for texts, resp in zip(jobs, results, strict=True):
        assert [d["embedding"] for d in resp.data] == [embedding_vector("a", t, 16) for t in texts]
        assert get_report(resp).upstream_requests == 3  # type: ignore[union-attr]
    assert sim.count("a") == 18


async def test_a_cancelled_caller_cancels_its_batches(build, sim):
    router = build(policy={"embedding_batch_concurrency": 2})
    sim.set_default("a", Fault.ok(latency=0.3))
    task = asyncio.ensure_future(router.aembedding(model="g", input=TEXTS))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.4)
    assert sim.count("a") == 2  # the two in flight; the other batches never started


@pytest.mark.parametrize("options", [{}, {"deadline": 1.0}, {"deadline_cap": 1.0}])
def test_all_batches_share_one_deadline(sim: ProviderSimulator, options: dict[str, Any]) -> None:
    """The policy's deadline, a per-call one or a cap: one budget for the whole split call, not
    a fresh one per batch (four batches of 0.6 s cannot fit in 1 s)."""
    from llm_resilience_plugin import DeadlineExceededError
    from llm_resilience_plugin.testing import Clock

    model_list = [
        {
            "model_name": "g",
            "litellm_params": {"model": MODEL, "api_base": sim.api_base("a"), "api_key": "sk-sim"},
            "model_info": {"id": "a", "mode": "embedding", "max_embedding_batch_size": 2},
        }
    ]
    policy = {
        "deadline": 1.0 if not options else 30,
        "attempt_timeout": 0.9,
        "embedding_batch_concurrency": 1,
    }
    router = ResilientRouter(model_list, policy=policy, clock=Clock())
    sim.set_default("a", Fault.ok(latency=0.6))
    t0 = time.monotonic()
    try:
        with pytest.raises(DeadlineExceededError):
            router.embedding("g", TEXTS, **options)
        assert time.monotonic() - t0 < 1.5
        assert sim.count("a") == 2  # the second batch ran out of the shared time; no third was sent
    finally:
        router.close()


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_callers_idempotency_key_keys_each_batch_apart(
    build: Callable[..., ResilientRouter], sim: ProviderSimulator, concurrency: int
) -> None:
    """One key for a split call: every batch gets its own vectors (not the first batch's, replayed
    from the store or a single-flight leader), and repeating the call replays them all."""
    router = build(idempotency_store="memory")
    first = router.embedding("g", TEXTS, idempotency_key="doc-7", batch_concurrency=concurrency)
    assert [d["embedding"] for d in first.data] == [embedding_vector("a", t, 16) for t in TEXTS]
    assert sim.count("a") == 4
    again = router.embedding("g", TEXTS, idempotency_key="doc-7", batch_concurrency=concurrency)
    assert [d["embedding"] for d in again.data] == [embedding_vector("a", t, 16) for t in TEXTS]
    assert sim.count("a") == 4  # replayed, batch by batch
