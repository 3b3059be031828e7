"""ResilientRouter over real HTTP to the provider simulator: attempt counts, actions per error
class, Retry-After, breakers, fallbacks, deadlines, concurrency."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

import litellm
import pytest

from llm_resilience_plugin import AllRoutesFailedError, ErrorClass, get_report
from llm_resilience_plugin.events import AttemptRecord
from llm_resilience_plugin.testing import FakeClock
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator
from tests.conftest import MSG, RouterFactory


def gaps(sim: ProviderSimulator, dep: str) -> list[float]:
    reqs = sim.requests(dep)
    return [b.started_at - a.started_at for a, b in itertools.pairwise(reqs)]


# -- the plugin owns every retry layer ------------------------------------------------------------


async def test_healthy_calls_make_exactly_one_request_each(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a", "b"]})
    for _ in range(10):
        resp = await router.acompletion(model="primary", messages=MSG)
        assert resp.choices[0].message.content.startswith("Hello from ")
    assert sim.count() == 10


async def test_one_500_then_success_makes_exactly_two_requests(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a"]})
    sim.script("a", Fault.server_error(500))
    resp = await router.acompletion(model="primary", messages=MSG)
    rep = get_report(resp)
    assert sim.count("a") == 2
    assert rep is not None
    assert [a.outcome for a in rep.attempts] == ["failure", "success"]
    assert rep.attempts[0].error_class is ErrorClass.SERVER
    assert rep.attempts[0].status == 500
    assert rep.deployment_id == "a" and rep.served_group == "primary" and rep.fallback_level == 0
    assert rep.served_model and "gpt-4o-mini" in rep.served_model
    assert rep.usage and rep.usage["total_tokens"] > 0


async def test_retry_prefers_a_different_healthy_deployment(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a", "b"]},
        policy={"breaker": {"fail_max": 100}, "retry_budget": {"enabled": False}},
    )
    for _ in range(10):
        sim.reset()
        sim.script("a", Fault.server_error(503))
        sim.script("b", Fault.server_error(503))
        resp = await router.acompletion(model="primary", messages=MSG)
        rep = get_report(resp)
        assert rep is not None
        first, second = rep.attempts[0], rep.attempts[1]
        assert first.deployment_id != second.deployment_id


# -- each error class -> its action, with exact upstream counts ----------------------------------


@pytest.mark.parametrize(
    ("fault", "error_class", "primary_requests"),
    [
        (Fault.rate_limit(), ErrorClass.RATE_LIMIT, 5),  # 4 paced retries, then fail over
        (Fault.server_error(500), ErrorClass.SERVER, 3),
        (Fault.server_error(502), ErrorClass.SERVER, 3),
        (Fault.server_error(503), ErrorClass.SERVER, 3),
        (Fault.overloaded(), ErrorClass.SERVER, 3),
        (Fault.reset(), ErrorClass.CONNECTION, 3),
        (Fault.auth(), ErrorClass.AUTH, 1),  # fail over, never retry
    ],
)
async def test_error_class_actions_with_fallback(
    make_router: RouterFactory, sim, fault, error_class, primary_requests
):
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    sim.set_default("a", fault)
    resp = await router.acompletion(model="primary", messages=MSG)
    rep = get_report(resp)
    assert rep is not None
    assert sim.count("a") == primary_requests
    assert sim.count("b") == 1
    assert rep.served_group == "backup" and rep.fallback_level == 1 and rep.deployment_id == "b"
    assert {a.error_class for a in rep.attempts if a.outcome == "failure"} == {error_class}


async def test_bad_request_is_never_retried_and_keeps_the_provider_error(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    sim.set_default("a", Fault.not_found())
    with pytest.raises(litellm.NotFoundError) as info:
        await router.acompletion(model="primary", messages=MSG)
    assert info.value.status_code == 404
    assert sim.count("a") == 1 and sim.count("b") == 0
    rep = get_report(info.value)
    assert rep is not None and rep.attempts[0].error_class is ErrorClass.BAD_REQUEST


async def test_context_window_goes_to_context_window_fallbacks_only(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a"], "backup": ["b"], "big": ["c"]},
        fallbacks=[{"primary": ["backup"]}],
        context_window_fallbacks=[{"primary": ["big"]}],
    )
    sim.set_default("a", Fault.context_length())
    resp = await router.acompletion(model="primary", messages=MSG)
    rep = get_report(resp)
    assert rep is not None and rep.served_group == "big"
    assert (sim.count("a"), sim.count("b"), sim.count("c")) == (1, 0, 1)


async def test_context_window_without_fallback_raises_provider_error(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a"]})
    sim.set_default("a", Fault.context_length())
    with pytest.raises(litellm.ContextWindowExceededError):
        await router.acompletion(model="primary", messages=MSG)
    assert sim.count("a") == 1


async def test_content_policy_not_retried_and_not_sent_to_generic_fallback(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    sim.set_default("a", Fault.content_filter())
    with pytest.raises(litellm.BadRequestError) as info:
        await router.acompletion(model="primary", messages=MSG)
    assert "content" in str(info.value).lower()
    assert sim.count("a") == 1 and sim.count("b") == 0
    rep = get_report(info.value)
    assert rep is not None and rep.attempts[0].error_class is ErrorClass.CONTENT_POLICY


async def test_content_policy_fallback_used_where_configured(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a"], "lenient": ["b"]}, content_policy_fallbacks=[{"primary": ["lenient"]}]
    )
    sim.set_default("a", Fault.content_filter())
    resp = await router.acompletion(model="primary", messages=MSG)
    assert get_report(resp).served_group == "lenient"  # type: ignore[union-attr]
    assert (sim.count("a"), sim.count("b")) == (1, 1)


async def test_non_retryable_error_is_not_masked_by_later_fallback_error(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a"], "big": ["b"]}, context_window_fallbacks=[{"primary": ["big"]}])
    sim.set_default("a", Fault.context_length())
    sim.set_default("b", Fault.server_error(500))
    with pytest.raises(litellm.ContextWindowExceededError) as info:
        await router.acompletion(model="primary", messages=MSG)
    rep = get_report(info.value)
    assert rep is not None and len(rep.attempts) == 4  # 1 on primary + 3 on big


# -- Retry-After ----------------------------------------------------------------------------------


async def test_retry_after_gap_is_honoured(make_router: RouterFactory, sim):
    from llm_resilience_plugin.testing import Clock

    router = make_router({"primary": ["a"]}, clock=Clock())
    sim.script("a", Fault.rate_limit(retry_after=0.4))
    resp = await router.acompletion(model="primary", messages=MSG)
    assert resp.choices[0].message.content
    assert sim.count("a") == 2
    assert gaps(sim, "a")[0] >= 0.4


async def test_retry_after_as_http_date_is_parsed(make_router: RouterFactory, sim, llm_clock):
    clock = llm_clock  # the pytest plugin's FakeClock
    router = make_router({"primary": ["a"]}, clock=clock)
    when = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 3))
    sim.script("a", Fault.rate_limit(retry_after=when))
    await router.acompletion(model="primary", messages=MSG)
    assert sim.count("a") == 2
    assert clock.slept and 1.5 <= sum(clock.slept) <= 3.5  # the hold, waited out (in the pace)


async def test_retry_after_beyond_deadline_fails_over_without_sleeping(make_router: RouterFactory, sim):
    clock = FakeClock()
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"deadline": 5},
        clock=clock,
    )
    sim.set_default("a", Fault.rate_limit(retry_after=30))
    t0 = time.monotonic()
    resp = await router.acompletion(model="primary", messages=MSG)
    assert time.monotonic() - t0 < 2
    assert not any(clock.slept)  # nothing waited: the hold is longer than the deadline
    assert get_report(resp).served_group == "backup"  # type: ignore[union-attr]
    assert (sim.count("a"), sim.count("b")) == (1, 1)


async def test_retry_after_on_one_deployment_moves_to_the_other_at_once(make_router: RouterFactory, sim):
    clock = FakeClock()
    router = make_router({"primary": ["a", "b"]}, clock=clock)
    sim.set_default("a", Fault.rate_limit(retry_after=20))
    for _ in range(10):
        resp = await router.acompletion(model="primary", messages=MSG)
        assert get_report(resp).deployment_id == "b"  # type: ignore[union-attr]
    # A 429 from a: the retry went to b at once (no 20 s wait), and a was held off afterwards.
    assert sim.count("a") <= 1
    assert sim.count("b") == 10
    assert all(s < 1 for s in clock.slept)


# -- deadlines and silent providers ---------------------------------------------------------------


async def test_silent_provider_fails_over_inside_the_deadline(make_router: RouterFactory, sim):
    from llm_resilience_plugin.testing import Clock

    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"deadline": 5, "attempt_timeout": 2},
        clock=Clock(),
    )
    sim.set_default("a", Fault.silence(max_hold=10))
    t0 = time.monotonic()
    resp = await router.acompletion(model="primary", messages=MSG)
    elapsed = time.monotonic() - t0
    assert elapsed < 3.0
    rep = get_report(resp)
    assert rep is not None and rep.served_group == "backup"
    assert sim.count("a") == 1  # never a second wait on the silent deployment
    assert rep.attempts[0].error_class is ErrorClass.TIMEOUT


async def test_per_call_deadline_bounds_everything(make_router: RouterFactory, sim):
    from llm_resilience_plugin import DeadlineExceededError
    from llm_resilience_plugin.testing import Clock

    router = make_router({"primary": ["a"]}, policy={"attempt_timeout": 5}, clock=Clock())
    sim.set_default("a", Fault.silence(max_hold=10))
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceededError) as info:
        await router.acompletion(model="primary", messages=MSG, deadline=0.5)
    assert time.monotonic() - t0 < 1.5
    assert isinstance(info.value, TimeoutError)
    assert sim.count("a") == 1


# -- all routes fail ------------------------------------------------------------------------------


async def test_all_routes_fail_lists_every_attempt_async(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    sim.set_default("a", Fault.server_error(500))
    sim.set_default("b", Fault.server_error(503))
    with pytest.raises(AllRoutesFailedError) as info:
        await router.acompletion(model="primary", messages=MSG)
    err = info.value
    assert len(err.attempts) == 6 == sim.count()
    assert [a.model_group for a in err.attempts] == ["primary"] * 3 + ["backup"] * 3
    assert isinstance(err.__cause__, litellm.InternalServerError)
    assert "primary/a" in str(err) and "backup/b" in str(err)


def test_all_routes_fail_lists_every_attempt_sync(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    sim.set_default("a", Fault.server_error(500))
    sim.set_default("b", Fault.server_error(503))
    with pytest.raises(AllRoutesFailedError) as info:
        router.completion(model="primary", messages=MSG)
    assert len(info.value.attempts) == 6 == sim.count()


def test_sync_calls_from_many_threads(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a", "b"]})
    sim.set_default("a", Fault.flaky(0.3, Fault.server_error(500), seed=7))
    results: list[object] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(5):
            r = router.completion(model="primary", messages=MSG)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 40
    assert sum(get_report(r).upstream_requests for r in results) == sim.count()  # type: ignore[union-attr]


async def test_concurrent_calls_lose_and_duplicate_no_attempt(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a", "b"], "backup": ["c"]},
        fallbacks=[{"primary": ["backup"]}],
        # accounting under concurrency, not latency: a deadline a loaded 2-core machine cannot miss
        policy={"deadline": 60, "breaker": {"fail_max": 1000}, "retry_budget": {"enabled": False}},
    )
    sim.set_default("a", Fault.flaky(0.3, Fault.server_error(500), seed=1))
    sim.set_default("b", Fault.flaky(0.3, Fault.rate_limit(), seed=2))
    results = await asyncio.gather(*(router.acompletion(model="primary", messages=MSG) for _ in range(200)))
    reports = [get_report(r) for r in results]
    assert all(r is not None and r.outcome == "success" for r in reports)
    assert sum(r.upstream_requests for r in reports if r) == sim.count()
    assert len({r.call_id for r in reports if r}) == 200


# -- breakers -------------------------------------------------------------------------------------


async def test_breaker_opens_and_dead_deployment_gets_no_traffic(make_router: RouterFactory, sim):
    transitions = []
    router = make_router({"primary": ["a", "b"]}, policy={"breaker": {"fail_max": 3}})
    router.subscribe(lambda e: transitions.append(e) if type(e).__name__ == "BreakerTransition" else None)
    sim.set_default("a", Fault.server_error(500))
    for _ in range(60):
        await router.acompletion(model="primary", messages=MSG)
        if router.breakers()["a"]["state"] == "open":
            break
    assert router.breakers()["a"]["state"] == "open"
    dead_before = sim.count("a")
    assert dead_before == 3
    for _ in range(20):
        await router.acompletion(model="primary", messages=MSG)
    assert sim.count("a") == dead_before
    assert [(t.deployment_id, t.old_state, t.new_state) for t in transitions] == [("a", "closed", "open")]


async def test_all_deployments_open_fails_over_without_sending(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"breaker": {"fail_max": 2}},
    )
    sim.set_default("a", Fault.server_error(500))
    await router.acompletion(model="primary", messages=MSG)
    assert router.breakers()["a"]["state"] == "open"
    sim.clear_log()
    resp = await router.acompletion(model="primary", messages=MSG)
    rep = get_report(resp)
    assert sim.count("a") == 0 and sim.count("b") == 1
    assert rep is not None and rep.attempts[0].outcome == "skipped"
    assert rep.attempts[0].error_class is ErrorClass.CIRCUIT_OPEN
    assert rep.upstream_requests == 1


async def test_exactly_one_probe_in_half_open_under_200_concurrent_calls(make_router: RouterFactory, sim):
    clock = FakeClock()
    router = make_router(
        {"primary": ["a", "b"]},
        policy={"breaker": {"fail_max": 2, "reset_timeout": 10}},
        clock=clock,
    )
    sim.set_default("a", Fault.server_error(500))
    for _ in range(60):  # LiteLLM shuffles: go on until a has failed twice
        await router.acompletion(model="primary", messages=MSG)
        if sim.count("a") >= 2:
            break
    assert router.breakers()["a"]["state"] == "open"
    closed_at: list[float] = []
    router.subscribe(
        lambda e: (
            closed_at.append(time.monotonic())
            if getattr(e, "new_state", None) == "closed" and getattr(e, "deployment_id", None) == "a"
            else None
        )
    )
    clock.advance(11)
    sim.clear_log()
    sim.set_default("a", Fault.ok(latency=0.3))  # the probe stays in flight while others arrive
    results = await asyncio.gather(*(router.acompletion(model="primary", messages=MSG) for _ in range(200)))
    assert len(results) == 200
    assert router.breakers()["a"]["state"] == "closed" and len(closed_at) == 1
    # While half-open, exactly one request reached the deployment (the probe); once the probe
    # closed the breaker, later calls may go there again (on a loaded machine some do).
    during_half_open = [r for r in sim.requests("a") if r.started_at < closed_at[0]]
    assert len(during_half_open) == 1
    # Recovered: traffic returns to the deployment.
    sim.clear_log()
    for _ in range(20):
        await router.acompletion(model="primary", messages=MSG)
    assert sim.count("a") > 0


async def test_failed_probe_reopens(make_router: RouterFactory, sim):
    clock = FakeClock()
    router = make_router(
        {"primary": ["a", "b"]}, policy={"breaker": {"fail_max": 1, "reset_timeout": 10}}, clock=clock
    )
    sim.set_default("a", Fault.server_error(500))
    for _ in range(40):  # LiteLLM shuffles: go on until it has picked a once
        await router.acompletion(model="primary", messages=MSG)
        if sim.count("a"):
            break
    assert sim.count("a") == 1
    assert router.breakers()["a"]["state"] == "open"  # fail_max=1: its one failure tripped it
    clock.advance(11)
    sim.clear_log()
    await router.acompletion(model="primary", messages=MSG)  # probe fails, retry served by b
    assert sim.count("a") == 1
    assert router.breakers()["a"]["state"] == "open"


async def test_flapping_deployment_served_by_fallback_then_back_on_primary(make_router: RouterFactory, sim):
    from llm_resilience_plugin.testing import Clock

    reset_timeout = 0.3
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"breaker": {"fail_max": 2, "reset_timeout": reset_timeout}},
        clock=Clock(),
    )
    sim.outage("a", 0.6, Fault.server_error(503))
    outage_end = time.monotonic() + 0.6
    served = []
    while time.monotonic() < outage_end:
        resp = await router.acompletion(model="primary", messages=MSG)
        served.append(get_report(resp).served_group)  # type: ignore[union-attr]
        await asyncio.sleep(0.02)
    assert set(served) == {"backup"}
    recovered_at = time.monotonic()
    while True:
        resp = await router.acompletion(model="primary", messages=MSG)
        if get_report(resp).served_group == "primary":  # type: ignore[union-attr]
            break
        await asyncio.sleep(0.02)
        assert time.monotonic() - recovered_at < reset_timeout + 0.3
    assert router.breakers()["a"]["state"] == "closed"


# -- retry budget ---------------------------------------------------------------------------------


async def test_retry_budget_bounds_amplification(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a"]},
        policy={
            "breaker": {"enabled": False},
            "retry_budget": {"capacity": 10, "min_fraction": 0.5, "refund_per_success": 0.1},
        },
    )
    sim.set_default("a", Fault.server_error(500))
    for _ in range(50):
        with pytest.raises(AllRoutesFailedError):
            await router.acompletion(model="primary", messages=MSG)
    # Without a budget: 150 requests. With it, retries stop once tokens fall below 5.
    assert 50 <= sim.count("a") <= 56


# -- pass-through, events, hook lifecycle ---------------------------------------------------------


async def test_tools_and_params_pass_through(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a"]})
    tools = [
        {
            "type": "function",
            "function": {
                "name": "magic_function",
                "description": "Apply a magic function",
                "parameters": {
                    "type": "object",
                    "properties": {"input": {"type": "integer"}},
                    "required": ["input"],
                },
            },
        }
    ]
    resp = await router.acompletion(
        model="primary",
        messages=[{"role": "user", "content": "What is magic_function(3)? Use the tool."}],
        tools=tools,
        tool_choice="required",
        max_tokens=50,
        temperature=0,
    )
    call = resp.choices[0].message.tool_calls[0]
    assert call.function.name == "magic_function"
    assert call.function.arguments.replace(" ", "") == '{"input":3}'
    body = sim.requests("a")[0].body
    assert body["max_tokens"] == 50 and body["tool_choice"] == "required"
    assert "_llm_resilience_attempt" not in str(body)  # plugin metadata never reaches the provider


async def test_default_fallbacks_apply_to_every_group(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a"], "safety-net": ["b"]}, default_fallbacks=["safety-net"])
    sim.set_default("a", Fault.auth())
    resp = await router.acompletion(model="primary", messages=MSG)
    assert get_report(resp).served_group == "safety-net"  # type: ignore[union-attr]


async def test_per_call_listener_sees_the_whole_story(make_router: RouterFactory, sim):
    from llm_resilience_plugin.events import CallReport, FallbackTaken, RetryScheduled

    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    sim.set_default("a", Fault.server_error(500))
    seen: list[object] = []
    await router.acompletion(model="primary", messages=MSG, listener=seen.append)
    kinds = [type(e).__name__ for e in seen]
    assert kinds == [
        "AttemptRecord",
        "RetryScheduled",
        "AttemptRecord",
        "RetryScheduled",
        "AttemptRecord",
        "FallbackTaken",
        "AttemptRecord",
        "CallReport",
    ]
    retries = [e for e in seen if isinstance(e, RetryScheduled)]
    assert [r.retry_number for r in retries] == [1, 2]
    fb = next(e for e in seen if isinstance(e, FallbackTaken))
    assert (fb.from_group, fb.to_group, fb.reason) == ("primary", "backup", ErrorClass.SERVER)
    report = seen[-1]
    assert isinstance(report, CallReport)
    assert "sk-sim-secret" not in str(report.to_dict())


async def test_attempt_records_are_the_same_with_or_without_a_listener(make_router: RouterFactory, sim):
    """Without a listener the router keeps each attempt as field values and builds its record on
    first read; what the report shows must not depend on that."""
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"breaker": {"fail_max": 100}, "retry_budget": {"enabled": False}},
    )

    async def attempts(listen: bool) -> list[AttemptRecord]:
        sim.reset()
        sim.script("a", Fault.server_error(500), Fault.server_error(503), Fault.server_error(500))
        seen: list[object] = []
        resp = await router.acompletion(
            model="primary", messages=MSG, listener=seen.append if listen else None
        )
        rep = get_report(resp)
        assert rep is not None
        if listen:  # the listener got the very records the report holds
            heard = [e for e in seen if isinstance(e, AttemptRecord)]
            assert len(heard) == len(rep.attempts)
            assert all(x is y for x, y in zip(rep.attempts, heard, strict=True))
        assert rep.upstream_requests == 4 and rep.retries == 3
        assert rep.attempts is rep.attempts  # built once
        return rep.attempts

    def shape(a: AttemptRecord) -> tuple[object, ...]:
        return (
            a.attempt,
            a.model_group,
            a.deployment_id,
            a.fallback_level,
            a.outcome,
            a.error_class,
            a.status,
            a.breaker_state,
            a.probe,
            a.ttft_s,
        )

    quiet, heard = await attempts(False), await attempts(True)
    assert [shape(a) for a in quiet] == [shape(a) for a in heard]
    assert [shape(a) for a in quiet] == [
        (1, "primary", "a", 0, "failure", ErrorClass.SERVER, 500, "closed", False, None),
        (2, "primary", "a", 0, "failure", ErrorClass.SERVER, 503, "closed", False, None),
        (3, "primary", "a", 0, "failure", ErrorClass.SERVER, 500, "closed", False, None),
        (4, "backup", "b", 1, "success", None, None, "closed", False, None),
    ]
    assert all(isinstance(a, AttemptRecord) and a.latency_s > 0 and a.started_at > 0 for a in quiet)
    assert "attempts=[AttemptRecord(" in repr(
        get_report(await router.acompletion(model="backup", messages=MSG))
    )


async def test_before_retry_hook_is_awaited_before_each_sleep(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a"]})
    sim.script("a", Fault.server_error(500), Fault.rate_limit())
    states = []

    async def hook(rs) -> None:
        states.append((rs.attempt_number, rs.upcoming_sleep))

    await router.acompletion(model="primary", messages=MSG, before_retry=hook)
    assert [n for n, _ in states] == [1, 2]
    assert sim.count("a") == 3


async def test_hooks_are_registered_only_while_an_attempt_needs_them(make_router: RouterFactory, sim):
    """A healthy call registers neither LiteLLM hook (LiteLLM does more work per request while one
    is registered, for every Router in the process); a retry holds both, and lets them go."""
    from llm_resilience_plugin.routing import _hooks as module

    def registered() -> tuple[bool, bool]:
        return (
            any(cb is module.PICK.hook for cb in litellm.input_callback),
            any(cb is module.FILTER.hook for cb in litellm.callbacks),
        )

    router = make_router({"primary": ["a", "b"]}, policy={"dispatch": "router"})  # the Router's hooks
    seen: list[tuple[bool, bool]] = []
    router.subscribe(lambda e: seen.append(registered()) if isinstance(e, AttemptRecord) else None)
    resp = await router.acompletion(model="primary", messages=MSG)
    assert registered() == (False, False) and module.PICK.users == module.FILTER.users == 0
    # The fast path still knows which deployment answered, from LiteLLM's own metadata.
    assert get_report(resp).attempts[0].deployment_id in {"a", "b"}  # type: ignore[union-attr]

    sim.script("a", Fault.server_error(500))
    sim.script("b", Fault.server_error(500))
    await router.acompletion(model="primary", messages=MSG)
    assert (True, True) in seen  # the retry's attempt held both while it ran
    assert registered() == (False, False) and module.PICK.users == module.FILTER.users == 0
    router.close()
    router.close()  # idempotent
    plain = litellm.Router(
        model_list=[
            {
                "model_name": "p",
                "litellm_params": {
                    "model": "openai/gpt-4o-mini",
                    "api_base": sim.api_base("z"),
                    "api_key": "k",
                },
            }
        ],
        num_retries=0,
    )
    resp = await plain.acompletion(model="p", messages=MSG)
    assert resp.choices[0].message.content


async def test_fast_path_failures_count_against_the_deployment_that_failed(make_router: RouterFactory, sim):
    """Without the pick hook, a failure is still charged to the deployment LiteLLM chose (read back
    from the request metadata): a dead deployment's breaker opens, the healthy one stays closed."""
    router = make_router({"primary": ["a", "b"]}, policy={"breaker": {"fail_max": 2}})
    sim.set_default("a", Fault.server_error(500))
    for _ in range(12):
        await router.acompletion(model="primary", messages=MSG)
    states = router.breakers()
    assert states["a"]["state"] == "open" and states["b"]["state"] == "closed"
    assert states["b"]["fail_counter"] == 0


