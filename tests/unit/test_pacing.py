"""Pacing decisions without sockets: buckets, the priority queue, what 429s and rate-limit headers
teach a pace, slow start, and the waiting drivers (async and from threads) on a manual clock."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from llm_resilience_plugin._engine.clock import Clock
from llm_resilience_plugin._engine.limits import Limits, configured_limits, header_limits, parse_duration
from llm_resilience_plugin._engine.pacing import SLOW_START_WINDOW, Pace


class Manual(Clock):
    """A clock that moves only when told (its sleep moves it): slow start stays off on it."""

    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:  # type: ignore[override]
        return self.t

    def wall(self) -> float:  # type: ignore[override]
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += max(0.0, seconds)
        await asyncio.sleep(0)


class Stepped(Clock):
    """A clock moved by hand whose sleep is the real one's type (so slow start is on)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:  # type: ignore[override]
        return self.t


def _paced(rpm: float, clock: Clock | None = None, **kw: Any) -> tuple[Pace, Any]:
    clock = clock or Manual()
    limits = configured_limits({"rpm": rpm, **kw})
    return Pace("d", clock, configured=limits, headroom=1.0), clock


# -- limits ------------------------------------------------------------------------------------


def test_configured_limits_come_from_litellm_params_and_the_policy_overrides_them():
    lim = configured_limits({"rpm": 600, "tpm": 60_000})
    assert lim is not None and lim.requests_per_s == 10 and lim.request_burst == 10
    assert lim.tokens_per_s == 1000 and lim.token_burst == 1000
    over = configured_limits({"rpm": 600}, {"rpm": 60, "burst": 5})
    assert over is not None and over.requests_per_s == 1 and over.request_burst == 5
    assert configured_limits({"rpm": 0}) is None and configured_limits({"rpm": True}) is None
    assert configured_limits({}) is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("120ms", 0.12), ("6m0s", 360.0), ("1m30.5s", 90.5), ("0.5", 0.5), ("", None), ("x", None)],
)
def test_reset_durations_in_openai_forms(text: str, seconds: float | None):
    assert parse_duration(text) == (pytest.approx(seconds) if seconds is not None else None)


def test_header_limits_in_openai_anthropic_and_litellm_prefixed_forms():
    req, tok = header_limits(
        {
            "x-ratelimit-limit-requests": "10",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "1s",
            "llm_provider-x-ratelimit-limit-tokens": "1000",
            "llm_provider-x-ratelimit-remaining-tokens": "400",
            "llm_provider-x-ratelimit-reset-tokens": "600ms",
        }
    )
    assert req is not None and (req.limit, req.remaining, req.reset_s) == (10, 0, 1.0)
    assert req.rate() == pytest.approx(9.0)  # one request less used than the rounded count says
    assert tok is not None and tok.rate() == pytest.approx(599 / 0.6)
    now = 1_800_000_000.0
    reset = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + 2))
    areq, _ = header_limits(
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "10",
            "anthropic-ratelimit-requests-reset": reset,
        },
        now_wall=now,
    )
    assert areq is not None and areq.reset_s == pytest.approx(2.0, abs=1.0)
    assert header_limits({"x-ratelimit-limit-requests": "nan"}) == (None, None)
    assert header_limits(None) == (None, None)


def test_a_coarse_reading_of_a_nearly_full_bucket_sets_no_rate():
    req, _ = header_limits(
        {
            "x-ratelimit-limit-requests": "600",
            "x-ratelimit-remaining-requests": "599",
            "x-ratelimit-reset-requests": "100ms",
        }
    )
    assert req is not None and req.rate() is None


# -- buckets and the queue ---------------------------------------------------------------------


def test_a_configured_limit_lets_its_burst_go_then_paces_at_its_rate():
    pace, clock = _paced(600)  # 10/s, a burst of 10
    assert sum(pace.try_take() for _ in range(10)) == 5  # it starts half full
    clock.t += 1.0
    assert all(pace.try_take() for _ in range(10))
    assert not pace.try_take()
    assert pace.estimate(rank=1) == pytest.approx(0.1)
    clock.t += 0.1
    assert pace.try_take() and not pace.try_take()


