"""The Redis backends in one process, against a real redis-server: the breaker Lua state machine
agrees with the reference model of test_breakers, probe leases, fleet views of two "processes"
(two independent RedisSharedState instances: separate connections, caches and sync threads),
the shared retry bucket, and the Redis ledger's contract (the same as the memory ledger's)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import rule

pytest.importorskip("redis")

from llm_resilience_plugin._engine.breakers import Admission, DeploymentBreaker
from llm_resilience_plugin._engine.retry import RetryBudget
from llm_resilience_plugin.cost import RedisLedger
from llm_resilience_plugin.cost._ledger import BudgetKey, Ledger, MemoryLedger, SpendEntry
from llm_resilience_plugin.errors import BudgetExceededError
from llm_resilience_plugin.events import BreakerTransition
from llm_resilience_plugin.policy import BreakerPolicy, RetryBudgetPolicy
from llm_resilience_plugin.shared_state import RedisSharedState
from tests.redis.redis_server import RedisServer, redis_server_fixture  # noqa: F401
from tests.unit.test_breakers import BreakerModel

FAST = {"sync_interval": 0.05, "retry_interval": 0.2}


@pytest.fixture
def shared_pair(redis_server: RedisServer) -> Iterator[tuple[RedisSharedState, RedisSharedState]]:
    """Two independent views of one Redis, as two worker processes would have."""
    ns = f"t-{uuid.uuid4().hex[:8]}"
    a = RedisSharedState(redis_server.url, {**FAST, "namespace": ns})
    b = RedisSharedState(redis_server.url, {**FAST, "namespace": ns})
    yield a, b
    a.close()
    b.close()


def gate(
    shared: RedisSharedState, policy: BreakerPolicy, clock: Any = time.time, *, lease: float = 30.0
) -> tuple[DeploymentBreaker, list[BreakerTransition]]:
    events: list[BreakerTransition] = []
    backend = shared.breaker_backend("r", "d1", policy, lease=lease)
    shared.prime([backend])
    return DeploymentBreaker(
        "d1", "g", policy, clock=clock, on_transition=events.append, backend=backend
    ), events


def wait_for(pred: Any, timeout: float = 2.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


# -- the breaker state machine, on Redis ----------------------------------------------------------

_MODEL_URL: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def _model_url(redis_server: RedisServer) -> Iterator[None]:
    _MODEL_URL.append(redis_server.url)
    yield
    _MODEL_URL.clear()


class RedisBreakerModel(BreakerModel):
    """test_breakers' reference model, unchanged, driving the Lua scripts instead of pybreaker.

    Time moves in 2 ms steps and reset_timeout is an odd number of ms, so the model's float
    comparisons and Redis's integer milliseconds never sit on the same boundary."""

    def __init__(self) -> None:
        super().__init__()
        self.reset = 10.001
        now = self.now
        self.shared = RedisSharedState(
            _MODEL_URL[0], {"namespace": f"m-{uuid.uuid4().hex[:8]}", "sync_interval": 10}, clock=now
        )
        policy = BreakerPolicy(
            fail_max=self.fail_max,
            reset_timeout=self.reset,
            min_reset_timeout=self.reset,  # the model's fixed window (as in test_breakers)
            success_threshold=self.success_needed,
            half_open_max_probes=self.probes_max,
        )
        self.b, self.events = gate(self.shared, policy, now, lease=1e9)

    @rule(steps=st.integers(min_value=0, max_value=7500))
    def tick(self, steps: int) -> None:  # type: ignore[override]
        self.now.t += steps * 0.002

    def teardown(self) -> None:
        self.shared.close()


TestRedisBreakerModel = RedisBreakerModel.TestCase
TestRedisBreakerModel.settings = settings(max_examples=30, stateful_step_count=30, deadline=None)


# -- fleet behaviour, two views ---------------------------------------------------------------


