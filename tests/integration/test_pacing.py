"""Pacing over real HTTP against the simulator's rate limits: a 429 storm on one deployment is paced
to zero failed calls, a configured rpm sends no request the provider refuses, header-stated limits
are adopted, a fallback with headroom takes the overflow, the typed error says how long it would
have waited, tiers go first, and blocking callers on many threads are paced too."""

from __future__ import annotations

import asyncio
import threading
import time

import litellm
import pytest

from llm_resilience_plugin import get_report
from llm_resilience_plugin._engine.clock import Clock
from llm_resilience_plugin.errors import RateLimitWaitError
from llm_resilience_plugin.events import Paced
from llm_resilience_plugin.testing import Fault
from tests.conftest import MSG, RouterFactory


def _refused(sim, dep: str, since: int = 0) -> int:
    return sum(1 for r in sim.requests(dep)[since:] if r.status == 429)


@pytest.mark.parametrize("retry_after", [1.0, None])
async def test_a_429_storm_on_one_deployment_fails_no_call(make_router: RouterFactory, sim, retry_after):
    router = make_router({"primary": ["a"]}, policy={"deadline": 30}, clock=Clock())
    await router.acompletion(model="primary", messages=MSG)  # warm
    sim.token_bucket("a", rate=40, burst=40, retry_after=retry_after)  # 40 requests/s
    before = sim.count("a")
    results = await asyncio.gather(*(router.acompletion(model="primary", messages=MSG) for _ in range(120)))
    reports = [get_report(r) for r in results]
    assert all(r is not None and r.outcome == "success" for r in reports)
    sent = sim.count("a") - before
    assert sent / 120 <= 2.0  # paced, not hammered
    assert router.breakers()["a"]["state"] == "closed"  # 429s never open a breaker of a live deployment
    assert sum(r.paced for r in reports if r) > 0  # the overflow waited for its slot


async def test_a_configured_rpm_sends_nothing_the_provider_refuses(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a"]},
        policy={"deadline": 30, "pacing": {"limits": {"primary": {"rpm": 1800}}}},
        clock=Clock(),
    )  # 30/s
    sim.rate_limit("a", rpm=2400, headers=False)  # the provider allows 40/s
    results = await asyncio.gather(*(router.acompletion(model="primary", messages=MSG) for _ in range(60)))
    assert all(get_report(r).outcome == "success" for r in results)  # type: ignore[union-attr]
    assert _refused(sim, "a") == 0
    assert sim.count("a") == 60
    pace = router.engine.paces["a"].snapshot()
    assert pace["source"] == "config" and pace["rpm"] == pytest.approx(1800 * 0.95)


