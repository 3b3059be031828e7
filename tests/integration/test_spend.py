"""Spend is never silently dropped, over real HTTP to the simulator: an attempt that may have
been billed without an answer (a timeout or a dropped connection after sending, a call cancelled
in flight, a stream cut or closed after content) settles the usage known, else its estimate; an
HTTP error answer still costs nothing; a reservation that outlives its TTL becomes spend, not
headroom; a TTL shorter than a deadline is refused; a provider that bills past ``max_tokens``
raises a ``budget_overrun`` alert."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from llm_resilience_plugin import BudgetExceededError, ConfigError, ResilientRouter, get_report
from llm_resilience_plugin.cost import Budget, BudgetAlert, CostGuard
from llm_resilience_plugin.errors import ErrorClass
from llm_resilience_plugin.events import hidden_params_of
from llm_resilience_plugin.testing import Clock
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator, estimate_prompt_tokens
from tests.conftest import MSG, RouterFactory

IN, OUT = 1.5e-7, 6e-7  # gpt-4o-mini in LiteLLM's bundled price map
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                "required": ["city", "unit"],
            },
        },
    }
]


def sim_counter(model: str, messages: list[dict[str, Any]]) -> int:
    """Count prompt tokens exactly as the simulator bills them (estimate == actual)."""
    return estimate_prompt_tokens(messages)


def daily(guard: CostGuard) -> tuple[float, float]:
    (u,) = [b for b in guard.report().budgets if b.budget == "daily"]
    return u.spent, u.reserved


def estimate_of(guard: CostGuard, router: ResilientRouter, group: str = "primary", **kwargs: Any) -> float:
    """What the guard reserves for one attempt of MSG on ``group``."""
    cands = guard.candidates_for_deployments(router.deployments(group))
    return guard.estimate(cands, messages=MSG, **kwargs)[0]


# -- 1. billable without an answer: the estimate; an answer or nothing sent: released ------------


async def test_a_timeout_after_sending_settles_the_estimate_not_a_release(
    make_router: RouterFactory, sim: ProviderSimulator
):
    guard = CostGuard([Budget.daily(1.0)])
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        clock=Clock(),
        guards=[guard],
    )
    sim.set_default("a", Fault.silence(max_hold=5))
    resp = await router.acompletion(model="primary", messages=MSG, max_tokens=5, attempt_timeout=0.3)
    rep = get_report(resp)
    assert rep is not None and rep.served_group == "backup"
    assert rep.attempts[0].error_class is ErrorClass.TIMEOUT
    timed_out = [e for e in guard.ledger.entries() if e.deployment_id == "a"]
    assert len(timed_out) == sim.count("a") >= 1  # every request sent to "a" is paid for
    assert all(e.estimated and not e.reaped for e in timed_out)
    assert all(e.cost == pytest.approx(estimate_of(guard, router, max_tokens=5), abs=1e-9) for e in timed_out)
    spent, reserved = daily(guard)
    assert reserved == 0
    assert spent == pytest.approx(sum(e.cost for e in guard.ledger.entries()), abs=1e-9)


async def test_a_connection_dropped_after_sending_settles_the_estimate(
    make_router: RouterFactory, sim: ProviderSimulator
):
    guard = CostGuard([Budget.daily(1.0)])
    router = make_router({"primary": ["a"]}, guards=[guard])
    sim.script("a", Fault.reset())  # RST after reading the request, then answers
    resp = await router.acompletion(model="primary", messages=MSG, max_tokens=5)
    assert sim.count("a") == 2
    dropped, served = guard.ledger.entries()
    assert dropped.estimated and dropped.cost == pytest.approx(estimate_of(guard, router, max_tokens=5))
    assert not served.estimated
    assert served.cost == pytest.approx(hidden_params_of(resp)["response_cost"], abs=1e-9)
    assert daily(guard) == (pytest.approx(dropped.cost + served.cost, abs=1e-9), 0)


async def test_an_http_error_answer_still_costs_nothing(make_router: RouterFactory, sim: ProviderSimulator):
    guard = CostGuard([Budget.daily(1.0)])
    router = make_router({"primary": ["a"]}, guards=[guard])
    sim.set_default("a", Fault.context_length(limit=1))  # a 400: answered, not billed, not retried
    with pytest.raises(Exception):  # noqa: B017 - the router's error type is not the point here
        await router.acompletion(model="primary", messages=MSG, max_tokens=5)
    assert sim.count("a") == 1
    assert guard.ledger.entries() == [] and daily(guard) == (0, 0)


@pytest.mark.parametrize("on_cancel", ["estimate", "release"])
async def test_a_call_cancelled_in_flight_follows_on_cancel(
    make_router: RouterFactory, sim: ProviderSimulator, on_cancel: str
):
    guard = CostGuard([Budget.daily(1.0)], on_cancel=on_cancel)  # type: ignore[arg-type]
    router = make_router({"primary": ["a"]}, guards=[guard])
    sim.set_default("a", Fault.silence(max_hold=5))
    task = asyncio.create_task(router.acompletion(model="primary", messages=MSG, max_tokens=5))
    for _ in range(500):  # until the request has reached the provider
        if sim.count("a"):
            break
        await asyncio.sleep(0.01)
    assert sim.count("a") == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    spent, reserved = daily(guard)
    assert reserved == 0
    if on_cancel == "estimate":
        (entry,) = guard.ledger.entries()
        assert entry.estimated and entry.cost == pytest.approx(estimate_of(guard, router, max_tokens=5))
        assert spent == pytest.approx(entry.cost)
    else:  # nothing came back and nothing reached the caller: trusted to cost nothing
        assert guard.ledger.entries() == [] and spent == 0


async def test_on_cancel_release_never_releases_a_stream_that_produced_content(
    make_router: RouterFactory, sim: ProviderSimulator
):
    from llm_resilience_plugin import StreamInterruptedError

    guard = CostGuard([Budget.daily(1.0)], on_cancel="release")
    router = make_router({"primary": ["a"]}, guards=[guard])
    # closed by the caller after reading content
    stream = await router.acompletion(model="primary", messages=MSG, stream=True, max_tokens=50)
    it = stream.__aiter__()
    await it.__anext__()
    assert stream.partial_text
    await stream.aclose()
    # cut by the provider after content
    sim.set_default("a", Fault.stream_cut(after_chunks=3))
    cut = await router.acompletion(
        model="primary", messages=MSG, stream=True, max_tokens=50, recover_streams=False
    )
    with pytest.raises(StreamInterruptedError):
        async for _ in cut:
            pass
    closed, broken = guard.ledger.entries()
    est = estimate_of(guard, router, max_tokens=50)
    assert closed.estimated and closed.cost == pytest.approx(est)
    assert broken.estimated and broken.cost == pytest.approx(est)
    assert daily(guard) == (pytest.approx(2 * est), 0)


# -- 2/3. a reservation that outlives its TTL is spend, and a TTL shorter than a deadline is refused ---


async def test_calls_outliving_the_ttl_keep_their_budget_held_so_none_slips_through(
    make_router: RouterFactory, sim: ProviderSimulator
):
    guard_clock = [1_000_000.0]
    probe = CostGuard([Budget.daily(1.0)], token_counter=sim_counter, prompt_margin=0)
    router = make_router({"primary": ["a"]}, guards=[probe])
    one = estimate_of(probe, router, max_tokens=5)
    guard = CostGuard(
        [Budget.daily(2 * one + 1e-9)],  # room for two calls
        token_counter=sim_counter,
        prompt_margin=0,
        now=lambda: guard_clock[0],
        reservation_ttl=10,  # = the router's deadline: accepted
    )
    router = make_router({"primary": ["a"]}, guards=[guard])
    sim.set_default("a", Fault.ok(latency=0.5))
    slow = [
        asyncio.create_task(router.acompletion(model="primary", messages=MSG, max_tokens=5)) for _ in range(2)
    ]
    for _ in range(500):
        if sim.count("a") == 2:
            break
        await asyncio.sleep(0.01)
    guard_clock[0] += 11  # both still in flight when their reservations expire (a stalled clock, say)
    for _ in range(2):  # before: the expired reservations were released and both of these went through
        with pytest.raises(BudgetExceededError):
            await router.acompletion(model="primary", messages=MSG, max_tokens=5)
    assert (await asyncio.gather(*slow))[0] is not None
    assert sim.count("a") == 2
    entries = guard.ledger.entries()  # the late settles replaced the reaped estimates
    assert len(entries) == 2 and not any(e.reaped or e.estimated for e in entries)
    spent, reserved = daily(guard)
    assert reserved == 0 and spent == pytest.approx(2 * one, abs=1e-9) and spent <= 2 * one + 1e-9


def test_a_reservation_ttl_shorter_than_a_deadline_is_refused_naming_both(make_router: RouterFactory):
    with pytest.raises(ConfigError) as ei:  # FAST_POLICY: a 10 s deadline
        make_router({"primary": ["a"]}, guards=[CostGuard([Budget.daily(1.0)], reservation_ttl=1)])
    err = ei.value
    assert err.field == "reservation_ttl"
    assert "reservation_ttl=1 s" in str(err) and "(10 s, group 'primary')" in str(err)
    with pytest.raises(ConfigError, match=r"reservation_ttl=20 s .* \(25 s, group 'backup'\)"):
        make_router(
            {"primary": ["a"], "backup": ["b"]},
            policy={"groups": {"backup": {"deadline": 25}}},
            guards=[CostGuard([Budget.daily(1.0)], reservation_ttl=20)],
        )
    with pytest.raises(ConfigError, match=r"reservation_ttl=20 s .* \(30 s, tier 'P0'\)"):
        make_router(
            {"primary": ["a"]},
            policy={"tiers": {"P0": {"deadline": 30}, "P3": {"deadline": 5}}},
            guards=[CostGuard([Budget.daily(1.0)], reservation_ttl=20)],
        )
    router = make_router({"primary": ["a"]}, guards=[CostGuard([Budget.daily(1.0)], reservation_ttl=10)])
    with pytest.raises(ConfigError, match="reservation_ttl=5 s"):  # a guard built for a router
        CostGuard([Budget.daily(1.0)], reservation_ttl=5, router=router)


# -- 4. billed past max_tokens: recorded as billed, and alerted ------------------------------------


async def test_a_provider_billing_past_max_tokens_raises_one_budget_overrun_alert(
    make_router: RouterFactory, sim: ProviderSimulator, caplog: pytest.LogCaptureFixture
):
    alerts: list[BudgetAlert] = []
    guard = CostGuard([Budget.daily(1.0)], on_alert=alerts.append)
    router = make_router({"primary": ["a"]}, guards=[guard])
    caplog.set_level(logging.WARNING, logger="llm_resilience.cost")
    await router.acompletion(model="primary", messages=MSG, max_tokens=5)  # within its limit
    assert alerts == []
    # The simulator does not cut a tool call at max_tokens: it bills the whole call.
    ask = [{"role": "user", "content": "What is the weather in 'Paris' in 'celsius'?"}]
    resp = await router.acompletion(model="primary", messages=ask, tools=TOOLS, max_tokens=2)
    billed = resp.usage.completion_tokens
    assert billed > 2
    entry = guard.ledger.entries()[-1]  # recorded truthfully: what was billed
    assert entry.completion_tokens == billed and not entry.estimated
    assert entry.cost == pytest.approx(resp.usage.prompt_tokens * IN + billed * OUT, abs=1e-9)
    (alert,) = alerts
    assert alert.kind == "budget_overrun"
    assert (alert.deployment_id, alert.max_tokens, alert.completion_tokens) == ("a", 2, billed)
    assert alert.cost == pytest.approx(entry.cost) and alert.estimate is not None
    assert alert.budget == "daily" and alert.spent == pytest.approx(daily(guard)[0])
    logged = [r for r in caplog.records if getattr(r, "llm_event_name", None) == "budget_overrun"]
    assert len(logged) == 1
    assert logged[0].llm_event["deployment_id"] == "a"  # type: ignore[attr-defined]
    assert logged[0].llm_event["completion_tokens"] == billed  # type: ignore[attr-defined]
    assert not [r for r in caplog.records if getattr(r, "llm_event_name", None) == "budget_alert"]