async def test_giving_up_because_the_next_wait_does_not_fit_is_a_deadline_error(
    make_router: RouterFactory, sim
):
    from llm_resilience_plugin import DeadlineExceededError

    router = make_router(
        {"primary": ["a"]}, policy={"deadline": 2, "backoff": {"initial": 10, "maximum": 10}}
    )
    sim.set_default("a", Fault.server_error(503))
    with pytest.raises(DeadlineExceededError):
        await router.acompletion(model="primary", messages=MSG)


async def test_stream_report_carries_the_streamed_cost(sim):
    from llm_resilience_plugin import ResilientRouter
    from tests.conftest import deployment

    dep = deployment(sim, "primary", "a", input_cost_per_token=1e-6, output_cost_per_token=2e-6)
    router = ResilientRouter(model_list=[dep])
    stream = await router.acompletion(model="primary", messages=MSG, stream=True)
    async for _ in stream:
        pass
    assert stream.report.response_cost and stream.report.response_cost > 0
    router.close()


async def test_long_retry_after_fails_over_when_a_fallback_exists(make_router: RouterFactory, sim):
    clock = FakeClock()
    router = make_router(
        {"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}], clock=clock
    )
    sim.script("a", Fault.rate_limit(retry_after=8))  # longer than backoff.max_wait_with_fallback (3 s)
    resp = await router.acompletion(model="primary", messages=MSG)
    assert get_report(resp).served_group == "backup"  # type: ignore[union-attr]
    assert not any(clock.slept) and (sim.count("a"), sim.count("b")) == (1, 1)
    # Configured to always wait: the same 429 is waited out on the preferred group.
    waiting = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"backoff": {"max_wait_with_fallback": None}},
        clock=clock,
    )
    sim.clear_log()
    sim.script("a", Fault.rate_limit(retry_after=2))
    resp = await waiting.acompletion(model="primary", messages=MSG)
    assert get_report(resp).served_group == "primary"  # type: ignore[union-attr]
    assert clock.slept and clock.slept[-1] >= 1.9