async def test_the_limits_the_provider_states_in_its_headers_are_adopted(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a"]}, policy={"deadline": 30}, clock=Clock())
    await router.acompletion(model="primary", messages=MSG)
    sim.rate_limit("a", rpm=1800)  # 30/s, stated in x-ratelimit-* on every answer
    results = await asyncio.gather(*(router.acompletion(model="primary", messages=MSG) for _ in range(90)))
    assert all(get_report(r).outcome == "success" for r in results)  # type: ignore[union-attr]
    snap = router.engine.paces["a"].snapshot()
    assert snap["source"] == "headers"
    assert 0 < snap["rpm"] <= 1800
    assert sim.count("a") / 90 <= 1.6


async def test_a_fallback_with_headroom_takes_what_would_wait_too_long(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        # 2/s on the primary: its queue outgrows 0.3 s at once; the backup has no known limit
        policy={
            "deadline": 20,
            "backoff": {"max_wait_with_fallback": 0.3},
            "pacing": {"limits": {"primary": {"rpm": 120}}},
        },
        clock=Clock(),
    )
    results = await asyncio.gather(*(router.acompletion(model="primary", messages=MSG) for _ in range(20)))
    reports = [get_report(r) for r in results]
    assert all(r is not None and r.outcome == "success" for r in reports)
    assert sum(1 for r in reports if r and r.served_group == "backup") >= 15
    assert _refused(sim, "a") == 0 and _refused(sim, "b") == 0


async def test_a_wait_that_does_not_fit_the_deadline_is_a_typed_error_sending_nothing(
    make_router: RouterFactory, sim
):
    router = make_router(
        {"primary": ["a"]},
        policy={"deadline": 1.0, "pacing": {"limits": {"primary": {"rpm": 60}}}},
        clock=Clock(),
    )  # 1/s
    outcomes = await asyncio.gather(
        *(router.acompletion(model="primary", messages=MSG) for _ in range(4)), return_exceptions=True
    )
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(errors) == 3 and sim.count("a") == 1  # one slot in the second: the rest sent nothing
    for err in errors:
        assert isinstance(err, RateLimitWaitError) and err.wait_s > 0.5
        assert isinstance(err, litellm.RateLimitError)  # drop-in: caught as a plain Router's 429
        assert "would have waited" in str(err)
        report = get_report(err)
        assert report is not None and report.upstream_requests == 0


async def test_higher_tiers_get_their_slots_first(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a"]},
        policy={"deadline": 30, "pacing": {"limits": {"primary": {"rpm": 600}}}},
        clock=Clock(),
    )  # 10/s
    granted: list[str] = []  # the order the queue handed out its slots (Paced events)
    router.subscribe(lambda e: granted.append(e.priority) if isinstance(e, Paced) else None)

    async def call(priority: str) -> None:
        await router.acompletion(model="primary", messages=MSG, priority=priority)

    low = [asyncio.ensure_future(call("P3")) for _ in range(20)]  # fills the bucket and the queue
    while router.paces()["a"]["queued"] < 8:  # noqa: ASYNC110 - P3s are waiting (however slow this machine is)
        await asyncio.sleep(0.01)
    high = [asyncio.ensure_future(call("P0")) for _ in range(3)]
    await asyncio.gather(*low, *high)
    # Every P0 was handed a slot before the P3s that were still queued when it came.
    last_p0 = max(i for i, p in enumerate(granted) if p == "P0")
    assert granted.count("P0") == 3 and granted[: last_p0 + 1].count("P3") < granted.count("P3")
    assert granted[last_p0 + 1 :].count("P3") >= 3


def test_blocking_calls_from_many_threads_are_paced_too(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a"]},
        policy={"deadline": 30, "pacing": {"limits": {"primary": {"rpm": 1200}}}},
        clock=Clock(),
    )  # 20/s
    sim.rate_limit("a", rpm=1800, headers=False)
    outcomes: list[object] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(5):
            try:
                resp = router.completion(model="primary", messages=MSG)
                out: object = get_report(resp).outcome  # type: ignore[union-attr]
            except Exception as exc:
                out = exc
            with lock:
                outcomes.append(out)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes == ["success"] * 40
    assert _refused(sim, "a") == 0
    assert time.monotonic() - t0 >= 1.0  # 40 calls at 20/s after a burst of 20: paced


async def test_each_wait_is_in_the_report_and_an_event(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a"]},
        policy={"deadline": 30, "pacing": {"limits": {"primary": {"rpm": 600}}}},
        clock=Clock(),
    )
    seen: list[Paced] = []
    router.subscribe(lambda e: seen.append(e) if isinstance(e, Paced) else None)
    results = await asyncio.gather(*(router.acompletion(model="primary", messages=MSG) for _ in range(15)))
    reports = [get_report(r) for r in results]
    waited = [r for r in reports if r and r.paced]
    assert waited and all(r.queued_s > 0 for r in waited)
    assert len(seen) == sum(r.paced for r in waited)
    assert all(e.deployment_id == "a" and e.waited_s > 0 for e in seen)
    assert reports[0] is not None and "queued_s" in reports[0].to_dict()


async def test_pacing_off_keeps_the_hold_rules(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a"]}, policy={"pacing": {"enabled": False, "limits": {"a": {"rpm": 60}}}}, clock=Clock()
    )
    results = await asyncio.gather(*(router.acompletion(model="primary", messages=MSG) for _ in range(5)))
    assert all(get_report(r).paced == 0 for r in results)  # type: ignore[union-attr]
    assert sim.count("a") == 5  # nothing paced


async def test_a_healthy_router_never_asks_for_admission_once_warm(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a", "b"]}, clock=Clock())
    for _ in range(3):  # a first window answered by each deployment ends its slow start
        await asyncio.gather(*(router.acompletion(model="primary", messages=MSG) for _ in range(40)))
    await router.acompletion(model="primary", messages=MSG)
    assert not router.engine.paces.on  # past slow start, nothing limited: the fast path
    results = await asyncio.gather(*(router.acompletion(model="primary", messages=MSG) for _ in range(50)))
    assert all(get_report(r).paced == 0 for r in results)  # type: ignore[union-attr]


async def test_prometheus_shows_queue_limit_grants_and_waits_by_tier(make_router: RouterFactory, sim):
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry

    from llm_resilience_plugin.observability import instrument

    router = make_router(
        {"primary": ["a"]},
        policy={"deadline": 30, "pacing": {"limits": {"primary": {"rpm": 600}}}},
        clock=Clock(),
    )
    registry = CollectorRegistry()
    detach = instrument(router, otel="off", registry=registry)
    try:
        await asyncio.gather(
            *(router.acompletion(model="primary", messages=MSG, priority="P2") for _ in range(15))
        )
        labels = {"group": "primary", "deployment": "a"}
        assert registry.get_sample_value("llm_resilience_pacing_limit_rpm", labels) == pytest.approx(570)
        assert registry.get_sample_value("llm_resilience_pacing_granted_total", labels) == 15
        assert registry.get_sample_value("llm_resilience_pacing_queued", labels) == 0
        waits = registry.get_sample_value(
            "llm_resilience_pacing_wait_seconds_count", {**labels, "priority": "P2"}
        )
        assert waits is not None and waits >= 4  # the calls past the burst of 10 waited
    finally:
        detach()


@pytest.mark.parametrize("priority", ["P3", "P2"])
def test_a_tier_without_retries_still_waits_out_a_paced_429(make_router: RouterFactory, sim, priority):
    # P3 has max_retries 0, P2 one: a tier's cap keeps retries from adding load, and a paced 429's
    # retry adds none (it waits for a slot of its own), so a lone 429 does not fail the call.
    router = make_router(
        {"primary": ["a"]}, policy={"deadline": 30, "pacing": {"limits": {"primary": {"rpm": 6000}}}}
    )
    from llm_resilience_plugin.testing import Fault

    sim.script("a", Fault.rate_limit(retry_after=0.05), Fault.rate_limit(retry_after=0.05))
    resp = router.completion(model="primary", messages=MSG, priority=priority)
    report = get_report(resp)
    assert report is not None and report.outcome == "success" and report.upstream_requests == 3
    # Not a paced deployment: the tier's cap holds as before.
    plain = make_router({"primary": ["b"]}, policy={"deadline": 30, "pacing": {"enabled": False}})
    sim.script("b", Fault.rate_limit(retry_after=0.05))
    if priority == "P3":
        with pytest.raises(litellm.RateLimitError):
            plain.completion(model="primary", messages=MSG, priority=priority)


def _most_at_once(records) -> int:
    edges = sorted(
        [(r.started_at, 1) for r in records] + [(r.finished_at or r.started_at, -1) for r in records]
    )
    most = now = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):
        now += step
        most = max(most, now)
    return most


async def test_an_adaptive_in_flight_limit_queues_the_calls_past_it(make_router: RouterFactory, sim):
    from llm_resilience_plugin.testing import Fault

    router = make_router(
        {"primary": ["a"]},
        policy={"deadline": 30, "pacing": {"concurrency": {"primary": {"initial": 3, "min": 3, "max": 3}}}},
        clock=Clock(),
    )
    sim.set_default("a", Fault.ok(latency=0.1))
    before = sim.count("a")
    results = await asyncio.gather(*(router.acompletion(model="primary", messages=MSG) for _ in range(12)))
    assert all(get_report(r).outcome == "success" for r in results)  # type: ignore[union-attr]
    records = sim.requests("a")[before:]
    assert len(records) == 12 and _most_at_once(records) <= 3  # never more than the limit in flight
    assert sum(get_report(r).paced for r in results) >= 9  # type: ignore[union-attr, misc]
    snap = router.paces()["a"]
    assert snap["concurrency"]["limit"] == 3 and snap["in_flight"] == 0


def test_an_adaptive_in_flight_limit_holds_for_blocking_callers_on_many_threads(
    make_router: RouterFactory, sim
):
    from concurrent.futures import ThreadPoolExecutor

    from llm_resilience_plugin.testing import Fault

    router = make_router(
        {"primary": ["a"]},
        policy={"deadline": 30, "pacing": {"concurrency": {"a": {"initial": 2, "min": 2, "max": 2}}}},
        clock=Clock(),
    )
    sim.set_default("a", Fault.ok(latency=0.1))
    before = sim.count("a")
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: router.completion(model="primary", messages=MSG), range(8)))
    assert all(get_report(r).outcome == "success" for r in results)  # type: ignore[union-attr]
    assert _most_at_once(sim.requests("a")[before:]) <= 2