def test_failures_in_one_view_open_the_breaker_in_the_other_and_one_probe_fleet_wide(shared_pair):
    a, b = shared_pair
    pol = BreakerPolicy(fail_max=2, reset_timeout=0.3, half_open_max_probes=1)
    ga, _ = gate(a, pol)
    gb, eb = gate(b, pol)
    for _ in range(2):
        ga.record_failure(Admission("d1", ga.generation, probe=False))
    assert ga.state == "open"
    assert wait_for(lambda: gb.state == "open", 1.0)  # within a sync interval or two
    assert [(e.old_state, e.new_state) for e in eb] == [("closed", "open")]  # observed, emitted once
    assert not gb.could_admit()
    time.sleep(0.35)
    probes = [g.admit() for g in (ga, gb, ga, gb)]
    admitted = [p for p in probes if p is not None]
    assert len(admitted) == 1 and admitted[0].probe and admitted[0].lease
    winner = ga if probes[0] is not None else gb
    winner.record_success(admitted[0])
    assert winner.state == "closed"
    assert wait_for(lambda: ga.state == gb.state == "closed", 1.0)


def test_a_stale_outcome_from_another_process_is_ignored(shared_pair):
    a, b = shared_pair
    pol = BreakerPolicy(fail_max=1, reset_timeout=0.2)
    ga, _ = gate(a, pol)
    gb, _ = gate(b, pol)
    early_b = Admission("d1", gb.generation, probe=False)  # b admitted while closed
    ga.record_failure(Admission("d1", ga.generation, probe=False))  # a trips it
    time.sleep(0.25)
    probe = ga.admit()
    assert probe is not None and probe.probe
    gb.record_success(early_b)  # late success from before the trip: says nothing about now
    gb.record_failure(early_b)
    assert ga.snapshot()["probes_in_flight"] == 1
    ga.record_success(probe)
    assert ga.state == "closed"


def test_a_crashed_probe_holder_frees_its_slot_when_the_lease_expires(shared_pair):
    a, b = shared_pair
    pol = BreakerPolicy(fail_max=1, reset_timeout=0.1, half_open_max_probes=1)
    ga, _ = gate(a, pol, lease=0.3)
    gb, _ = gate(b, pol, lease=0.3)
    ga.record_failure(Admission("d1", ga.generation, probe=False))
    time.sleep(0.15)
    assert ga.admit() is not None  # "process a" takes the probe and dies without reporting
    assert gb.admit() is None
    time.sleep(0.35)
    late = gb.admit()
    assert late is not None and late.probe


def test_keys_follow_pybreaker_circuit_redis_storage_naming(shared_pair, redis_server):
    import pybreaker
    import redis

    a, _ = shared_pair
    pol = BreakerPolicy(fail_max=1, reset_timeout=60)
    ga, _ = gate(a, pol)
    ga.record_failure(Admission("d1", ga.generation, probe=False))
    client = redis.Redis.from_url(redis_server.url)
    ns = f"{a.namespace}:r:d1"
    storage = pybreaker.CircuitRedisStorage(pybreaker.STATE_CLOSED, client, namespace=ns)
    assert storage.state == "open"
    assert storage.counter == 1
    assert storage.opened_at is not None and abs(storage.opened_at.timestamp() - time.time()) < 5
    client.close()


def test_retry_budget_is_one_bucket_for_the_fleet(shared_pair):
    a, b = shared_pair
    pol = RetryBudgetPolicy(capacity=10, refund_per_success=0.5, min_fraction=0.5)
    ra = RetryBudget(pol, shared=a.token_bucket("r", "g", 10))
    rb = RetryBudget(pol, shared=b.token_bucket("r", "g", 10))
    a.prime([ra.shared]), b.prime([rb.shared])
    for _ in range(4):
        ra.on_failure()
    assert ra.tokens == 6  # its own spends count at once
    assert wait_for(lambda: rb.tokens == 6, 1.0)
    rb.on_failure()
    rb.on_failure()
    assert not rb.allows_retry()  # 4 < 5
    assert wait_for(lambda: not ra.allows_retry(), 1.0)
    for _ in range(4):
        ra.on_success()
    assert wait_for(lambda: rb.tokens == 6 and ra.tokens == 6, 1.0)


