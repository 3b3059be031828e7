"""Several worker processes (multiprocessing, forkserver) sharing breakers, retry budgets and a cost
ledger on a real redis-server this module starts; a ProviderSimulator in the parent serves them
all over HTTP and counts what each deployment really received.

The pool of 4 workers is started once for the module (each imports LiteLLM once); every task
waits on a barrier of 4, so the 4 tasks of a round run in 4 distinct processes at the same time.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import random
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

pytest.importorskip("redis")

import redis

from llm_resilience_plugin import BudgetExceededError, ResilientRouter
from llm_resilience_plugin.cost import LedgerUnavailableError, RedisLedger
from llm_resilience_plugin.cost._guard import Budget, CostGuard
from llm_resilience_plugin.events import hidden_params_of
from llm_resilience_plugin.shared_state import RedisSharedState
from llm_resilience_plugin.testing import Clock
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator, estimate_prompt_tokens
from tests._forked import context as forked_context
from tests.redis.redis_server import RedisServer, redis_server_fixture  # noqa: F401

WORKERS = 4
IN, OUT = 1.5e-7, 6e-7  # gpt-4o-mini in LiteLLM's bundled price map
SHARED = {"sync_interval": 0.05, "retry_interval": 0.3}

# -- what runs in the workers ---------------------------------------------------------------------

_BARRIER: Any = None


def _init_worker(barrier: Any) -> None:
    global _BARRIER
    _BARRIER = barrier
    logging.getLogger("llm_resilience").setLevel(logging.ERROR)
    import litellm  # noqa: F401  (import once, before the first task is timed)

    import llm_resilience_plugin  # noqa: F401


def _model_list(port: int, deps: dict[str, list[str]]) -> list[dict[str, Any]]:
    return [
        {
            "model_name": group,
            "litellm_params": {
                "model": "openai/gpt-4o-mini",
                "api_base": f"http://127.0.0.1:{port}/{dep}/v1",
                "api_key": "sk-sim",
            },
            "model_info": {"id": dep},
        }
        for group, ids in deps.items()
        for dep in ids
    ]


def _router(port: int, redis_url: str, ns: str, policy: dict[str, Any] | None = None) -> ResilientRouter:
    return ResilientRouter(
        model_list=_model_list(port, {"primary": ["a", "b"]}),
        policy={
            "deadline": 20,
            "attempt_timeout": 10,
            "backoff": {"initial": 0.01, "maximum": 0.05},
            "breaker": {"fail_max": 3, "reset_timeout": 1.0},
            "shared_state": {"namespace": ns, **SHARED},
            **(policy or {}),
        },
        redis_url=redis_url,  # the one line that makes it shared
        clock=Clock(),
        seed=os.getpid(),
    )


def _sim_counter(model: str, messages: list[dict[str, Any]]) -> int:
    return estimate_prompt_tokens(messages)


def _prompts(n: int, seed: int) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    words = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega budget".split()
    return [
        [
            {
                "role": "user",
                "content": f"{seed}-{i} " + " ".join(rng.choice(words) for _ in range(rng.randint(1, 200))),
            }
        ]
        for i in range(n)
    ]


def budget_worker(port: int, redis_url: str, ns: str, limit: float, seed: int) -> dict[str, Any]:
    """200 concurrent calls against one shared daily budget."""
    router = _router(port, redis_url, ns)
    guard = CostGuard(
        [Budget.daily(limit)],
        ledger=RedisLedger(router.shared_state),
        token_counter=_sim_counter,
        prompt_margin=0.0,
    )
    router.guards.append(guard)
    prompts = _prompts(200, seed)

    async def run() -> list[Any]:
        async def one(p: list[dict[str, str]]) -> Any:
            try:
                await router.acompletion(model="primary", messages=p, max_tokens=4)
                return estimate_prompt_tokens(p) * IN + 4 * OUT
            except BudgetExceededError as e:
                return e

        _BARRIER.wait(timeout=60)
        return await asyncio.gather(*(one(p) for p in prompts))

    results = asyncio.run(run())
    router.close()
    ok = [r for r in results if isinstance(r, float)]
    refused = [r for r in results if isinstance(r, BudgetExceededError)]
    return {
        "pid": os.getpid(),
        "ok": len(ok),
        "refused": len(refused),
        "other": [repr(r) for r in results if not isinstance(r, float | BudgetExceededError)],
        "cost": sum(ok),
    }


def breaker_state_worker(port: int, redis_url: str, ns: str, calls: int) -> dict[str, Any]:
    """What a fresh process sees, and where its calls go."""
    router = _router(port, redis_url, ns)
    _BARRIER.wait(timeout=60)
    state = router.breaker("a").state

    async def run() -> list[str]:
        out = []
        for _ in range(calls):
            resp = await router.acompletion(model="primary", messages=[{"role": "user", "content": "hi"}])
            out.append(hidden_params_of(resp)["model_id"])
        return out

    served = asyncio.run(run())
    router.close()
    return {"pid": os.getpid(), "state": state, "served": served}


def hammer_worker(port: int, redis_url: str, ns: str, calls: int) -> dict[str, Any]:
    """Many concurrent calls at a deployment that is due for its half-open probe."""
    router = _router(port, redis_url, ns)
    before = router.breaker("a").state
    _BARRIER.wait(timeout=60)

    async def run() -> list[Any]:
        async def one() -> Any:
            resp = await router.acompletion(model="primary", messages=[{"role": "user", "content": "hi"}])
            return hidden_params_of(resp)["model_id"]

        return await asyncio.gather(*(one() for _ in range(calls)), return_exceptions=True)

    served = asyncio.run(run())
    after = router.breaker("a").state
    router.close()
    return {"pid": os.getpid(), "before": before, "after": after, "served": [str(s) for s in served]}


# -- fixtures -------------------------------------------------------------------------------------


def _ready() -> int:
    _BARRIER.wait(timeout=120)
    return os.getpid()


@pytest.fixture(scope="module")
def pool() -> Iterator[ProcessPoolExecutor]:
    """4 worker processes, started before the first test is timed: forked from the preloaded
    forkserver (tests/_forked.py: LiteLLM imported once, not once per worker)."""
    ctx = forked_context()
    barrier = ctx.Barrier(WORKERS)
    others = set(multiprocessing.active_children())
    ex = ProcessPoolExecutor(WORKERS, mp_context=ctx, initializer=_init_worker, initargs=(barrier,))
    try:
        pids = [f.result(timeout=180) for f in [ex.submit(_ready) for _ in range(WORKERS)]]
        assert len(set(pids)) == WORKERS
        yield ex
    finally:
        procs = [p for p in multiprocessing.active_children() if p not in others]  # the pool's workers
        ex.shutdown(wait=False, cancel_futures=True)
        for p in procs:  # the workers hold nothing worth a graceful exit
            p.terminate()
        for p in procs:
            p.join(timeout=5)


@pytest.fixture(scope="module")
def fleet_sim() -> Iterator[ProviderSimulator]:
    with ProviderSimulator() as s:
        yield s


@pytest.fixture
def sim(fleet_sim: ProviderSimulator) -> Iterator[ProviderSimulator]:
    fleet_sim.reset()
    yield fleet_sim
    fleet_sim.reset()


@pytest.fixture
def ns() -> str:
    return f"fleet-{uuid.uuid4().hex[:8]}"


@pytest.fixture(autouse=True)
def _close_shared() -> Iterator[None]:
    yield
    RedisSharedState.close_all()


def run_round(pool: ProcessPoolExecutor, fn: Any, *args_per_worker: tuple[Any, ...]) -> list[dict[str, Any]]:
    futures = [pool.submit(fn, *args) for args in args_per_worker]
    results = [f.result(timeout=120) for f in futures]
    assert len({r["pid"] for r in results}) == len(results), "each task ran in its own process"
    return results


def ledger_of(server: RedisServer, ns: str) -> RedisLedger:
    """A fresh view of namespace ``ns``'s ledger (closed with the test's other shared states)."""
    return RedisLedger(RedisSharedState.get(server.url, {"namespace": ns, **SHARED}))


# -- tests ----------------------------------------------------------------------------------------


def test_four_workers_x_200_concurrent_calls_share_one_daily_budget(
    pool: ProcessPoolExecutor, sim: ProviderSimulator, redis_server: RedisServer, ns: str
):
    seeds = range(WORKERS)
    every_cost = [estimate_prompt_tokens(p) * IN + 4 * OUT for s in seeds for p in _prompts(200, s)]
    limit = round(0.4 * sum(every_cost), 6)
    results = run_round(pool, budget_worker, *[(sim.port, redis_server.url, ns, limit, s) for s in seeds])
    assert all(not r["other"] for r in results), [r["other"][:3] for r in results]
    ok = sum(r["ok"] for r in results)
    refused = sum(r["refused"] for r in results)
    assert ok + refused == WORKERS * 200
    assert 0.2 * 800 < ok < 0.6 * 800  # the budget binds, fleet-wide
    assert all(r["ok"] > 0 for r in results)  # no worker was starved
    assert sim.count() == ok  # refused calls sent nothing

    led = ledger_of(redis_server, ns)
    (usage,) = led.list_usage(budget="daily")
    entries = led.entries()
    assert usage.spent <= limit  # never overspent
    assert usage.reserved == 0  # nothing left held
    assert len(entries) == ok  # every settled call logged once: nothing lost, nothing doubled
    assert usage.spent == pytest.approx(sum(e.cost for e in entries), abs=1e-9)
    assert usage.spent == pytest.approx(sum(r["cost"] for r in results), abs=1e-9 * ok)


def test_failures_in_one_process_open_the_breaker_in_all_and_one_probe_fleet_wide(
    pool: ProcessPoolExecutor, sim: ProviderSimulator, redis_server: RedisServer, ns: str
):
    # This process sees deployment "a" fail and trips its breaker (fail_max=3).
    sim.set_default("a", Fault.server_error(500))
    router = _router(sim.port, redis_server.url, ns, {"retry_budget": {"capacity": 1000}})
    for _ in range(20):
        asyncio.run(router.acompletion(model="primary", messages=[{"role": "user", "content": "x"}]))
        if router.breaker("a").state == "open":
            break
    assert router.breaker("a").state == "open"
    sent_to_a = sim.count("a")
    assert sent_to_a == 3

    # Four other processes see it open at once and send nothing to "a".
    seen = run_round(pool, breaker_state_worker, *[(sim.port, redis_server.url, ns, 5)] * WORKERS)
    assert [r["state"] for r in seen] == ["open"] * WORKERS
    assert all(set(r["served"]) == {"b"} for r in seen)
    assert sim.count("a") == sent_to_a

    # "a" recovers but answers slowly; after reset_timeout every process hammers the group at once:
    # exactly one request (the probe) reaches "a" fleet-wide while it is half-open.
    sim.set_default("a", Fault.ok(latency=2.0))
    retry_at = router.breaker("a").retry_at()
    assert retry_at is not None
    time.sleep(max(0.0, retry_at - time.time()) + 0.05)
    sim.clear_log()
    t0 = time.monotonic()
    results = run_round(pool, hammer_worker, *[(sim.port, redis_server.url, ns, 25)] * WORKERS)
    probes = sim.requests("a")
    assert len(probes) == 1, f"{len(probes)} requests reached the half-open deployment"
    served = [s for r in results for s in r["served"]]
    assert served.count("a") == 1 and served.count("b") == WORKERS * 25 - 1
    assert time.monotonic() - t0 >= 2.0  # the probe's worker waited for it: it was in flight all along
    # The probe's success closed the breaker for everyone.
    assert any(r["after"] == "closed" for r in results)
    view = RedisSharedState(redis_server.url, {"namespace": ns, **SHARED})
    probe_router = _router(sim.port, redis_server.url, ns)
    assert probe_router.breaker("a").state == "closed"
    probe_router.close()
    view.close()
    router.close()


async def test_redis_stopped_mid_run_then_restarted(
    pool: ProcessPoolExecutor, sim: ProviderSimulator, redis_server: RedisServer, ns: str
):
    """Breakers fall back to memory; a fail-closed budget refuses with a clear error; a 'local'
    budget keeps serving; everything settled while Redis was away reaches it exactly once."""
    closed_ns, local_ns = f"{ns}-closed", f"{ns}-local"
    plain = _router(sim.port, redis_server.url, ns)
    metered = _router(sim.port, redis_server.url, closed_ns)
    local = _router(
        sim.port,
        redis_server.url,
        local_ns,
        {"shared_state": {"namespace": local_ns, "ledger_on_error": "local", **SHARED}},
    )
    for r in (metered, local):
        r.guards.append(
            CostGuard([Budget.daily(10.0)], ledger=RedisLedger(r.shared_state), token_counter=_sim_counter)
        )
    msg = [{"role": "user", "content": "hello there"}]
    sim.set_default("a", Fault.ok(latency=0.4))
    sim.set_default("b", Fault.ok(latency=0.4))

    # Calls in flight (already reserved) when Redis stops: they settle into the journal.
    inflight = [
        asyncio.ensure_future(r.acompletion(model="primary", messages=msg))
        for r in (metered, local)
        for _ in range(5)
    ]
    await asyncio.sleep(0.2)
    redis_server.stop()
    done = await asyncio.gather(*inflight)
    assert len(done) == 10

    # Fail closed: refused at once, before anything is sent, with a clear error.
    sent = sim.count()
    t0 = time.monotonic()
    with pytest.raises(LedgerUnavailableError, match="cost ledger on Redis unavailable"):
        await metered.acompletion(model="primary", messages=msg)
    assert time.monotonic() - t0 < 0.5
    assert sim.count() == sent
    # Opt-in local ledger: keeps serving (and will reconcile).
    sim.set_default("a", Fault.ok())
    sim.set_default("b", Fault.ok())
    await asyncio.gather(*(local.acompletion(model="primary", messages=msg) for _ in range(6)))

    # Breakers run on local memory: "a" failing trips it in this process, no call fails or stalls.
    sim.set_default("a", Fault.server_error(500))
    t0 = time.monotonic()
    for _ in range(15):
        resp = await plain.acompletion(model="primary", messages=msg)
        assert hidden_params_of(resp)["model_id"] == "b" or resp is not None
        if plain.breaker("a").state == "open":
            break
    assert plain.breaker("a").state == "open"
    assert plain.breaker("a").generation < 0  # local state
    assert time.monotonic() - t0 < 5

    # Redis comes back: journals replay, the local trip is pushed fleet-wide.
    redis_server.start()
    for _ in range(100):
        if all(r.shared_state.available for r in (plain, metered, local)):
            break
        await asyncio.sleep(0.05)
    assert plain.shared_state.available and local.shared_state.available and metered.shared_state.available
    assert plain.breaker("a").state == "open" and plain.breaker("a").generation >= 0

    seen = run_round(pool, breaker_state_worker, *[(sim.port, redis_server.url, ns, 1)] * WORKERS)
    assert [r["state"] for r in seen] == ["open"] * WORKERS

    # The fail-closed budget serves again once its journal is replayed.
    sim.set_default("a", Fault.ok())
    for _ in range(100):
        if metered.guards[0].ledger.journal_size == 0:
            break
        await asyncio.sleep(0.05)
    await metered.acompletion(model="primary", messages=msg)

    for name, router, expected_calls in ((closed_ns, metered, 6), (local_ns, local, 11)):
        led = router.guards[0].ledger
        assert led.journal_size == 0
        (usage,) = ledger_of(redis_server, name).list_usage(budget="daily")
        entries = ledger_of(redis_server, name).entries()
        assert len(entries) == expected_calls, name
        assert usage.reserved == 0, name
        assert usage.spent == pytest.approx(sum(e.cost for e in entries), abs=1e-9), name
    for r in (plain, metered, local):
        r.close()


def test_redis_client_uses_short_timeouts_and_no_retries(redis_server: RedisServer):
    shared = RedisSharedState(redis_server.url, {"socket_timeout": 0.05, "connect_timeout": 0.05})
    kwargs = shared.client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 0.05 and kwargs["socket_connect_timeout"] == 0.05
    # A hung Redis (SIGSTOP) costs one socket timeout, then local state for retry_interval.
    assert redis_server.proc is not None
    redis_server.proc.send_signal(19)  # SIGSTOP
    try:
        t0 = time.monotonic()
        with pytest.raises(Exception):  # noqa: B017
            shared.run("view", ["k1", "k2", "k3", "k4", "k5", "k6", "k7"], [0])
        assert time.monotonic() - t0 < 0.5
        assert not shared.available
        t0 = time.monotonic()
        with pytest.raises(Exception):  # noqa: B017
            shared.run("view", ["k1", "k2", "k3", "k4", "k5", "k6", "k7"], [0])
        assert time.monotonic() - t0 < 0.01  # no network while waiting out retry_interval
    finally:
        redis_server.proc.send_signal(18)  # SIGCONT
        shared.close()
    assert isinstance(redis.Redis.from_url(redis_server.url).ping(), bool)
