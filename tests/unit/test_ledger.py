"""Ledgers: atomic reserve over N keys, settle/release, expiry, restarts (a second Python process
reading the same SQLite file), two processes writing at once, calendar windows with a fake
clock, alerts once per window."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import llm_resilience_plugin
from llm_resilience_plugin import BudgetExceededError, ConfigError
from llm_resilience_plugin.cost._guard import Budget, BudgetAlert, CostGuard, Price
from llm_resilience_plugin.cost._ledger import (
    REAPED_MEMORY,
    BudgetKey,
    Ledger,
    MemoryLedger,
    SpendEntry,
    from_nano,
    to_nano,
)
from llm_resilience_plugin.cost._open import open_ledger
from llm_resilience_plugin.cost._sqlite_ledger import SQLiteLedger

ROOT = str(Path(llm_resilience_plugin.__file__).parent.parent)
PRICE = Price(1e-6, 2e-6, "override", None, "m")
CANDS = [("m", "m", PRICE)]


@pytest.fixture(params=["memory", "sqlite"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    led: Ledger = MemoryLedger() if request.param == "memory" else SQLiteLedger(tmp_path / "l.db")
    yield led
    led.close()


def key(
    budget: str, limit: float, window: str = "2026-01-01", scope: str = "", exp: float | None = None
) -> BudgetKey:
    return BudgetKey(budget, scope, window, limit, exp)


def usage(led: Ledger, k: BudgetKey) -> tuple[float, float]:
    (u,) = led.usage([k])
    return u.spent, u.reserved


# -- the ledger contract (memory and SQLite) -----------------------------------------------------


def test_reserve_is_all_or_nothing_over_every_key(ledger: Ledger):
    a, b = key("a", 1.0), key("b", 0.5)
    r = ledger.reserve([a, b], 0.4, now=0, ttl=60)
    assert usage(ledger, a) == (0, 0.4) and usage(ledger, b) == (0, 0.4)
    with pytest.raises(BudgetExceededError) as ei:
        ledger.reserve([a, b], 0.2, now=0, ttl=60)  # fits a (0.6 <= 1), not b (0.6 > 0.5)
    err = ei.value
    assert (err.budget, err.spent, err.reservation, err.limit) == ("b 2026-01-01", 0.4, 0.2, 0.5)
    assert err.in_flight == 0.4 and err.settled == 0
    assert (err.budget_name, err.scope, err.window) == ("b", "", "2026-01-01")
    assert usage(ledger, a) == (0, 0.4)  # nothing was added to a
    ledger.settle(r, 0.25)
    assert usage(ledger, a) == (0.25, 0) and usage(ledger, b) == (0.25, 0)
    r2 = ledger.reserve([a, b], 0.25, now=0, ttl=60)  # exactly to the limit of b
    ledger.release(r2)
    ledger.release(r2)  # idempotent
    assert usage(ledger, b) == (0.25, 0)


def test_money_is_exact_in_nano_dollars(ledger: Ledger):
    k = key("d", 1.0)
    for _ in range(1000):
        r = ledger.reserve([k], 1e-7 * 3, now=0, ttl=60)
        ledger.settle(r, 13 * 1.5e-7)
    assert usage(ledger, k)[0] == 1000 * 1950 / 1e9  # 13 tokens at $0.15/M, a thousand times
    assert to_nano(13 * 1.5e-7) == 1950 and from_nano(1950) == 1.95e-6


def test_expired_reservations_become_spend_at_their_estimate_and_a_late_settle_replaces_it(ledger: Ledger):
    k = key("d", 1.0)
    given = SpendEntry(ts=100.0, day="2026-01-01", month="2026-01", cost=0.0, model="m", request_id="r1")
    stale = ledger.reserve([k], 0.6, now=100, ttl=10, entry=given)  # its process "died"
    with pytest.raises(BudgetExceededError):
        ledger.reserve([k], 0.5, now=105, ttl=10)
    with pytest.raises(BudgetExceededError):  # reaped at 110 - into spend, not released
        ledger.reserve([k], 0.5, now=111, ttl=10)
    assert usage(ledger, k) == (0.6, 0)
    (reaped,) = ledger.entries()
    assert reaped.reaped and reaped.estimated and reaped.cost == 0.6
    assert (reaped.request_id, reaped.model, reaped.day) == ("r1", "m", "2026-01-01")
    rep = ledger.report()
    assert (rep.total, rep.calls, rep.reaped) == (0.6, 1, 1)
    assert "1 reaped at their estimate" in str(rep)
    fresh = ledger.reserve([k], 0.2, now=112, ttl=10)
    # it finished after all: its actual cost replaces the estimate, not on top of it
    ledger.settle(stale, 0.5, replace(given, cost=0.5))
    assert usage(ledger, k) == (0.5, 0.2)
    assert [(e.cost, e.reaped) for e in ledger.entries()] == [(0.5, False)]
    ledger.settle(fresh, 0.1)
    assert usage(ledger, k) == (0.6, 0)
    assert ledger.report().reaped == 0


def test_a_reaped_reservation_released_late_costs_nothing(ledger: Ledger):
    k = key("d", 1.0)
    stale = ledger.reserve([k], 0.6, now=86400 * 3, ttl=10)  # no entry given: a bare one is logged
    ledger.prune(now=86400 * 3 + 11)
    assert usage(ledger, k) == (0.6, 0)
    (reaped,) = ledger.entries()
    assert (reaped.reaped, reaped.cost, reaped.day, reaped.month) == (True, 0.6, "1970-01-04", "1970-01")
    ledger.release(stale)  # the attempt failed with an answer after all: it cost nothing
    assert usage(ledger, k) == (0, 0) and ledger.entries() == []
    ledger.release(stale)  # idempotent
    assert usage(ledger, k) == (0, 0)


def test_reaped_reservations_are_forgotten_after_a_day(ledger: Ledger):
    k = key("d", 10.0)
    stale = ledger.reserve([k], 0.6, now=0, ttl=10)
    ledger.prune(now=20)
    ledger.prune(now=20 + REAPED_MEMORY)
    ledger.settle(stale, 0.5)  # too late to replace the estimate: recorded on top (conservative)
    assert usage(ledger, k) == (1.1, 0)


def test_an_older_sqlite_file_gains_the_new_columns_and_its_reservations_are_reaped(tmp_path: Path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(OLD_SCHEMA)
    kid = key("d", 1.0).id
    conn.execute("INSERT INTO budget_keys (id, budget, scope, win, limit_nano, reserved_nano)"
                 " VALUES (?, 'd', '', '2026-01-01', ?, ?)", (kid, 10**9, 3 * 10**8))  # fmt: skip
    conn.execute("INSERT INTO reservations VALUES ('old', ?, ?, 0, 10)", (json.dumps([kid]), 3 * 10**8))
    conn.commit()
    conn.close()
    led = SQLiteLedger(path)
    led.reserve([key("d", 1.0)], 0.1, now=20, ttl=10)
    assert usage(led, key("d", 1.0)) == (0.3, 0.1)
    (reaped,) = led.entries()
    assert reaped.reaped and reaped.cost == 0.3 and reaped.ts == 0
    led.close()


OLD_SCHEMA = """
CREATE TABLE budget_keys (id TEXT PRIMARY KEY, budget TEXT NOT NULL, scope TEXT NOT NULL,
    win TEXT NOT NULL, limit_nano INTEGER NOT NULL, spent_nano INTEGER NOT NULL DEFAULT 0,
    reserved_nano INTEGER NOT NULL DEFAULT 0, expires_at REAL);
