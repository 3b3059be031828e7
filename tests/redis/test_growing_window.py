"""The Redis breaker's growing open window and fleet-wide 429 streak, against a real redis-server:
the same shape as the in-process breaker (min_reset_timeout doubling up to reset_timeout, capped
by probe_interval, back to the start after a success; rate_limit_fail_max 429s in a row)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

pytest.importorskip("redis")

from llm_resilience_plugin._engine.breakers import DeploymentBreaker
from llm_resilience_plugin.policy import BreakerPolicy
from llm_resilience_plugin.shared_state import RedisSharedState
from tests.redis.redis_server import RedisServer, redis_server_fixture  # noqa: F401
from tests.unit.test_breakers import Now


@pytest.fixture
def pair(redis_server: RedisServer) -> Iterator[tuple[RedisSharedState, RedisSharedState, Now]]:
    ns = f"w-{uuid.uuid4().hex[:8]}"
    now = Now()
    a = RedisSharedState(redis_server.url, {"namespace": ns, "sync_interval": 10}, clock=now)
    b = RedisSharedState(redis_server.url, {"namespace": ns, "sync_interval": 10}, clock=now)
    yield a, b, now
    a.close()
    b.close()


def breaker(shared: RedisSharedState, policy: BreakerPolicy, now: Now) -> DeploymentBreaker:
    backend = shared.breaker_backend("r", "d1", policy, lease=1e6)
    shared.prime([backend])
    return DeploymentBreaker("d1", "g", policy, clock=now, backend=backend)


def windows(b: DeploymentBreaker, now: Now, n: int) -> list[float]:
    """The open windows of ``n`` failed probes in a row (seconds until each probe is admitted)."""
    out = []
    for _ in range(n):
        start = now.t
        probe = b.admit()
        while probe is None:
            now.t += 0.25
            probe = b.admit()
        out.append(now.t - start)
        assert probe.probe
        b.record_failure(probe)
    return out


def test_the_shared_window_starts_short_doubles_per_failed_probe_and_resets(pair):
    a, b, now = pair
    pol = BreakerPolicy(fail_max=1, reset_timeout=30, min_reset_timeout=2)
    one, other = breaker(a, pol, now), breaker(b, pol, now)
    one.record_failure(one.admit())  # type: ignore[arg-type]
    # Probes from either process: one fleet-wide streak.
    assert windows(other, now, 3) + windows(one, now, 3) == pytest.approx([2, 4, 8, 16, 30, 30], abs=0.26)
    assert one.retry_at() == pytest.approx(now.t + 30, abs=0.01)
    now.t += 30
    probe = other.admit()
    assert probe is not None and probe.probe
    other.record_success(probe)  # recovered: the next opening starts at 2 s again
    assert other.state == "closed"
    one.record_failure(one.admit())  # type: ignore[arg-type]
    assert windows(one, now, 1) == pytest.approx([2], abs=0.26)


def test_a_probe_interval_caps_the_shared_window(pair):
    a, _b, now = pair
    pol = BreakerPolicy(fail_max=1, reset_timeout=30, min_reset_timeout=2, probe_interval=3)
    one = breaker(a, pol, now)
    one.record_failure(one.admit())  # type: ignore[arg-type]
    assert windows(one, now, 4) == pytest.approx([2, 3, 3, 3], abs=0.26)


def test_a_process_that_meets_nothing_but_429s_opens_the_breaker_for_the_fleet(pair):
    a, b, now = pair
    pol = BreakerPolicy(fail_max=3, rate_limit_fail_max=4, rate_limit_open_after=0)
    one, other = breaker(a, pol, now), breaker(b, pol, now)
    for _ in range(3):  # three 429s: rate limited, not down
        other.record_rate_limited(other.admit())  # type: ignore[arg-type]
    assert one.state == "closed"
    other.record_success(other.admit())  # type: ignore[arg-type]  # an answer ends the streak
    for _ in range(3):
        other.record_rate_limited(other.admit())  # type: ignore[arg-type]
    assert one.state == "closed" and other.state == "closed"
    other.record_rate_limited(other.admit())  # type: ignore[arg-type]  # four in a row, nothing else
    assert other.state == "open"
    assert other.retry_at() == pytest.approx(now.t + 2, abs=0.01)