def test_waiters_are_served_by_tier_then_in_arrival_order():
    pace, clock = _paced(60, burst=1)  # one a second
    assert pace.try_take()
    p3_first = pace.join(rank=3)
    p3_second = pace.join(rank=3)
    p0 = pace.join(rank=0)
    order = []
    for _ in range(3):
        clock.t += 1.0
        for name, w in (("p3_first", p3_first), ("p3_second", p3_second), ("p0", p0)):
            outcome, _wait = pace.turn(w, clock.t, clock.t + 100, float("inf"), None)
            if outcome == "granted" and name not in order:
                order.append(name)
    assert order == ["p0", "p3_first", "p3_second"]


def test_a_waiter_behind_others_is_told_to_sleep_until_its_own_turn():
    pace, clock = _paced(60, burst=1)
    assert pace.try_take()
    first, second = pace.join(rank=1), pace.join(rank=1)
    _, wait_first = pace.turn(first, clock.t, clock.t + 100, float("inf"), None)
    _, wait_second = pace.turn(second, clock.t, clock.t + 100, float("inf"), None)
    assert wait_first == pytest.approx(1.0) and wait_second == pytest.approx(2.0)  # in order, not a herd


def test_a_waiter_that_becomes_the_head_is_woken_to_plan_again_and_no_nap_is_long():
    # A waiter far back sleeps on an estimate made at the pace of that moment; a learned pace can
    # change under it. When it becomes the head it is woken, and no sleep is longer than MAX_NAP.
    pace, clock = _paced(60, burst=1)  # 1/s
    assert pace.try_take()
    waiters = [pace.join(rank=1) for _ in range(6)]
    _, far = pace.turn(waiters[5], clock.t, clock.t + 100, float("inf"), threading.Event())
    assert far == pytest.approx(2.0)  # its slot is 6 s away, but it looks again within 2 s
    second = threading.Event()
    pace.turn(waiters[1], clock.t, clock.t + 100, float("inf"), second)
    clock.t += 1.0
    outcome, _ = pace.turn(waiters[0], clock.t, clock.t + 100, float("inf"), None)
    assert outcome == "granted"
    assert second.is_set()  # the new head was woken (it may go sooner than it planned)


def test_a_stated_limit_gives_up_early_when_the_slot_would_miss_the_deadline():
    pace, clock = _paced(60, burst=1)
    assert pace.try_take()
    w = pace.join(rank=1)
    outcome, _ = pace.turn(w, clock.t, clock.t + 0.5, float("inf"), None)
    assert outcome == "deadline"
    pace.leave(w)
    assert pace.queued == 0


def test_leaving_the_queue_keeps_it_clean_and_a_granted_slot_goes_back():
    pace, clock = _paced(60, burst=1)
    assert pace.try_take()
    w = pace.join(rank=1)
    pace.leave(w)  # cancelled before its turn
    assert pace.queued == 0
    clock.t += 1.0
    w2 = pace.join(rank=1)
    assert pace.turn(w2, clock.t, clock.t + 10, float("inf"), None)[0] == "granted"
    w2.gone = False
    pace.leave(w2)  # granted, then cancelled before sending: the slot comes back
    assert pace.try_take()


def test_a_token_limit_reserves_input_and_bounded_output_then_settles_on_usage():
    clock = Manual()
    pace = Pace("d", clock, configured=configured_limits({"tpm": 60_000}), headroom=1.0)  # 1000/s
    clock.t += 1.0  # it starts half full: full after a second
    assert pace.try_take(800)
    assert not pace.try_take(800)  # 200 left
    pace.on_answer(None, 800, 100)  # it used 100: 700 come back
    assert pace.try_take(800)
    assert pace.snapshot()["tpm"] == 60_000