async def test_the_rest_of_a_deadline_reaches_litellm_as_a_coarse_timeout(make_router: RouterFactory, sim):
    """LiteLLM caches an HTTP client per timeout value; the rest of a deadline differs on every
    call, so it is rounded up (the watchdog holds the exact bound) and the clients are reused."""
    router = make_router({"primary": ["a"]}, policy={"deadline": 10, "attempt_timeout": 30})
    inner = router.litellm_router
    seen: list[object] = []
    original = inner.acompletion

    async def spy(*args, **kwargs):
        seen.append(kwargs.get("timeout"))
        return await original(*args, **kwargs)

    inner.acompletion = spy  # type: ignore[method-assign]
    for _ in range(5):
        await router.acompletion(model="primary", messages=MSG)
    reads = {getattr(t, "read", t) for t in seen}
    assert reads == {10.0}  # 9.99... s left each time, sent as 10 s
    assert len({id(t) for t in seen}) == 1  # one timeout object, one cached LiteLLM client


async def test_a_short_retry_after_is_waited_out_on_the_group_asked_for(make_router: RouterFactory, sim):
    """A fallback is a degradation: a 2 s Retry-After that fits the deadline keeps the call on
    the model the caller asked for (the default bound is 3 s)."""
    clock = FakeClock()
    router = make_router(
        {"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}], clock=clock
    )
    sim.script("a", Fault.rate_limit(retry_after=2))
    resp = await router.acompletion(model="primary", messages=MSG)
    assert get_report(resp).served_group == "primary"  # type: ignore[union-attr]
    assert clock.slept and clock.slept[-1] >= 1.9 and sim.count("b") == 0


async def test_a_short_retry_after_prefers_a_free_deployment_of_the_same_group(
    make_router: RouterFactory, sim
):
    clock = FakeClock()
    router = make_router(
        {"primary": ["a", "c"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}], clock=clock
    )
    sim.set_default("a", Fault.rate_limit(retry_after=2))
    sim.set_default("c", Fault.rate_limit(retry_after=2))
    sim.script("c", Fault.ok())  # c answers its first request
    sim.script("a", Fault.rate_limit(retry_after=2))
    for _ in range(4):
        resp = await router.acompletion(model="primary", messages=MSG)
        assert get_report(resp).served_group == "primary"  # type: ignore[union-attr]
        sim.script("c", Fault.ok())
    assert sim.count("b") == 0


async def test_a_long_silence_then_a_drop_is_not_retried_on_the_same_deployment(
    make_router: RouterFactory, sim
):
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"attempt_timeout": 0.6},
    )
    sim.set_default("a", Fault.silence(max_hold=0.4))  # holds 0.4 s (over half the timeout), then drops
    resp = await router.acompletion(model="primary", messages=MSG)
    report = get_report(resp)
    assert report is not None and report.served_group == "backup"
    assert sim.count("a") == 1  # a connection error, but after a long silence: not retried there
