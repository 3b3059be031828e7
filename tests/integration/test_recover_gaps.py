"""Over the simulator: calls that arrive while a Retry-After holds every deployment of the group
send nothing to it (the hold rules, in force with pacing off: ``HOLD_RULES``; the paced default is
in test_pacing.py), and non-stream attempts use learned timeouts."""

from __future__ import annotations

from llm_resilience_plugin import get_report
from llm_resilience_plugin.testing import FakeClock
from llm_resilience_plugin.testing._simulator import Fault
from tests.conftest import MSG, RouterFactory

HOLD_RULES = {"pacing": {"enabled": False}}


async def test_calls_arriving_during_a_retry_after_hold_send_nothing_to_it(make_router: RouterFactory, sim):
    clock = FakeClock()
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        clock=clock,
        policy=HOLD_RULES,
    )
    sim.script("a", Fault.rate_limit(retry_after=10))  # longer than max_wait_with_fallback: fail over
    first = await router.acompletion(model="primary", messages=MSG)
    assert get_report(first).served_group == "backup"  # type: ignore[union-attr]
    assert sim.count("a") == 1
    # Held for 10 s: the next call does not knock on "a" again; it goes to the fallback at once.
    second = await router.acompletion(model="primary", messages=MSG)
    report = get_report(second)
    assert report is not None and report.served_group == "backup"
    assert sim.count("a") == 1 and clock.slept == []
    skipped = report.attempts[0]
    assert skipped.outcome == "skipped" and skipped.deployment_id is None and skipped.status is None
    assert report.upstream_requests == 1
    # 2 s left on the hold, within the 3 s bound: waited out on the group asked for, then sent.
    clock.advance(8)
    third = await router.acompletion(model="primary", messages=MSG)
    assert get_report(third).served_group == "primary"  # type: ignore[union-attr]
    assert sim.count("a") == 2 and sim.count("b") == 2
    assert clock.slept and 2.0 - 1e-6 <= clock.slept[-1] <= 4.0  # the hold, plus jitter up to it again


async def test_a_free_deployment_of_the_group_is_used_while_another_is_held(make_router: RouterFactory, sim):
    clock = FakeClock()
    router = make_router(
        {"primary": ["a", "c"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}], clock=clock
    )
    sim.set_default("a", Fault.rate_limit(retry_after=10))
    for _ in range(4):
        resp = await router.acompletion(model="primary", messages=MSG)
        assert get_report(resp).served_group == "primary"  # type: ignore[union-attr]
    assert sim.count("a") <= 1 and sim.count("b") == 0 and all(s < 0.1 for s in clock.slept)  # no hold waited


async def test_non_stream_attempts_use_a_timeout_learned_from_answer_times(make_router: RouterFactory, sim):
    from llm_resilience_plugin._engine.learned import MIN_SAMPLES

    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"attempt_timeout": 20},
    )
    for _ in range(MIN_SAMPLES):  # healthy answers: learned from them (fast: the 1 s floor)
        await router.acompletion(model="primary", messages=MSG)
    sim.set_default("a", Fault.slow_first_token(4.0))
    resp = await router.acompletion(model="primary", messages=MSG)
    report = get_report(resp)
    assert report is not None and report.served_group == "backup"
    first = report.attempts[0]
    assert first.error_class == "timeout" and first.latency_s < 2.0  # not the 20 s attempt timeout
    # A timeout the caller sets is never learned over: the slow answer is waited for.
    sim.set_default("a", Fault.slow_first_token(1.5))
    resp = await router.acompletion(model="primary", messages=MSG, attempt_timeout=10)
    assert get_report(resp).served_group == "primary"  # type: ignore[union-attr]


async def test_the_last_route_waits_the_whole_attempt_timeout(make_router: RouterFactory, sim):
    from llm_resilience_plugin._engine.learned import MIN_SAMPLES

    router = make_router({"primary": ["a"]}, policy={"attempt_timeout": 20})
    for _ in range(MIN_SAMPLES):
        await router.acompletion(model="primary", messages=MSG)
    sim.set_default("a", Fault.slow_first_token(1.5))  # slower than learned, but nowhere else to go
    resp = await router.acompletion(model="primary", messages=MSG)
    assert get_report(resp).upstream_requests == 1  # type: ignore[union-attr]


async def test_avoid_deployments_skips_them_and_fails_over_without_a_circuit_open_record(
    make_router: RouterFactory, sim
):
    import pytest

    from llm_resilience_plugin import ConfigError

    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    resp = await router.acompletion(model="primary", messages=MSG, avoid_deployments=["a"])
    report = get_report(resp)
    assert report is not None and report.served_group == "backup" and sim.count("a") == 0
    assert [a.deployment_id for a in report.attempts] == ["b"]  # nothing recorded as circuit_open
    with pytest.raises(ConfigError, match="avoid_deployments"):
        await router.acompletion(model="primary", messages=MSG, avoid_deployments="a")
    assert sim.count("a") == 0 and sim.count("b") == 1


async def test_one_call_waits_out_a_hold_and_the_overflow_fails_over_at_once(make_router: RouterFactory, sim):
    import asyncio
    import time

    from llm_resilience_plugin._engine.clock import Clock

    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        clock=Clock(),
        policy=HOLD_RULES,
    )
    await router.acompletion(model="primary", messages=MSG)  # warm: the 429s below come back together
    sim.set_default("a", Fault.rate_limit(retry_after=0.3))  # "a" stays at its limit
    t = time.monotonic()
    results = await asyncio.gather(*(router.acompletion(model="primary", messages=MSG) for _ in range(3)))
    elapsed = time.monotonic() - t
    assert all(get_report(r).served_group == "backup" for r in results)  # type: ignore[union-attr]
    # "a" answered nothing while held, so one call queues for its hold (and meets a 429 again, or
    # a hold extended by the others' 429s: it has waited one hold, so it fails over); the two
    # others fail over at once.
    assert sim.count("a") in (4, 5) and sim.count("b") == 3
    waited = [get_report(r).attempts[-1].wait_before_s for r in results]  # type: ignore[union-attr]
    assert sum(1 for r in results for a in get_report(r).attempts if a.wait_before_s >= 0.2) == 1  # type: ignore[union-attr]
    assert waited.count(0.0) == 3 and elapsed < 2.0
