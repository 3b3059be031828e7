"""Trust, round two: a shutdown is not an outage, an auth error tries the group's siblings first,
and the other guarantees of docs/trust.md's "Shutdown, offline runs and config gates" section.
Each test plants the problem through the real simulator over loopback."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import pytest

from llm_resilience_plugin import ConfigError, ResilientRouter, get_report
from llm_resilience_plugin.errors import RouterClosedError
from llm_resilience_plugin.testing import Fault, ProviderSimulator
from tests.conftest import FAST_POLICY, MSG, deployment


@pytest.mark.parametrize(
    "fault",
    [
        Fault.http_error(401, message="Incorrect API key provided"),
        Fault.http_error(403, message="permission denied"),
        Fault.http_error(429, message="You exceeded your current quota: insufficient_quota"),
    ],
    ids=["401", "403", "insufficient_quota"],
)
async def test_an_auth_or_quota_error_tries_the_groups_other_deployment_before_the_fallback(
    sim: ProviderSimulator, fault: object
) -> None:
    model_list = [deployment(sim, "primary", d) for d in ("a", "b")] + [deployment(sim, "backup", "c")]
    router = ResilientRouter(
        model_list=model_list,
        policy={**FAST_POLICY, "breaker": {"fail_max": 1000, "reset_timeout": 5}},
        fallbacks=[{"primary": ["backup"]}],
        seed=3,
    )
    sim.set_default("a", fault)  # type: ignore[arg-type]
    try:
        served = Counter()
        for _ in range(12):
            resp = await router.acompletion(model="primary", messages=MSG)
            report = get_report(resp)
            assert report is not None
            served[report.served_group] += 1
        # Every call stays in its group: the sibling holds another key; nothing reaches the backup.
        assert served == {"primary": 12}
        assert sim.count("c") == 0
        assert sim.count("a") >= 1  # the random pick did send some calls to the failing one first
    finally:
        router.close()


# -- shutdown is not an outage ---------------------------------------------------------------------


def _sync_calls_in_flight(router: ResilientRouter, sim: ProviderSimulator, n: int) -> tuple[list, list]:
    """``n`` blocking calls on threads, returned once the simulator holds all ``n`` requests."""
    results: list = []
    errors: list = []

    def one() -> None:
        try:
            results.append(router.completion(model="primary", messages=MSG))
        except Exception as exc:  # collected: the test asserts on them
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    end = time.monotonic() + 20
    while sim.count() < n and time.monotonic() < end:
        time.sleep(0.01)
    assert sim.count() == n, "the calls never reached the simulator"
    return threads, [results, errors]


def _no_sync_thread_left() -> bool:
    return not [t for t in threading.enumerate() if t.name == "llm-resilience-sync"]


def _router(sim: ProviderSimulator, **kw: object) -> ResilientRouter:
    model_list = [deployment(sim, "primary", d) for d in ("a", "b")]
    return ResilientRouter(
        model_list=model_list, policy={**FAST_POLICY, "deadline": 30, "attempt_timeout": 20}, **kw
    )


def test_close_with_24_sync_calls_in_flight_drains_them_and_opens_no_breaker(sim: ProviderSimulator) -> None:
    router = _router(sim)
    for d in ("a", "b"):
        sim.set_default(d, Fault.ok(latency=0.4))
    threads, (results, errors) = _sync_calls_in_flight(router, sim, 24)
    router.close()  # the default grace: every call in flight finishes
    for t in threads:
        t.join(10)
    assert not errors and len(results) == 24
    assert all(b["state"] == "closed" and b["fail_counter"] == 0 for b in router.breakers().values())
    assert sim.count() == 24  # nothing retried
    # A call after close is a clear error, sends nothing and starts no loop thread.
    with pytest.raises(RouterClosedError, match="closed"):
        router.completion(model="primary", messages=MSG)
    with pytest.raises(RouterClosedError):
        router.embedding(model="primary", input="x")
    assert sim.count() == 24
    assert _no_sync_thread_left()


def test_calls_still_in_flight_after_the_grace_are_cancelled_never_counted(sim: ProviderSimulator) -> None:
    router = _router(sim)
    reports: list = []
    router.subscribe(
        lambda e: reports.append(e) if getattr(e, "outcome", None) and hasattr(e, "attempts") else None
    )
    for d in ("a", "b"):
        sim.set_default(d, Fault.silence(max_hold=30))
    threads, (results, errors) = _sync_calls_in_flight(router, sim, 24)
    started = time.monotonic()
    router.close(grace=0.2)
    assert time.monotonic() - started < 5
    for t in threads:
        t.join(10)
    assert not results and len(errors) == 24
    assert all(isinstance(e, RouterClosedError) for e in errors), {type(e).__name__ for e in errors}
    assert {get_report(e).outcome for e in errors} == {"cancelled"}  # type: ignore[union-attr]
    assert [r.outcome for r in reports] == ["cancelled"] * 24
    assert all(b["state"] == "closed" and b["fail_counter"] == 0 for b in router.breakers().values())
    assert sim.count() == 24  # no retry after the clients closed
    assert _no_sync_thread_left()


async def _until_sim_holds(sim: ProviderSimulator, n: int) -> None:
    for _ in range(2000):
        if sim.count() >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the calls never reached the simulator")


async def test_aclose_drains_async_calls_on_its_loop_then_cancels_what_is_left(
    sim: ProviderSimulator,
) -> None:
    router = _router(sim)
    sim.set_default("a", Fault.ok(latency=0.3))
    sim.set_default("b", Fault.ok(latency=0.3))
    calls = [asyncio.create_task(router.acompletion(model="primary", messages=MSG)) for _ in range(8)]
    await _until_sim_holds(sim, 8)
    await router.aclose()
    assert all(get_report(c.result()).outcome == "success" for c in calls)  # type: ignore[union-attr]
    with pytest.raises(RouterClosedError):
        await router.acompletion(model="primary", messages=MSG)

    slow = _router(sim)
    sim.reset()
    sim.set_default("a", Fault.silence(max_hold=30))
    sim.set_default("b", Fault.silence(max_hold=30))
    calls = [asyncio.create_task(slow.acompletion(model="primary", messages=MSG)) for _ in range(8)]
    await _until_sim_holds(sim, 8)
    await slow.aclose(grace=0.1)
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(o, RouterClosedError) for o in outcomes), outcomes
    assert not any(c.cancelled() for c in calls)  # the callers' tasks are not left cancelled
    assert all(b["fail_counter"] == 0 for b in slow.breakers().values())
    with pytest.raises(ConfigError, match="grace"):
        await slow.aclose(grace=-1)


# -- a fallback never dies on a budget ---------------------------------------------------------------


def _haiku_fallback_config(sim: ProviderSimulator, **cost: object) -> dict:
    return {
        "model_list": [
            deployment(sim, "primary", "a"),
            {
                "model_name": "backup",
                "litellm_params": {  # the docs' fallback: priced here, no max output in LiteLLM's map
                    "model": "anthropic/claude-3-5-haiku-latest",
                    "api_base": sim.anthropic_base("h"),
                    "api_key": "sk-ant-sim",
                    "input_cost_per_token": 8e-7,
                    "output_cost_per_token": 4e-6,
                },
                "model_info": {"id": "h"},
            },
        ],
        "router_settings": {"fallbacks": [{"primary": ["backup"]}]},
        "resilience": FAST_POLICY,
        "cost": {"budgets": [{"period": "day", "limit": 5}], **cost},
    }


async def test_a_fallback_whose_output_litellm_cannot_bound_answers_in_the_primarys_outage(
    sim: ProviderSimulator,
) -> None:
    from llm_resilience_plugin.cost import UNKNOWN_MAX_OUTPUT

    router = ResilientRouter.from_config(_haiku_fallback_config(sim))
    sim.set_default("a", Fault.http_error(503))
    try:
        (guard,) = router.guards
        assert guard.estimator.unbounded == ["h"]  # bounded by the documented default
        resp = await router.acompletion(model="primary", messages=MSG)  # no max_tokens
        report = get_report(resp)
        assert report is not None and report.served_group == "backup"
        assert resp.choices[0].message.content
        assert sim.count("h") == 1
        reserved = guard.estimate(
            guard.candidates_for_deployments(router.deployments("backup")), messages=MSG
        )
        assert reserved[2] == UNKNOWN_MAX_OUTPUT
    finally:
        router.close()
    # Declared on the deployment (or cost.default_max_tokens), that bound is used instead.
    cfg = _haiku_fallback_config(sim)
    cfg["model_list"][1]["model_info"]["max_output_tokens"] = 8192
    router = ResilientRouter.from_config(cfg)
    try:
        (guard,) = router.guards
        assert guard.estimator.unbounded == []
        assert (
            guard.estimate(guard.candidates_for_deployments(router.deployments("backup")), messages=MSG)[2]
            == 8192
        )
    finally:
        router.close()


def test_a_sync_stream_read_while_the_router_closes_ends_cancelled_never_counted(
    sim: ProviderSimulator,
) -> None:
    router = _router(sim)
    for d in ("a", "b"):
        sim.set_default(d, Fault.ok(text="word " * 200, chunk_delay=0.05))
    stream = router.completion(model="primary", messages=MSG, stream=True)
    got: list = []
    ended: list = []

    def read() -> None:
        try:
            for chunk in stream:
                got.append(chunk)
        except Exception as exc:
            ended.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    while len(got) < 3:
        time.sleep(0.01)
    router.close(grace=0.1)
    reader.join(10)
    assert len(ended) == 1 and isinstance(ended[0], RouterClosedError), ended
    assert stream.report.outcome == "cancelled"
    assert all(b["fail_counter"] == 0 for b in router.breakers().values())
    assert sim.count() == 1  # not recovered elsewhere
    assert _no_sync_thread_left()