def test_concurrent_probe_admission_from_many_threads_and_two_views(shared_pair):
    a, b = shared_pair
    pol = BreakerPolicy(fail_max=1, reset_timeout=0.1, half_open_max_probes=2)
    gates = [gate(a, pol)[0], gate(b, pol)[0]]
    gates[0].record_failure(Admission("d1", gates[0].generation, probe=False))
    wait_for(lambda: gates[1].state == "open", 1.0)
    time.sleep(0.15)
    admitted: list[Admission] = []
    lock = threading.Lock()
    barrier = threading.Barrier(16)

    def worker(i: int) -> None:
        barrier.wait()
        adm = gates[i % 2].admit()
        if adm is not None:
            with lock:
                admitted.append(adm)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(admitted) == 2 and all(x.probe for x in admitted)


# -- the ledger: same contract as the memory ledger ----------------------------------------------


@pytest.fixture(params=["memory", "redis"])
def ledger(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[Ledger]:
    if request.param == "memory":
        yield MemoryLedger()
        return
    shared = RedisSharedState(redis_server.url, {**FAST, "namespace": f"l-{uuid.uuid4().hex[:8]}"})
    yield RedisLedger(shared)
    shared.close()


def key(name: str, limit: float, scope: str = "", window: str = "2026-11-30", exp: float | None = None):
    return BudgetKey(name, scope, window, limit, exp)


def test_ledger_reserve_is_all_or_nothing_and_settle_replaces_the_reservation(ledger: Ledger):
    daily, tenant = key("daily", 1.0), key("tenant", 0.3, "tenant=acme")
    r1 = ledger.reserve([daily, tenant], 0.2, now=100.0, ttl=60)
    with pytest.raises(BudgetExceededError) as info:
        ledger.reserve([daily, tenant], 0.2, now=100.0, ttl=60)
    assert info.value.budget == "tenant[tenant=acme] 2026-11-30"
    assert info.value.limit == 0.3
    assert [u.reserved for u in ledger.usage([daily, tenant])] == [0.2, 0.2]  # nothing half-added
    entry = SpendEntry(ts=100.0, day="2026-11-30", month="2026-11", cost=0.05, model="m", request_id="q1")
    rows = ledger.settle(r1, 0.05, entry)
    assert [(u.spent, u.reserved) for u in rows] == [(0.05, 0.0), (0.05, 0.0)]
    r2 = ledger.reserve([daily, tenant], 0.25, now=101.0, ttl=60)
    ledger.release(r2)
    ledger.release(r2)  # idempotent
    assert [(u.spent, u.reserved) for u in ledger.usage([daily, tenant])] == [(0.05, 0.0), (0.05, 0.0)]
    assert [e.request_id for e in ledger.entries()] == ["q1"]
    assert ledger.entries(since=100.5) == []
    assert ledger.report().total == 0.05
    assert {(u.budget, u.scope) for u in ledger.list_usage()} == {("daily", ""), ("tenant", "tenant=acme")}
    assert [u.budget for u in ledger.list_usage(budget="tenant")] == ["tenant"]
    assert ledger.mark_alert(daily, 0.8) is True
    assert ledger.mark_alert(daily, 0.8) is False
    assert ledger.usage([key("never", 1.0)])[0].spent == 0.0


def test_ledger_reaps_expired_reservations_into_spend_and_a_late_settle_replaces_them(ledger: Ledger):
    daily = key("daily", 1.0)
    held = ledger.reserve([daily], 0.9, now=100.0, ttl=10)
    with pytest.raises(BudgetExceededError):
        ledger.reserve([daily], 0.2, now=105.0, ttl=10)
    with pytest.raises(BudgetExceededError):  # the first one expired: reaped at its estimate, still spent
        ledger.reserve([daily], 0.2, now=111.0, ttl=10)
    assert [(u.spent, u.reserved) for u in ledger.usage([daily])] == [(pytest.approx(0.9), 0.0)]
    ledger.settle(held, 0.1)  # its process settles late: the actual cost replaces the estimate
    fresh = ledger.reserve([daily], 0.2, now=112.0, ttl=10)
    ledger.settle(fresh, 0.2)
    (u,) = ledger.usage([daily])
    assert (u.spent, u.reserved) == (pytest.approx(0.3), 0.0)


def test_ledger_prune_forgets_idle_keys_past_their_expiry(ledger: Ledger):
    req = key("per_request", 1.0, "request=abc", "request", exp=50.0)
    ledger.settle(ledger.reserve([req], 0.1, now=10.0, ttl=5), 0.1)
    ledger.prune(100.0)
    assert ledger.list_usage(budget="per_request") == []


def test_redis_ledger_settle_and_release_replays_are_idempotent(redis_server: RedisServer):
    shared = RedisSharedState(redis_server.url, {**FAST, "namespace": f"i-{uuid.uuid4().hex[:8]}"})
    led = RedisLedger(shared)
    daily = key("daily", 1.0)
    res = led.reserve([daily], 0.5, now=1.0, ttl=60)
    entry = SpendEntry(ts=1.0, day="2026-11-30", month="2026-11", cost=0.25)
    led.settle(res, 0.25, entry)
    led.settle(res, 0.25, entry)  # a replay after a lost reply
    led.release(res)
    (u,) = led.usage([daily])
    assert (u.spent, u.reserved) == (0.25, 0.0)
    assert len(led.entries()) == 1
    shared.close()


# -- configuration: the one line ------------------------------------------------------------------


def _config(url: str | None, **shared: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "model_list": [
            {
                "model_name": "chat",
                "litellm_params": {"model": "openai/gpt-4o-mini", "api_base": f"http://127.0.0.1:9/{d}/v1"},
                "model_info": {"id": d},
            }
            for d in ("x", "y")
        ],
        "router_settings": {"redis_url": url} if url else {},
    }
    if shared:
        cfg["resilience"] = {"shared_state": shared}
    return cfg


def test_redis_url_in_router_settings_switches_to_shared_state(redis_server: RedisServer):
    from llm_resilience_plugin import ResilientRouter
    from llm_resilience_plugin.shared_state import RedisBreakerBackend, RedisTokenBucket

    ns = f"cfg-{uuid.uuid4().hex[:6]}"
    router = ResilientRouter.from_config(_config(redis_server.url, namespace=ns, router_name="bot"))
    try:
        assert isinstance(router.shared_state, RedisSharedState)
        assert router.shared_state.namespace == ns
        backend = router.breaker("x").backend
        assert isinstance(backend, RedisBreakerBackend)
        assert backend.keys[0] == f"{ns}:bot:x:pybreaker:state"
        assert isinstance(router.retry_budget("chat").shared, RedisTokenBucket)
        assert router.litellm_router is not None  # LiteLLM still gets its own redis_url
    finally:
        router.close()
    for cfg, kwargs in (
        (_config(redis_server.url, enabled=False), {}),
        (_config(redis_server.url), {"shared_state": False}),
        (_config(None), {}),
    ):
        local = ResilientRouter.from_config(cfg, **kwargs)
        assert local.shared_state is None
        assert not isinstance(local.breaker("x").backend, RedisBreakerBackend)
        local.close()
    RedisSharedState.close_all()


def test_outage_local_breaker_then_resync_keeps_one_unbroken_event_chain():
    from tests.redis.redis_server import running_redis

    with running_redis() as server:
        a = RedisSharedState(server.url, {**FAST, "namespace": "outage"})
        b = RedisSharedState(server.url, {**FAST, "namespace": "outage"})
        pol = BreakerPolicy(fail_max=2, reset_timeout=60)
        ga, ea = gate(a, pol)
        gb, _ = gate(b, pol)
        ga.record_failure(Admission("d1", ga.generation, probe=False))
        server.stop()
        assert wait_for(lambda: not a.available, 1.0)
        assert ga.state == "closed" and ga.generation < 0  # local, seeded from the last view
        assert ga.snapshot()["fail_counter"] == 1
        ga.record_failure(Admission("d1", ga.generation, probe=False))
        assert ga.state == "open" and ga.admit() is None  # tripped locally, no crash, no wait
        server.start()
        assert wait_for(lambda: a.available and b.available, 3.0)
        assert ga.state == "open" and ga.generation >= 0  # pushed to the fleet...
        assert wait_for(lambda: gb.state == "open", 1.0)  # ...and seen by the other process
        chain = [(e.old_state, e.new_state) for e in ea]
        assert chain == [("closed", "open")]
        a.close()
        b.close()