CREATE TABLE reservations (id TEXT PRIMARY KEY, keys TEXT NOT NULL, amount_nano INTEGER NOT NULL,
    created_at REAL NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE spend (seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, day TEXT NOT NULL,
    month TEXT NOT NULL, cost_nano INTEGER NOT NULL, model TEXT, model_group TEXT,
    deployment_id TEXT, scopes TEXT NOT NULL, prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL, request_id TEXT, estimated INTEGER NOT NULL DEFAULT 0);
CREATE TABLE alerts (key_id TEXT NOT NULL, threshold REAL NOT NULL, PRIMARY KEY (key_id, threshold));
"""


def test_idle_expiring_keys_are_pruned(ledger: Ledger):
    per_request = key("per_request", 1.0, window="request", scope="request=x", exp=50)
    daily = key("daily", 1.0)
    r = ledger.reserve([per_request, daily], 0.1, now=0, ttl=10)
    ledger.settle(r, 0.1)
    ledger.prune(now=60)
    assert {u.budget for u in ledger.list_usage()} == {"daily"}


def test_alert_marks_are_test_and_set(ledger: Ledger):
    k = key("d", 1.0)
    assert ledger.mark_alert(k, 0.8) is True
    assert ledger.mark_alert(k, 0.8) is False
    assert ledger.mark_alert(k, 0.9) is True
    assert ledger.mark_alert(key("d", 1.0, window="2026-01-02"), 0.8) is True


def test_entries_and_report_aggregate_spend(ledger: Ledger):
    k = key("d", 10.0)
    for i, (model, dep, tenant) in enumerate([("m1", "a", "acme"), ("m1", "b", "acme"), ("m2", "a", "bob")]):
        r = ledger.reserve([k], 1.0, now=i, ttl=60)
        e = SpendEntry(
            ts=float(i), day=f"2026-01-0{i + 1}", month="2026-01", cost=0.5 + i, model=model,
            deployment_id=dep, scopes={"tenant": tenant}, prompt_tokens=10, completion_tokens=2,
        )  # fmt: skip
        ledger.settle(r, e.cost, e)
    rep = ledger.report()
    assert rep.total == 4.5 and rep.calls == 3 and rep.prompt_tokens == 30
    assert rep.by_model == {"m1": 2.0, "m2": 2.5}
    assert rep.by_deployment == {"a": 3.0, "b": 1.5}
    assert rep.by_scope == {"tenant=acme": 2.0, "tenant=bob": 2.5}
    assert rep.by_day == {"2026-01-01": 0.5, "2026-01-02": 1.5, "2026-01-03": 2.5}
    assert ledger.report(since=1, until=2).total == 1.5


def test_open_ledger_specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    assert isinstance(open_ledger(None), MemoryLedger)
    assert isinstance(open_ledger("memory"), MemoryLedger)
    led = open_ledger(f"sqlite:///{tmp_path / 'x.db'}")
    assert isinstance(led, SQLiteLedger) and led.path == str(tmp_path / "x.db")
    led.close()
    assert isinstance(open_ledger(tmp_path / "y.db"), SQLiteLedger)
    from llm_resilience_plugin.cost import _redis_ledger as redis_state

    monkeypatch.setattr(redis_state, "RedisLedger", lambda url: ("redis", url))
    assert open_ledger("redis://cache:6379/2") == ("redis", "redis://cache:6379/2")
    with pytest.raises(ConfigError, match="unknown ledger"):
        open_ledger("spend")


def test_sqlite_uses_wal(tmp_path: Path):
    led = SQLiteLedger(tmp_path / "w.db")
    # WAL is a property of the database file: any connection to it (here a fresh one) reads it back.
    with contextlib.closing(sqlite3.connect(led.path)) as other:
        mode = other.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    led.close()


# -- persistence across processes ------------------------------------------------------------------

# A plain second interpreter; the guard and the ledger do not import LiteLLM when prompt tokens
# are given, so it starts in a fraction of a second.
CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
assert "litellm" not in sys.modules
from llm_resilience_plugin.cost import Budget, CostGuard, Price
from llm_resilience_plugin.errors import BudgetExceededError
path, now = sys.argv[2], float(sys.argv[3])
guard = CostGuard([Budget.daily(1.0), Budget.monthly(5.0)], ledger="sqlite:///" + path,
                  now=lambda: now, timezone="America/New_York")
cands = [("m", "m", Price(1e-6, 2e-6, "override", None, "m"))]
out = {"budgets": {b.label: [b.spent, b.reserved] for b in guard.report().budgets}}
try:
    t = guard.reserve(cands, prompt_tokens=100_000, max_tokens=100_000)  # $0.30
    out["reserved"] = t.estimate
    guard.settle(t, cost=0.25)
except BudgetExceededError as e:
    out["refused"] = e.budget
out["after"] = {b.label: b.spent for b in guard.report().budgets}
print(json.dumps(out))
"""


def run_child(path: Path, now: float) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, ROOT, str(path), str(now)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def test_spend_survives_a_restart_and_is_shared_with_another_process(tmp_path: Path):
    ny = ZoneInfo("America/New_York")
    now = datetime(2026, 1, 31, 20, 0, tzinfo=ny).timestamp()
    path = tmp_path / "spend.db"
    guard = CostGuard(
        [Budget.daily(1.0), Budget.monthly(5.0)],
        ledger=f"sqlite:///{path}",
        now=lambda: now,
        timezone="America/New_York",
    )
    t = guard.reserve(CANDS, prompt_tokens=100_000, max_tokens=100_000)  # reserves $0.30
    guard.settle(t, cost=0.6)
    guard.close()  # "restart"

    child = run_child(path, now)  # another Python process, same file
    assert child["budgets"] == {"daily 2026-01-31": [0.6, 0.0], "monthly 2026-01": [0.6, 0.0]}
    assert child["reserved"] == pytest.approx(0.3)
    assert child["after"] == {"daily 2026-01-31": 0.85, "monthly 2026-01": 0.85}

    child2 = run_child(path, now)  # 0.85 + 0.30 > 1.0: refused, by the daily budget
    assert child2["refused"] == "daily 2026-01-31"

    reopened = CostGuard(
        [Budget.daily(1.0), Budget.monthly(5.0)],
        ledger=f"sqlite:///{path}",
        now=lambda: now,
        timezone="America/New_York",
    )
    rep = reopened.report()
    assert rep.total == 0.85 and rep.calls == 2
    assert {b.label: b.spent for b in rep.budgets} == {"daily 2026-01-31": 0.85, "monthly 2026-01": 0.85}
    # after midnight in New York (05:00 UTC) a new day and a new month start, in every process
    nxt = run_child(path, datetime(2026, 2, 1, 0, 5, tzinfo=ny).timestamp())
    assert nxt["budgets"] == {"daily 2026-02-01": [0.0, 0.0], "monthly 2026-02": [0.0, 0.0]}
    assert nxt["after"] == {"daily 2026-02-01": 0.25, "monthly 2026-02": 0.25}
    reopened.close()


def _writer(path: str, limit: float, n: int, seed: int, barrier: Any, out: Any) -> None:
    import random

    led = SQLiteLedger(path)
    k = BudgetKey("daily", "", "2026-01-01", limit)
    rng = random.Random(seed)
    settled = refused = 0
    barrier.wait()
    for _ in range(n):
        amount = rng.randint(1, 1000) * 1e-6
        try:
            r = led.reserve([k], amount, now=0, ttl=600)
        except BudgetExceededError:
            refused += 1
            continue
        actual = amount * rng.choice([0.5, 1.0])
        led.settle(r, actual)
        settled += to_nano(actual)
    led.close()
    out.put((settled, refused))


@pytest.mark.skipif(sys.platform == "win32", reason="fork")
def test_two_processes_writing_at_once_lose_nothing_and_never_overspend(tmp_path: Path):
    path = str(tmp_path / "mp.db")
    SQLiteLedger(path).close()  # schema
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    n, limit = 300, 0.1  # ~600 reservations averaging $0.0005: the limit binds halfway
    procs = [ctx.Process(target=_writer, args=(path, limit, n, seed, barrier, out)) for seed in (1, 2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    led = SQLiteLedger(path)
    (u,) = led.usage([BudgetKey("daily", "", "2026-01-01", limit)])
    assert to_nano(u.spent) == sum(s for s, _ in results)  # every settle of both processes
    assert u.reserved == 0
    assert u.spent <= limit
    assert all(r > 0 for _, r in results)  # both met the limit
    led.close()


# -- calendar windows with a fake clock -----------------------------------------------------------


def test_day_and_month_windows_roll_over_at_local_midnight(tmp_path: Path):
    ny = ZoneInfo("America/New_York")
    clock = [datetime(2026, 1, 31, 23, 30, tzinfo=ny)]
    guard = CostGuard(
        [Budget.daily(1.0), Budget.monthly(1.5), Budget.total(2.0)],
        ledger=f"sqlite:///{tmp_path / 'r.db'}",
        now=lambda: clock[0],
        timezone="America/New_York",
    )

    def spend(amount: float) -> None:
        t = guard.reserve(CANDS, prompt_tokens=0, max_tokens=int(amount / 2e-6))
        guard.settle(t, cost=amount)

    spend(0.8)
    clock[0] = datetime(2026, 1, 31, 23, 59, 59, tzinfo=ny)
    with pytest.raises(BudgetExceededError, match="daily 2026-01-31"):
        spend(0.4)
    clock[0] = datetime(2026, 2, 1, 0, 0, 1, tzinfo=ny)  # 05:00 UTC: a new day and month here
    spend(0.4)
    clock[0] = datetime(2026, 2, 2, 12, 0, tzinfo=ny)
    spend(0.6)
    clock[0] = datetime(2026, 2, 3, 12, 0, tzinfo=ny)
    with pytest.raises(BudgetExceededError, match="monthly 2026-02"):  # 1.0 + 0.6 > 1.5
        spend(0.6)
    clock[0] = datetime(2026, 3, 1, 0, 30, tzinfo=ny)
    with pytest.raises(BudgetExceededError, match="total"):  # 1.8 + 0.4 > 2.0 forever
        spend(0.4)
    rep = guard.report()
    assert rep.by_day == {"2026-01-31": 0.8, "2026-02-01": 0.4, "2026-02-02": 0.6}
    assert rep.by_month == {"2026-01": 0.8, "2026-02": 1.0}
    assert {b.label: b.spent for b in rep.budgets} == {
        "daily 2026-03-01": 0.0,
        "monthly 2026-03": 0.0,
        "total": 1.8,
    }
    guard.close()


def test_naive_now_is_read_in_the_guard_timezone_and_dst_days_are_23_hours():
    tokyo = CostGuard([Budget.daily(1)], now=lambda: datetime(2026, 1, 1, 8, 0), timezone="Asia/Tokyo")
    assert tokyo.calendar.windows(tokyo.now()) == ("2026-01-01", "2026-01")
    assert datetime.fromtimestamp(tokyo.now(), ZoneInfo("UTC")).hour == 23  # 2025-12-31 23:00 UTC
    ny = CostGuard([Budget.daily(1)], timezone="America/New_York")
    start, end = ny.window_bounds(
        "day", datetime(2026, 3, 8, 12, tzinfo=ZoneInfo("America/New_York")).timestamp()
    )
    assert end - start == 23 * 3600  # spring forward
    start, end = ny.window_bounds("month", datetime(2026, 12, 15, tzinfo=ZoneInfo("UTC")).timestamp())
    assert datetime.fromtimestamp(end, ZoneInfo("America/New_York")) == datetime(
        2027, 1, 1, tzinfo=ZoneInfo("America/New_York")
    )


def test_alert_fires_once_per_window_even_across_guard_instances(tmp_path: Path):
    ny = ZoneInfo("America/New_York")
    clock = [datetime(2026, 5, 4, 9, 0, tzinfo=ny).timestamp()]
    path = f"sqlite:///{tmp_path / 'a.db'}"
    alerts: list[BudgetAlert] = []

    def guard() -> CostGuard:
        return CostGuard(
            [Budget.daily(1.0)],
            ledger=path,
            now=lambda: clock[0],
            timezone="America/New_York",
            on_alert=alerts.append,
        )

    g1, g2 = guard(), guard()  # two workers sharing the file

    def spend(g: CostGuard, amount: float) -> None:
        g.settle(g.reserve(CANDS, prompt_tokens=0, max_tokens=1), cost=amount)

    spend(g1, 0.5)
    assert alerts == []
    spend(g2, 0.35)  # 0.85 >= 0.8
    spend(g1, 0.05)
    spend(g2, 0.05)
    assert [(a.budget, a.window, a.threshold, a.spent) for a in alerts] == [
        ("daily", "2026-05-04", 0.8, 0.85)
    ]
    clock[0] = datetime(2026, 5, 5, 9, 0, tzinfo=ny).timestamp()
    spend(g2, 0.9)
    spend(g1, 0.05)
    assert [(a.window, a.spent) for a in alerts] == [("2026-05-04", 0.85), ("2026-05-05", 0.9)]
    g1.close()
    g2.close()


def test_sqlite_ledger_reconnects_after_fork(tmp_path: Path):
    led = SQLiteLedger(tmp_path / "f.db")
    k = key("d", 1.0)
    led.settle(led.reserve([k], 0.1, now=0, ttl=60), 0.1)
    ctx = mp.get_context("fork")
    p = ctx.Process(target=_fork_child, args=(led,))
    p.start()
    p.join(timeout=30)
    assert p.exitcode == 0
    assert usage(led, k) == (0.3, 0)
    led.close()


def _fork_child(led: SQLiteLedger) -> None:
    k = key("d", 1.0)
    led.settle(led.reserve([k], 0.2, now=0, ttl=60), 0.2)
    os._exit(0)


# -- a process killed with calls in flight: its spend is reaped, not lost --------------------------

# Reserves 20 calls' worth (as a router would with 20 calls in flight), says so, then waits to be
# killed. The guard's clock is a fixed time given by the parent.
KILLED = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from llm_resilience_plugin.cost import Budget, CostGuard, Price
path, now = sys.argv[2], float(sys.argv[3])
guard = CostGuard([Budget.daily(1.0), Budget.scoped("tenant", 1.0)], ledger="sqlite:///" + path,
                  now=lambda: now, reservation_ttl=5)
cands = [("m", "m", Price(1e-6, 2e-6, "override", None, "m"))]
tickets = [guard.reserve(cands, prompt_tokens=1000, max_tokens=1000, request_id=f"call-{i}",
                         metadata={"tenant": "acme"}) for i in range(20)]
print(json.dumps({"estimate": sum(t.estimate for t in tickets)}), flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_process_killed_with_20_calls_in_flight_has_their_spend_reaped_not_lost(tmp_path: Path):
    path = tmp_path / "killed.db"
    t0 = datetime(2026, 6, 1, 12, 0, tzinfo=ZoneInfo("UTC")).timestamp()
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED, ROOT, str(path), str(t0)],
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
    assert child.returncode == -signal.SIGKILL
    assert estimate == pytest.approx(20 * (1000 * 1e-6 + 1000 * 2e-6))

    clock = [t0 + 1]
    guard = CostGuard(
        [Budget.daily(1.0)], ledger=f"sqlite:///{path}", now=lambda: clock[0], reservation_ttl=5
    )
    (held,) = guard.report().budgets
    assert (held.spent, held.reserved) == (0, pytest.approx(estimate))  # still in flight
    clock[0] = t0 + 6  # past the TTL: the next reserve reaps the dead process's reservations
    guard.settle(guard.reserve(CANDS, prompt_tokens=0, max_tokens=1), cost=0.01)
    rep = guard.report()
    assert (rep.calls, rep.reaped) == (21, 20)
    assert rep.total == pytest.approx(estimate + 0.01)
    assert rep.by_scope == {"tenant=acme": pytest.approx(estimate)}
    (daily,) = rep.budgets
    assert (daily.spent, daily.reserved) == (pytest.approx(estimate + 0.01), 0)
    reaped = [e for e in guard.ledger.entries() if e.reaped]
    assert sorted(e.request_id or "" for e in reaped) == sorted(f"call-{i}" for i in range(20))
    assert all(e.estimated and e.ts == t0 and e.day == "2026-06-01" for e in reaped)
    guard.close()
