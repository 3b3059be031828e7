"""The breaker gate: unit tests and a Hypothesis state machine against a simple reference model."""

from __future__ import annotations

import asyncio
import threading

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from llm_resilience_plugin._engine.breakers import Admission, DeploymentBreaker
from llm_resilience_plugin.events import BreakerTransition
from llm_resilience_plugin.policy import BreakerPolicy


class Now:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def make(
    fail_max: int = 3, reset: float = 10, success: int = 1, probes: int = 1, min_reset: float | None = None
):
    now = Now()
    events: list[BreakerTransition] = []
    b = DeploymentBreaker(
        "d1",
        "g",
        BreakerPolicy(
            fail_max=fail_max,
            reset_timeout=reset,
            min_reset_timeout=reset if min_reset is None else min_reset,  # a fixed window unless asked
            success_threshold=success,
            half_open_max_probes=probes,
        ),
        clock=now,
        on_transition=events.append,
    )
    return b, now, events


def test_opens_after_threshold_and_refuses_until_reset_timeout():
    b, now, events = make(fail_max=3)
    for _ in range(3):
        adm = b.admit()
        assert adm is not None
        b.record_failure(adm)
    assert b.state == "open"
    assert b.admit() is None
    now.t += 9.9
    assert b.admit() is None
    now.t += 0.2
    probe = b.admit()
    assert probe is not None and probe.probe
    assert b.state == "half-open"
    assert b.admit() is None  # one probe at a time
    b.record_success(probe)
    assert b.state == "closed"
    assert [(e.old_state, e.new_state) for e in events] == [
        ("closed", "open"),
        ("open", "half-open"),
        ("half-open", "closed"),
    ]


def test_stale_outcomes_are_ignored():
    b, now, events = make(fail_max=2)
    early = [b.admit() for _ in range(5)]
    assert all(a is not None for a in early)
    b.record_failure(early[0])  # type: ignore[arg-type]
    b.record_failure(early[1])  # type: ignore[arg-type]
    assert b.state == "open"
    # Late failures of calls admitted while closed do not re-open or extend opened_at.
    retry_at = b.retry_at()
    now.t += 5
    b.record_failure(early[2])  # type: ignore[arg-type]
    assert b.retry_at() == retry_at
    # A late success from before the trip does not close the re-opened breaker.
    b.record_success(early[3])  # type: ignore[arg-type]
    assert b.state == "open"
    assert [(e.old_state, e.new_state) for e in events] == [("closed", "open")]


def test_cancellation_and_caller_errors_count_as_neither():
    b, now, _ = make(fail_max=1)
    adm = b.admit()
    assert adm is not None
    b.release(adm)
    assert b.state == "closed" and b.snapshot()["fail_counter"] == 0
    b.record_failure(b.admit())  # type: ignore[arg-type]
    now.t += 11
    probe = b.admit()
    assert probe is not None and probe.probe
    b.release(probe)  # cancelled probe frees the slot without deciding
    assert b.state == "half-open"
    again = b.admit()
    assert again is not None and again.probe


def test_a_probe_is_admitted_exactly_when_the_window_ends_between_microseconds():
    """Found by the state machine below: pybreaker keeps ``opened_at`` to the microsecond, and an
    opening at 1000000.3984375 (half a microsecond) rounded up refused the probe due at +10 s."""
    b, now, _ = make(fail_max=1)
    now.t += 0.3984375
    b.record_failure(b.admit())  # type: ignore[arg-type]
    now.t += 9.999
    assert b.admit() is None and not b.could_admit()
    now.t += 0.001
    assert b.could_admit()
    probe = b.admit()
    assert probe is not None and probe.probe


