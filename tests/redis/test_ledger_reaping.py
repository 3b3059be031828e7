"""The Redis ledger's reaping on a real redis-server: a reservation whose worker died becomes
spend at its estimate (logged as a reaped entry), a late settle replaces the estimate once, a late
release takes it back, and a worker SIGKILLed with calls in flight loses no spend."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("redis")

import llm_resilience_plugin
from llm_resilience_plugin import BudgetExceededError
from llm_resilience_plugin.cost import Budget, BudgetKey, CostGuard, Price, RedisLedger, SpendEntry
from llm_resilience_plugin.shared_state import RedisSharedState
from tests.redis.redis_server import RedisServer, redis_server_fixture  # noqa: F401

ROOT = str(Path(llm_resilience_plugin.__file__).parent.parent)


@pytest.fixture
def ns() -> str:
    return f"reap-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def ledger(redis_server: RedisServer, ns: str) -> Iterator[RedisLedger]:
    yield RedisLedger(RedisSharedState.get(redis_server.url, {"namespace": ns}))
    RedisSharedState.close_all()


def usage(led: RedisLedger, k: BudgetKey) -> tuple[float, float]:
    (u,) = led.usage([k])
    return u.spent, u.reserved


K = BudgetKey("d", "", "2026-01-01", 1.0)
GIVEN = SpendEntry(ts=100.0, day="2026-01-01", month="2026-01", cost=0.0, model="m", request_id="r1")


def test_an_expired_reservation_becomes_spend_and_a_late_settle_replaces_it(ledger: RedisLedger):
    stale = ledger.reserve([K], 0.6, now=100, ttl=10, entry=GIVEN)  # its worker "died"
    with pytest.raises(BudgetExceededError):  # reaped at 110 - into spend, not released
        ledger.reserve([K], 0.5, now=111, ttl=10)
    assert usage(ledger, K) == (0.6, 0)
    (reaped,) = ledger.entries()
    assert reaped.reaped and reaped.estimated and reaped.cost == 0.6
    assert (reaped.request_id, reaped.model, reaped.ts) == ("r1", "m", 100.0)
    assert (ledger.report().calls, ledger.report().reaped) == (1, 1)
    fresh = ledger.reserve([K], 0.2, now=112, ttl=10)
    ledger.settle(stale, 0.5, replace(GIVEN, cost=0.5))  # it finished after all
    assert usage(ledger, K) == (0.5, 0.2)
    assert [(e.cost, e.reaped) for e in ledger.entries()] == [(0.5, False)]
    ledger.settle(stale, 0.5, replace(GIVEN, cost=0.5))  # a replay: applied once
    ledger.settle(fresh, 0.1)
    assert usage(ledger, K) == (0.6, 0)


def test_a_reaped_reservation_released_late_costs_nothing(ledger: RedisLedger):
    stale = ledger.reserve([K], 0.6, now=100, ttl=10)  # no entry given: a bare one is logged
    ledger.prune(now=111)
    assert usage(ledger, K) == (0.6, 0)
    (reaped,) = ledger.entries()
    assert (reaped.reaped, reaped.cost, reaped.day) == (True, 0.6, "1970-01-01")
    ledger.release(stale)
    ledger.release(stale)  # idempotent
    assert usage(ledger, K) == (0, 0) and ledger.entries() == []


# A worker with 20 calls in flight (reserved through the guard), killed before it settles any.
KILLED = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from llm_resilience_plugin.cost import Budget, CostGuard, Price, RedisLedger
from llm_resilience_plugin.shared_state import RedisSharedState
url, ns, now = sys.argv[2], sys.argv[3], float(sys.argv[4])
ledger = RedisLedger(RedisSharedState.get(url, {"namespace": ns}))
guard = CostGuard([Budget.daily(1.0)], ledger=ledger, now=lambda: now, reservation_ttl=5)
cands = [("m", "m", Price(1e-6, 2e-6, "override", None, "m"))]
tickets = [guard.reserve(cands, prompt_tokens=1000, max_tokens=1000, request_id=f"call-{i}")
           for i in range(20)]
print(json.dumps({"estimate": sum(t.estimate for t in tickets)}), flush=True)
time.sleep(600)
"""


def test_a_worker_killed_with_20_calls_in_flight_has_their_spend_reaped(redis_server: RedisServer, ns: str):
    t0 = 1_780_000_000.0
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED, ROOT, redis_server.url, ns, str(t0)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = child.stdout.readline()  # type: ignore[union-attr]
        assert line, child.stderr.read()  # type: ignore[union-attr]
        estimate = json.loads(line)["estimate"]
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    assert estimate == pytest.approx(20 * 3000e-6)
    clock = [t0 + 6]  # past the TTL
    ledger = RedisLedger(RedisSharedState.get(redis_server.url, {"namespace": ns}))
    guard = CostGuard([Budget.daily(1.0)], ledger=ledger, now=lambda: clock[0], reservation_ttl=5)
    try:
        cands = [("m", "m", Price(1e-6, 2e-6, "override", None, "m"))]
        guard.settle(guard.reserve(cands, prompt_tokens=0, max_tokens=1), cost=0.01)
        rep = guard.report()
        assert (rep.calls, rep.reaped) == (21, 20)
        reaped = [e for e in guard.ledger.entries() if e.reaped]
        assert sorted(e.request_id or "" for e in reaped) == sorted(f"call-{i}" for i in range(20))
        (daily,) = rep.budgets
        assert daily.reserved == 0 and daily.spent == pytest.approx(rep.total)
        assert rep.total == pytest.approx(estimate + 0.01)
    finally:
        RedisSharedState.close_all()