@pytest.mark.parametrize("blocking", [False, True])
async def test_a_429_on_one_deployment_sends_no_retry_into_a_sibling_still_answering_the_wave(
    make_router: RouterFactory, sim, blocking: bool
) -> None:
    """The refused calls' retries wait for the sibling's answers to the same wave (it may be at
    its limit too) instead of going straight into it."""
    router = make_router({"primary": ["a", "b"]}, policy={"deadline": 30}, clock=Clock())
    sim.set_default("a", Fault.rate_limit(5))  # refuses everything, Retry-After 5 s
    sim.set_default("b", Fault.ok(latency=0.5))  # answers everything, slowly
    if blocking:
        results = await asyncio.gather(
            *(asyncio.to_thread(router.completion, model="primary", messages=MSG) for _ in range(8))
        )
    else:
        results = await asyncio.gather(*(router.acompletion(model="primary", messages=MSG) for _ in range(8)))
    reports = [get_report(r) for r in results]
    assert all(r is not None and r.outcome == "success" for r in reports)
    first_to_b = sum(1 for r in reports if r is not None and r.attempts[0].deployment_id == "b")
    b = sim.requests("b")
    first_answer = min(r.finished_at for r in b if r.finished_at is not None)
    sent_before = sum(1 for r in b if r.started_at < first_answer)
    # Before b answered anything it got only the calls sent to it first (or one, if none were):
    # no refused call's retry went into it while its own wave was unanswered.
    assert sent_before <= max(1, first_to_b)
    assert router.breakers()["a"]["state"] == "closed"


async def test_admission_spreads_calls_by_the_deployments_weights(sim) -> None:
    """While admission picks the deployment (slow start, a pace), it keeps LiteLLM's
    simple-shuffle weights: ``weight: 1000`` against ``weight: 1`` gets nearly every call."""
    from llm_resilience_plugin import ResilientRouter
    from tests.conftest import FAST_POLICY, deployment

    model_list = [deployment(sim, "primary", d, weight=w) for d, w in (("a", 1000), ("b", 1))]
    router = ResilientRouter(model_list=model_list, policy=FAST_POLICY, clock=Clock())
    try:
        assert router.engine.paces.on  # the deployments are in slow start: admission picks
        served = [
            get_report(await router.acompletion(model="primary", messages=MSG)).deployment_id  # type: ignore[union-attr]
            for _ in range(20)
        ]
    finally:
        await router.aclose()
    assert served.count("a") >= 18, served
