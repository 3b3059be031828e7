"""A 429 storm of our own making against the simulator's token buckets (issue #13, item 4): the
overflow fails over at once instead of queueing behind a hold it caused, nothing is sent during a
hold, and a retry that moves to the group's other, healthy deployment takes no backoff sleep.

The hold rules with ``pacing: {enabled: false}``; the paced default is in test_pacing.py."""

from __future__ import annotations

import asyncio
import time

from llm_resilience_plugin import get_report
from llm_resilience_plugin._engine.clock import Clock
from llm_resilience_plugin.testing._simulator import Fault
from tests.conftest import MSG, RouterFactory


async def test_a_storm_of_our_own_fails_over_at_once_and_never_sends_during_a_hold(
    make_router: RouterFactory, sim
):
    router = make_router(
        {"primary": ["a", "b"], "backup": ["c"]},
        fallbacks=[{"primary": ["backup"]}],
        clock=Clock(),
        policy={"pacing": {"enabled": False}},
    )
    for dep in ("a", "b", "c"):
        sim.set_default(dep, Fault.ok(ttft=0.15))  # accepted requests still run when the 429s come
    await router.acompletion(model="primary", messages=MSG)  # warm: the wave below goes out together
    sim.clear_log()
    for dep in ("a", "b"):
        sim.token_bucket(dep, rate=1, burst=2, retry_after=1)
    t = time.monotonic()
    results = await asyncio.gather(*(router.acompletion(model="primary", messages=MSG) for _ in range(12)))
    elapsed = time.monotonic() - t
    reports = [get_report(r) for r in results]
    assert all(r is not None and r.outcome == "success" for r in reports)
    assert elapsed < 0.9  # nobody waited out the 1 s hold our own demand caused
    assert all(a.wait_before_s < 0.5 for r in reports for a in r.attempts)  # type: ignore[union-attr]
    on_primary = sum(1 for r in reports if r.served_group == "primary")  # type: ignore[union-attr]
    assert on_primary >= 4  # both bursts served on the group asked for
    assert all(any(q.status == 429 for q in sim.requests(dep)) for dep in ("a", "b"))
    # More calls while the holds run: nothing is sent to a held deployment, nobody waits.
    sent = sim.count("a") + sim.count("b")
    more = await asyncio.gather(*(router.acompletion(model="primary", messages=MSG) for _ in range(4)))
    assert sim.count("a") + sim.count("b") == sent
    for r in more:
        report = get_report(r)
        assert report is not None and report.served_group == "backup"
        assert report.attempts[0].outcome == "skipped" and report.upstream_requests == 1
        assert all(a.wait_before_s == 0.0 for a in report.attempts)


async def test_a_retry_onto_the_other_healthy_deployment_takes_no_backoff(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a", "b"], "backup": ["c"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"backoff": {"initial": 2.0, "maximum": 4.0}},
        clock=Clock(),
    )
    sim.set_default("a", Fault.server_error(503))
    for _ in range(4):
        t = time.monotonic()
        resp = await router.acompletion(model="primary", messages=MSG)
        report = get_report(resp)
        assert report is not None and report.served_group == "primary"
        assert time.monotonic() - t < 1.0  # a 2 s backoff would show
        assert all(a.wait_before_s == 0.0 for a in report.attempts)
