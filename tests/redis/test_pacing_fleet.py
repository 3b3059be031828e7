"""A deployment's rate limit shared by the fleet on a real redis-server: two workers (two
independent RedisSharedState views) together take no more slots than the limit; the tokens are
shared too; while Redis is away a worker paces at its share, or sends nothing when fail-closed."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

pytest.importorskip("redis")

from llm_resilience_plugin._engine.clock import Clock
from llm_resilience_plugin._engine.limits import Limits
from llm_resilience_plugin._engine.pacing import Pace
from llm_resilience_plugin.shared_state import RedisSharedState
from tests.redis.redis_server import RedisServer, redis_server_fixture  # noqa: F401

FAST = {"sync_interval": 0.05, "retry_interval": 0.2}


@pytest.fixture
def two_workers(redis_server: RedisServer) -> Iterator[tuple[RedisSharedState, RedisSharedState]]:
    ns = f"p-{uuid.uuid4().hex[:8]}"
    a = RedisSharedState(redis_server.url, {**FAST, "namespace": ns})
    b = RedisSharedState(redis_server.url, {**FAST, "namespace": ns})
    yield a, b
    a.close()
    b.close()


def _pace(shared: RedisSharedState, limits: Limits, *, fail_closed: bool = False) -> Pace:
    return Pace(
        "d",
        Clock(),
        configured=limits,
        headroom=1.0,
        shared=shared.pace("r", "d", fail_closed=fail_closed),
        fail_closed=fail_closed,
    )


def _take_for(pace: Pace, seconds: float, tokens: float = 0.0) -> int:
    """How many slots one worker takes in ``seconds``, asking as fast as it can."""
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        if pace.try_take(tokens):
            n += 1
        else:
            time.sleep(0.002)
    return n


def test_two_workers_together_stay_within_one_limit(two_workers):
    a, b = two_workers
    limits = Limits(20.0, 2.0, None, 0.0, "config")  # 20/s for the fleet, 2 at once
    pa, pb = _pace(a, limits), _pace(b, limits)
    counts: list[int] = []
    threads = [threading.Thread(target=lambda p=p: counts.append(_take_for(p, 1.0))) for p in (pa, pb)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(counts)
    assert 15 <= total <= 24  # the fleet's 20/s (+ its burst), not 2 x 20
    assert all(c > 0 for c in counts)  # both workers got slots


def test_tokens_are_shared_and_refunds_reach_the_fleet(two_workers):
    a, b = two_workers
    limits = Limits(None, 1.0, 100.0, 200.0, "config")  # 100 tokens/s, 200 at once
    pa, pb = _pace(a, limits), _pace(b, limits)
    assert pa.try_take(80)  # a new fleet bucket starts half full: 100
    pa.on_answer(None, 80, 10)  # it used 10: 70 back to the fleet
    assert pb.try_take(80)  # 20 left + 70 refunded: fits (without the refund it would not)
    assert not pa.try_take(80)  # the other worker sees what pb took


def test_a_new_fleet_bucket_starts_half_full(two_workers):
    a, _ = two_workers
    pace = _pace(a, Limits(0.01, 10.0, None, 0.0, "config"))  # 10 at once, refilling very slowly
    taken = sum(pace.try_take() for _ in range(10))
    assert taken == 5  # the provider's bucket may not be full: half a burst, not all of it


def test_lower_tiers_leave_the_last_slots_of_the_fleet_to_higher_ones(two_workers):
    a, b = two_workers
    limits = Limits(0.01, 21.0, None, 0.0, "config")  # starts at 10.5, refilling very slowly
    low, high = _pace(a, limits), _pace(b, limits)  # two workers; P0..P3 (4 tiers)
    p3 = sum(low.try_take(0.0, rank=3) for _ in range(10))
    # P3 leaves half the burst (10) behind: it takes while 1 + 10 fit, i.e. none of the 10.5.
    assert p3 == 0
    p1 = sum(low.try_take(0.0, rank=1) for _ in range(10))  # P1 leaves a sixth (3.33) behind
    assert p1 == 7  # 10.5 -> 3.5 (below 1 + 3.33 it stops)
    assert sum(high.try_take(0.0, rank=0) for _ in range(10)) == 3  # P0, on the other worker: the rest


def test_redis_away_paces_at_a_local_share_or_fails_closed(redis_server: RedisServer):
    # Redis stays "away" for 5 s once marked down: the local share is what answers below.
    a = RedisSharedState(redis_server.url, {**FAST, "retry_interval": 5.0, "namespace": uuid.uuid4().hex})
    limits = Limits(10.0, 1.0, None, 0.0, "config")
    shared_pace = _pace(a, limits)
    closed = _pace(a, limits, fail_closed=True)
    assert shared_pace.try_take()
    a.mark_down(ConnectionError("gone"))  # Redis unreachable for retry_interval
    # The local share starts empty (the fleet may just have spent the provider's burst) and fills
    # at this worker's share of the rate (10/s over the workers seen): not at once, but soon.
    assert not shared_pace.try_take()
    started = time.monotonic()
    while not shared_pace.try_take():  # its local share goes on
        assert time.monotonic() - started < 2.0
        time.sleep(0.01)
    assert time.monotonic() - started >= 0.05
    assert not closed.try_take()  # fail-closed: nothing sent while the fleet's count is unknown
    a.close()