def test_a_request_larger_than_the_whole_token_bucket_goes_when_it_is_full():
    clock = Manual()
    pace = Pace("d", clock, configured=configured_limits({"tpm": 6_000}), headroom=1.0)  # 100/s
    assert not pace.try_take(500)  # the bucket starts half full
    clock.t += 1.0
    assert pace.try_take(500)  # never starves: the full bucket admits it
    assert not pace.try_take(10)
    clock.t += 5.0
    assert pace.try_take(10)


# -- learning ----------------------------------------------------------------------------------


def test_an_unlimited_deployment_is_not_paced_until_it_answers_429():
    pace = Pace("d", Manual())
    assert not pace.limited and not pace.admits
    assert pace.try_take()


def test_the_first_pace_is_what_the_deployment_accepted_before_refusing():
    clock = Manual()
    pace = Pace("d", clock)
    for _ in range(10):
        pace.answered_at(clock.t - 0.01)  # ten accepted in the burst
    for _ in range(90):
        pace.on_rate_limited(1.0, None, 0.0)  # ninety refused, Retry-After: 1
    assert pace.limited and not pace.try_take()  # held
    clock.t += 1.01
    pace.settle_learning()
    assert pace.limits.source == "learned" and pace.limits.requests_per_s == pytest.approx(10.0)
    assert pace.try_take()


def test_a_stray_429_does_not_lower_a_pace_that_was_not_binding():
    pace, clock = _paced(600)
    pace.limits.source = "learned"
    before = pace.limits.requests_per_s
    pace.on_rate_limited(None, None, 0.0)  # nobody waited, the bucket full: not our rate
    assert pace.limits.requests_per_s == before
    for _ in range(10):
        pace.try_take()
    clock.t += 2.0
    for _ in range(30):
        pace.try_take()
    pace.on_rate_limited(None, None, 0.0)  # at the pace: lower it
    assert pace.limits.requests_per_s == pytest.approx(before * 0.7)  # type: ignore[operator]


def test_a_binding_learned_pace_grows_additively_without_429s_up_to_a_configured_cap():
    clock = Manual()
    pace = Pace("d", clock, configured=configured_limits({"rpm": 1200}), headroom=1.0)  # cap 20/s
    pace.limits.requests_per_s = 10.0
    pace.limits.source = "learned"
    w = pace.join(rank=1)  # the pace binds
    for _ in range(30):
        clock.t += 1.0
        pace.estimate(rank=1)
    assert 10.0 < pace.limits.requests_per_s <= 20.0  # type: ignore[operator]
    pace.leave(w)


def test_a_first_pace_guessed_from_nothing_accepted_doubles_each_second_until_a_429():
    clock = Manual()
    pace = Pace("d", clock, headroom=1.0)
    for _ in range(20):
        pace.on_rate_limited(1.0, None, 0.0)  # an incident: everything refused, nothing accepted
    clock.t += 1.01
    pace.settle_learning()
    assert pace.probing and pace.limits.requests_per_s == pytest.approx(1.0)  # a guess: 1 / hold
    w = pace.join(rank=1)  # the pace binds
    for _ in range(4):
        clock.t += 1.0
        pace.estimate(rank=1)
    assert pace.limits.requests_per_s == pytest.approx(16.0)  # 1 -> 2 -> 4 -> 8 -> 16
    pace.on_rate_limited(None, None, 0.0)  # the limit found: multiplicative decrease, then additive
    assert not pace.probing and pace.limits.requests_per_s == pytest.approx(16.0 * 0.7)
    pace.leave(w)