def test_exactly_n_probes_under_thread_contention():
    b, now, _ = make(fail_max=1, probes=2)
    b.record_failure(b.admit())  # type: ignore[arg-type]
    now.t += 11
    admitted: list[Admission] = []
    lock = threading.Lock()
    barrier = threading.Barrier(32)

    def worker() -> None:
        barrier.wait()
        adm = b.admit()
        if adm is not None:
            with lock:
                admitted.append(adm)

    threads = [threading.Thread(target=worker) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(admitted) == 2 and all(a.probe for a in admitted)


async def test_exactly_one_probe_among_200_tasks():
    b, now, _ = make(fail_max=1)
    b.record_failure(b.admit())  # type: ignore[arg-type]
    now.t += 11

    async def call() -> bool:
        adm = b.admit()
        if adm is None:
            return False
        await asyncio.sleep(0.01)
        b.record_success(adm)
        return True

    results = await asyncio.gather(*(call() for _ in range(200)))
    assert sum(results) == 1
    assert b.state == "closed"


class BreakerModel(RuleBasedStateMachine):
    """Reference model: closed/open/half-open with generations; the gate must agree with it."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_max = 3
        self.reset = 10.0
        self.probes_max = 2
        self.success_needed = 2
        self.b, self.now, self.events = make(
            fail_max=self.fail_max, reset=self.reset, success=self.success_needed, probes=self.probes_max
        )
        self.state = "closed"
        self.gen = 0
        self.fails = 0
        self.successes = 0
        self.probes = 0
        self.opened_at = 0.0
        self.tickets: list[tuple[Admission, int]] = []

    def _trip(self) -> None:
        self.state, self.gen, self.probes, self.opened_at = "open", self.gen + 1, 0, self.now.t
        self.successes = 0

    @rule(dt=st.floats(min_value=0, max_value=15))
    def tick(self, dt: float) -> None:
        self.now.t += dt

    @rule()
    def admit(self) -> None:
        adm = self.b.admit()
        expected = True
        if self.state == "open":
            if self.now.t >= self.opened_at + self.reset:
                self.state, self.gen, self.probes, self.successes = "half-open", self.gen + 1, 0, 0
            else:
                expected = False
        if self.state == "half-open" and expected:
            expected = self.probes < self.probes_max
            if expected:
                self.probes += 1
        assert (adm is not None) == expected
        if adm is not None:
            assert adm.generation == self.gen
            assert adm.probe == (self.state == "half-open")
            self.tickets.append((adm, self.gen))

    @precondition(lambda self: self.tickets)
    @rule(i=st.integers(min_value=0), outcome=st.sampled_from(["success", "failure", "release"]))
    def finish(self, i: int, outcome: str) -> None:
        adm, gen = self.tickets.pop(i % len(self.tickets))
        current = gen == self.gen
        if outcome == "success":
            self.b.record_success(adm)
            if current and adm.probe:
                self.probes -= 1
                self.successes += 1
                if self.successes >= self.success_needed:
                    self.state, self.gen, self.probes, self.fails = "closed", self.gen + 1, 0, 0
                    self.successes = 0
            elif current:
                self.fails = 0
        elif outcome == "failure":
            self.b.record_failure(adm)
            if current and adm.probe:
                self.probes -= 1
                self._trip()
            elif current:
                self.fails += 1
                if self.fails >= self.fail_max:
                    self._trip()
        else:
            self.b.release(adm)
            if current and adm.probe:
                self.probes -= 1

    @invariant()
    def agrees(self) -> None:
        assert self.b.state == self.state
        assert self.b.generation == self.gen
        snap = self.b.snapshot()
        assert snap["probes_in_flight"] == self.probes
        if self.state == "closed":
            assert snap["fail_counter"] == self.fails
        # Every transition was emitted exactly once and chains old -> new.
        for prev, nxt in zip(self.events, self.events[1:], strict=False):
            assert prev.new_state == nxt.old_state
            assert prev.new_state != prev.old_state


TestBreakerModel = BreakerModel.TestCase
TestBreakerModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_the_open_window_starts_short_and_doubles_with_each_failed_probe():
    b, now, _ = make(fail_max=1, reset=30, min_reset=2)
    b.record_failure(b.admit())  # type: ignore[arg-type]
    windows = []
    for _ in range(6):  # each failed probe: the next window is twice as long, up to reset_timeout
        start = now.t
        probe = b.admit()
        while probe is None:
            now.t += 0.25
            probe = b.admit()
        windows.append(now.t - start)
        assert probe.probe
        b.record_failure(probe)
    assert windows == pytest.approx([2, 4, 8, 16, 30, 30], abs=0.26)


def test_a_success_brings_the_window_back_to_its_start():
    b, now, _ = make(fail_max=1, reset=30, min_reset=2)
    b.record_failure(b.admit())  # type: ignore[arg-type]
    now.t += 2
    probe = b.admit()
    assert probe is not None and probe.probe
    b.record_failure(probe)  # the window doubles to 4 s
    now.t += 4
    probe = b.admit()
    assert probe is not None
    b.record_success(probe)  # recovered: closed, and the next outage starts at 2 s again
    assert b.state == "closed"
    b.record_failure(b.admit())  # type: ignore[arg-type]
    now.t += 1.9
    assert b.admit() is None
    now.t += 0.2
    assert b.admit() is not None


def test_rate_limits_open_the_breaker_only_when_nothing_but_429s_came_for_a_minute():
    b, now, _ = make(fail_max=3)
    for _ in range(50):  # a 429 storm: the deployment is rate limited, not down
        b.record_rate_limited(b.admit())  # type: ignore[arg-type]
    assert b.state == "closed"
    now.t += 59  # 429s only, but not yet for rate_limit_open_after (60 s)
    for _ in range(9):
        b.record_rate_limited(b.admit())  # type: ignore[arg-type]
    assert b.state == "closed"
    b.record_success(b.admit())  # type: ignore[arg-type]  # one answer: alive, the streak ends
    now.t += 61
    for _ in range(9):
        b.record_rate_limited(b.admit())  # type: ignore[arg-type]
    now.t += 61
    b.record_rate_limited(b.admit())  # type: ignore[arg-type]
    assert b.state == "open"  # ten in a row over a minute with no answer: an exhausted quota


def test_429s_spread_over_a_long_time_with_answers_between_never_open():
    b, now, _ = make(fail_max=3)
    for _ in range(30):
        for _ in range(20):
            b.record_rate_limited(b.admit())  # type: ignore[arg-type]
        now.t += 5
        b.record_success(b.admit())  # type: ignore[arg-type]
    assert b.state == "closed"


def test_a_probe_interval_caps_the_growing_window_one_probe_at_a_time():
    now = Now()
    policy = BreakerPolicy(fail_max=1, reset_timeout=30, min_reset_timeout=2, probe_interval=2)
    b = DeploymentBreaker("d1", "g", policy, clock=now)
    b.record_failure(b.admit())  # type: ignore[arg-type]
    for _ in range(6):  # a long outage: one probe every 2 s, never a 16 s or 30 s window
        now.t += 1.9
        assert b.admit() is None
        now.t += 0.1
        probe = b.admit()
        assert probe is not None and probe.probe
        assert b.admit() is None  # never two probes in flight
        b.record_failure(probe)
    assert b.retry_at() == pytest.approx(now.t + 2)


def test_the_router_probes_a_preferred_route_at_the_fixed_interval_only():
    from llm_resilience_plugin._engine.engine import PROBE_INTERVAL, preferred_routes
    from llm_resilience_plugin.policy import ResiliencePolicy, RouterSpec

    def spec(policy: ResiliencePolicy) -> RouterSpec:
        models = [{"model_name": g, "litellm_params": {"model": "openai/x"}} for g in ("primary", "fallback")]
        return RouterSpec(model_list=models, fallbacks={"primary": ["fallback"]}, policy=policy)

    default = ResiliencePolicy()
    pols = {g: default.for_group(g) for g in ("primary", "fallback")}
    out = preferred_routes(pols, spec(default))
    assert out["primary"].breaker.probe_interval == PROBE_INTERVAL
    assert "fallback" not in out  # nowhere else to go: the growing window alone
    assert out["primary"].breaker.window(4) == PROBE_INTERVAL
    assert pols["fallback"].breaker.window(4) == 16
    custom = ResiliencePolicy.model_validate({"breaker": {"probe_interval": 5}})
    pols = {g: custom.for_group(g) for g in ("primary", "fallback")}
    assert preferred_routes(pols, spec(custom)) == {}  # configured: never overridden
    assert pols["fallback"].breaker.window(4) == 5