def test_a_first_pace_measured_from_what_was_accepted_is_not_a_guess():
    clock = Manual()
    pace = Pace("d", clock)
    for _ in range(10):
        pace.answered_at(clock.t - 0.01)
    pace.on_rate_limited(1.0, None, 0.0)
    clock.t += 1.01
    pace.settle_learning()
    assert not pace.probing and pace.rate_at_429 == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("remaining", "reset", "rate"),
    [
        ("4", "600ms", 9.5),  # used 6 in 0.6 s: up to 10/s - the configured 10/s is not proved too high
        ("4", "1.2s", 0.95 * 5 / 1.2),  # used 6 in 1.2 s: at most 5/s - the provider's limit is lower
    ],
)
def test_headers_lower_a_configured_limit_only_when_they_prove_it_too_high(remaining, reset, rate):
    clock = Manual()
    pace = Pace("d", clock, configured=configured_limits({"rpm": 600}), headroom=0.95)
    headers = {
        "x-ratelimit-limit-requests": "10",
        "x-ratelimit-remaining-requests": remaining,
        "x-ratelimit-reset-requests": reset,
    }
    pace.on_answer(headers, 0.0, None)
    assert pace.limits.requests_per_s == pytest.approx(rate)


class _Fleet:
    """A shared bucket that refuses whoever asks with a reserve (a lower tier), recording asks."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    def take(self, rps: float, burst: float, tps: Any, tburst: float, tokens: float, reserve: float = 0.0):
        self.asked.append(reserve)
        return 0.5 if reserve > 0 else 0.0

    def refund(self, tokens: float) -> None:
        pass


def test_a_fleet_refusal_holds_back_that_tier_and_lower_but_not_a_higher_one():
    clock = Manual()
    fleet = _Fleet()
    pace = Pace("d", clock, configured=configured_limits({"rpm": 6000}), headroom=1.0, shared=fleet)
    assert not pace.try_take(rank=3)  # P3 asks with half the burst as its reserve: refused
    assert fleet.asked == [0.5]
    assert not pace.try_take(rank=3)  # not asked again: its wait is not over
    assert fleet.asked == [0.5]
    assert not pace.try_take(rank=2)  # a higher tier asks (a smaller reserve)
    assert pace.try_take(rank=0)  # a P0 asks (no reserve) and gets its slot
    assert fleet.asked == [0.5, pytest.approx(1 / 3), 0.0]
    assert not pace.try_take(rank=3) and len(fleet.asked) == 3  # P3 still waits
    clock.t += 0.6
    assert not pace.try_take(rank=3) and fleet.asked[-1] == 0.5  # its wait over, P3 asks again


def test_headers_set_the_pace_and_the_level_counts_the_slots_granted_since():
    clock = Manual()
    pace = Pace("d", clock, headroom=1.0)
    headers = {
        "x-ratelimit-limit-requests": "10",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1s",
    }
    pace.on_rate_limited(None, headers, 0.0)
    assert pace.limits.source == "headers" and pace.limits.requests_per_s == pytest.approx(9.0)
    assert pace.exact


def test_a_quiet_minute_forgets_a_learned_limit():
    clock = Manual()
    pace = Pace("d", clock)
    pace.on_rate_limited(1.0, None, 0.0)
    clock.t += 2.0
    pace.settle_learning()
    assert pace.limited
    clock.t += 61.0
    pace.forget_if_idle()
    assert not pace.limited


# -- slow start --------------------------------------------------------------------------------


def test_slow_start_sends_a_first_window_then_opens_once_it_is_answered():
    clock = Stepped()
    pace = Pace("d", clock)
    assert pace.admits
    taken = sum(pace.try_take() for _ in range(100))
    assert taken == SLOW_START_WINDOW  # a burst into an unknown limit: only the first window
    for _ in range(SLOW_START_WINDOW):
        pace.answered_at(clock.t)
        pace.ended(pace.grant(0.0, 0.0))
    assert (pace.try_take() and not pace.admits) or pace.try_take()
    assert sum(pace.try_take() for _ in range(200)) == 200  # answered without a 429: open


def test_a_429_ends_slow_start_and_the_pace_takes_over():
    clock = Stepped()
    pace = Pace("d", clock)
    assert pace.try_take()
    pace.on_rate_limited(1.0, None, 0.0)
    assert not pace.try_take()  # held now, not windowed


def test_a_siblings_429_stops_a_slow_starting_deployment_at_what_it_has_in_flight():
    clock = Stepped()
    pace = Pace("d", clock)
    assert sum(pace.try_take() for _ in range(6)) == 6  # a wave on its way, none answered yet
    pace.sibling_refused()  # the group's other deployment answered 429 to the same wave
    assert not pace.try_take()  # its retry waits to hear from this one's wave first
    pace.answered_at(clock.t)
    pace.ended(pace.grant(0.0, 0.0))
    assert pace.try_take() and pace.try_take()  # one answered: its place and one more
    assert not pace.try_take()


def test_a_siblings_429_leaves_a_deployment_with_a_known_limit_or_past_slow_start_alone():
    idle = Pace("d", Stepped())
    idle.sibling_refused()
    assert idle.try_take()  # nothing in flight: one request may go and find out
    open_ = Pace("e", Manual())  # slow start off (past it)
    open_.sibling_refused()
    assert sum(open_.try_take() for _ in range(50)) == 50


def test_the_first_pace_counts_a_waves_burst_apart_from_the_traffic_before_it():
    clock = Manual()
    pace = Pace("d", clock, headroom=1.0)
    for i in range(8):
        pace.answered_at(clock.t - 0.95 + i * 0.1)  # 8 accepted over the 0.8 s before the wave
    for _ in range(7):
        pace.answered_at(clock.t - 0.001)  # the wave: 7 accepted at once (the provider's burst)
    pace.on_rate_limited(1.0, None, 0.0)
    clock.t += 1.01
    pace.settle_learning()
    # 15 in the window over the 1 s hold would say 15/s; the traffic before the burst says 10/s,
    # and it may predate the limit: the pace starts one decrease below that, slowing near it
    assert pace.limits.requests_per_s == pytest.approx(8 / 0.8 * 0.7)
    assert pace.rate_at_429 == pytest.approx(8 / 0.8)


# -- the waiting drivers -----------------------------------------------------------------------


async def test_async_waiters_are_granted_in_tier_order():
    from llm_resilience_plugin._engine.admission import wait_async

    pace = Pace("d", Clock(), configured=Limits(50.0, 1.0, None, 0.0, "config"))  # 50/s, real time
    assert pace.try_take()
    order: list[str] = []
    waiters = {name: pace.join(rank) for name, rank in (("p2", 2), ("p1", 1), ("p0", 0))}  # all queued

    async def wait(name: str) -> None:
        assert await wait_async(pace, waiters[name], float("inf"), float("inf"), None) == "granted"
        order.append(name)

    await asyncio.gather(wait("p2"), wait("p1"), wait("p0"))
    assert order == ["p0", "p1", "p2"]
    assert pace.queued == 0


async def test_a_cancelled_async_waiter_leaves_the_queue():
    from llm_resilience_plugin._engine.admission import wait_async

    pace = Pace("d", Clock(), configured=Limits(1.0, 1.0, None, 0.0, "config"))
    assert pace.try_take()
    w = pace.join(1)
    task = asyncio.ensure_future(wait_async(pace, w, float("inf"), float("inf"), None))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pace.queued == 0


def test_blocking_waiters_on_many_threads_each_get_one_slot_at_the_pace():
    from llm_resilience_plugin._engine.admission import wait_blocking

    pace = Pace("d", Clock(), configured=Limits(50.0, 1.0, None, 0.0, "config"))  # 50/s
    granted: list[float] = []
    lock = threading.Lock()

    def one() -> None:
        if pace.try_take():
            outcome = "granted"
        else:
            outcome = wait_blocking(pace, pace.join(1), time.monotonic() + 5, float("inf"), None)
        with lock:
            granted.append(time.monotonic()) if outcome == "granted" else None

    threads = [threading.Thread(target=one) for _ in range(10)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(granted) == 10 and pace.queued == 0
    assert max(granted) - t0 >= 0.15  # nine after the first, at 50/s: paced, not all at once
