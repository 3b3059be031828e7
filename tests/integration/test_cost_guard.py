"""CostGuard through ResilientRouter(guards=[guard]) over real HTTP to the simulator: reserve
before every attempt, refuse before any request, settle to the actual cost, budget-aware
failover, pricing rules and configuration errors."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from llm_resilience_plugin import BudgetExceededError, ConfigError, ResilientRouter, get_report
from llm_resilience_plugin.cost._guard import Budget, BudgetAlert, CostGuard, Price
from llm_resilience_plugin.cost._ledger import MemoryLedger
from llm_resilience_plugin.events import hidden_params_of
from llm_resilience_plugin.testing import FakeClock
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator, estimate_prompt_tokens
from tests.conftest import FAST_POLICY, MSG, RouterFactory, deployment

IN, OUT = 1.5e-7, 6e-7  # gpt-4o-mini in LiteLLM's bundled price map


def sim_counter(model: str, messages: list[dict[str, Any]]) -> int:
    """Count prompt tokens exactly as the simulator bills them (estimate == actual)."""
    return estimate_prompt_tokens(messages)


PricedFactory = Callable[..., ResilientRouter]


@pytest.fixture
def priced_router(sim: ProviderSimulator) -> Iterator[PricedFactory]:
    """priced_router({"primary": [("a", {"input_cost_per_token": 1e-3, ...})]}, guards=[...])"""
    made: list[ResilientRouter] = []

    def make(groups: dict[str, list[tuple[str, dict[str, Any]]]], **kwargs: Any) -> ResilientRouter:
        model_list = [deployment(sim, g, d, **params) for g, deps in groups.items() for d, params in deps]
        r = ResilientRouter(model_list=model_list, policy=FAST_POLICY, clock=FakeClock(), seed=7, **kwargs)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def daily_usage(guard: CostGuard) -> tuple[float, float]:
    (u,) = [b for b in guard.report().budgets if b.budget == "daily"]
    return u.spent, u.reserved


# -- the acceptance test: 500 concurrent calls under a daily budget -------------------------------


async def test_500_concurrent_calls_never_overspend_and_refusals_send_nothing(
    make_router: RouterFactory, sim: ProviderSimulator, tmp_path
):
    rng = random.Random(42)
    words = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega budget ledger".split()
    prompts = [
        [
            {
                "role": "user",
                "content": f"{i} " + " ".join(rng.choice(words) for _ in range(rng.randint(1, 300))),
            }
        ]
        for i in range(500)
    ]
    # max_tokens=4 < the simulator's reply length, so every answer has exactly 4 completion tokens
    cost = [estimate_prompt_tokens(p) * IN + 4 * OUT for p in prompts]
    limit = round(0.4 * sum(cost), 6)
    guard = CostGuard(
        [Budget.daily(limit)],
        ledger=f"sqlite:///{tmp_path / 'spend.db'}",
        token_counter=sim_counter,
        prompt_margin=0.0,
    )
    router = make_router({"primary": ["a", "b"]}, guards=[guard])

    async def one(i: int) -> Any:
        try:
            return await router.acompletion(model="primary", messages=prompts[i], max_tokens=4)
        except BudgetExceededError as e:
            return e

    results = await asyncio.gather(*(one(i) for i in range(500)))
    ok = [i for i, r in enumerate(results) if not isinstance(r, BaseException)]
    refused = [i for i, r in enumerate(results) if isinstance(r, BudgetExceededError)]
    assert len(ok) + len(refused) == 500  # nothing failed any other way
    assert 100 < len(ok) < 400  # the budget really binds
    assert sim.count() == len(ok)  # refusals sent no HTTP request
    for i in ok:
        assert results[i].usage.prompt_tokens == estimate_prompt_tokens(prompts[i])
        assert results[i].usage.completion_tokens == 4
    spent, reserved = daily_usage(guard)
    assert reserved == 0
    assert spent <= limit
    assert spent == pytest.approx(sum(cost[i] for i in ok), abs=1e-9 * 500)
    # exactly the calls that fit succeeded: nothing was released, so every refused call
    # would still not fit on top of the final spend
    for i in refused:
        assert spent + cost[i] > limit - 1e-9
        err = results[i]
        assert err.budget.startswith("daily ") and err.limit == limit
        assert err.spent + err.reservation > err.limit
    rep = guard.report()
    assert rep.calls == len(ok)
    assert rep.by_deployment.keys() <= {"a", "b"}
    guard.close()


# -- reserve / settle / release through the attempt loop -----------------------------------------


async def test_retry_reserves_per_attempt_releases_the_failure_settles_the_success(
    make_router: RouterFactory, sim: ProviderSimulator
):
    guard = CostGuard([Budget.daily(1.0)])
    router = make_router({"primary": ["a"]}, guards=[guard])
    sim.script("a", Fault.server_error(500))
    resp = await router.acompletion(model="primary", messages=MSG, max_tokens=5)
    assert sim.count("a") == 2
    spent, reserved = daily_usage(guard)
    assert reserved == 0
    assert spent == pytest.approx(hidden_params_of(resp)["response_cost"], abs=1e-9)
    assert spent == pytest.approx(
        resp.usage.prompt_tokens * IN + resp.usage.completion_tokens * OUT, abs=1e-9
    )
    rep = guard.report()
    assert rep.calls == 1 and rep.by_deployment == {"a": pytest.approx(spent, abs=1e-9)}
    info = guard.call_info(get_report(resp).call_id)
    assert info is not None and info["cost"] == pytest.approx(spent, abs=1e-9)
    assert info["estimate"] > spent  # two reservations were made


async def test_stream_settles_from_usage_and_an_early_close_settles_the_estimate(
    make_router: RouterFactory, sim: ProviderSimulator
):
    guard = CostGuard([Budget.daily(1.0)])
    router = make_router({"primary": ["a"]}, guards=[guard])
    stream = await router.acompletion(model="primary", messages=MSG, stream=True, max_tokens=50)
    async for _ in stream:
        pass
    usage = stream.usage
    assert usage is not None
    spent, reserved = daily_usage(guard)
    assert reserved == 0
    assert spent == pytest.approx(usage["prompt_tokens"] * IN + usage["completion_tokens"] * OUT, abs=1e-9)
    (entry,) = guard.ledger.entries()
    assert not entry.estimated and entry.deployment_id == "a"

    # closed after the first chunk: no usage is known, the provider still generated -> estimate
    stream2 = await router.acompletion(model="primary", messages=MSG, stream=True, max_tokens=50)
    it = stream2.__aiter__()
    await it.__anext__()
    await stream2.aclose()
    info = guard.call_info(stream2.report.call_id)
    assert info is not None
    entries = guard.ledger.entries()
    assert entries[-1].estimated and entries[-1].cost == pytest.approx(info["estimate"])
    spent2, reserved2 = daily_usage(guard)
    assert reserved2 == 0 and spent2 == pytest.approx(spent + info["estimate"], abs=1e-9)


async def test_stream_cut_after_content_settles_the_estimate(
    make_router: RouterFactory, sim: ProviderSimulator
):
    from llm_resilience_plugin import StreamInterruptedError

    guard = CostGuard([Budget.daily(1.0)])
    router = make_router({"primary": ["a"]}, guards=[guard])
    sim.set_default("a", Fault.stream_cut(after_chunks=3))
    stream = await router.acompletion(
        model="primary", messages=MSG, stream=True, max_tokens=50, recover_streams=False
    )
    with pytest.raises(StreamInterruptedError):
        async for _ in stream:
            pass
    info = guard.call_info(stream.report.call_id)
    assert info is not None
    (entry,) = guard.ledger.entries()  # content was generated: spend is recorded, not released
    assert entry.estimated and entry.cost == pytest.approx(info["estimate"])
    spent, reserved = daily_usage(guard)
    assert reserved == 0 and spent == pytest.approx(info["estimate"], abs=1e-9)


async def test_per_request_budget_refuses_before_sending_and_names_everything(
    make_router: RouterFactory, sim: ProviderSimulator
):
    guard = CostGuard([Budget.per_request(0.001), Budget.daily(10)])
    router = make_router({"primary": ["a"]}, guards=[guard])
    with pytest.raises(BudgetExceededError) as ei:
        await router.acompletion(model="primary", messages=MSG, max_tokens=10_000)
    assert sim.count() == 0
    err = ei.value
    assert err.budget == "per_request" and err.limit == 0.001 and err.spent == 0
    assert err.reservation == pytest.approx(10_000 * OUT, rel=0.01)
    assert "per_request" in str(err) and "0.001000" in str(err) and "0.006" in str(err)
    # a request that fits goes through
    await router.acompletion(model="primary", messages=MSG, max_tokens=100)
    assert sim.count() == 1
    assert daily_usage(guard)[1] == 0


async def test_scoped_budgets_apply_per_tenant_from_metadata_or_tags(
    make_router: RouterFactory, sim: ProviderSimulator
):
    guard = CostGuard([Budget.scoped("tenant", 0.00002)], token_counter=sim_counter, prompt_margin=0)
    router = make_router({"primary": ["a"]}, guards=[guard])
    acme = {"tenant": "acme"}
    n_ok = 0
    with pytest.raises(BudgetExceededError) as ei:
        for _ in range(20):
            await router.acompletion(model="primary", messages=MSG, max_tokens=5, metadata=acme)
            n_ok += 1
    assert ei.value.budget == "tenant/day[tenant=acme] " + guard.calendar.windows(guard.now())[0]
    assert sim.count() == n_ok >= 1
    # another tenant (as a LiteLLM metadata tag) has its own limit; calls without a tenant are free
    await router.acompletion(model="primary", messages=MSG, max_tokens=5, metadata={"tags": ["tenant:bob"]})
    await router.acompletion(model="primary", messages=MSG, max_tokens=5)
    by_scope = guard.report().by_scope
    assert set(by_scope) == {"tenant=acme", "tenant=bob"}
    assert {b.scope for b in guard.report().budgets} == {"tenant=acme", "tenant=bob"}


async def test_per_run_budget_groups_router_calls_by_metadata_run_id(
    make_router: RouterFactory, sim: ProviderSimulator
):
    one = estimate_prompt_tokens(MSG) * IN + 5 * OUT
    guard = CostGuard([Budget.per_run(2.5 * one)], token_counter=sim_counter, prompt_margin=0)
    router = make_router({"primary": ["a"]}, guards=[guard])
    for _ in range(2):
        await router.acompletion(model="primary", messages=MSG, max_tokens=5, metadata={"run_id": "r1"})
    with pytest.raises(BudgetExceededError) as ei:
        await router.acompletion(model="primary", messages=MSG, max_tokens=5, metadata={"run_id": "r1"})
    assert ei.value.budget == "per_run[run=r1]"
    await router.acompletion(model="primary", messages=MSG, max_tokens=5, metadata={"run_id": "r2"})
    assert sim.count() == 3


# -- budget-aware routing ---------------------------------------------------------------------------


async def test_refused_group_fails_over_to_a_cheaper_group_that_fits(
    priced_router: PricedFactory, sim: ProviderSimulator
):
    guard = CostGuard([Budget.per_request(0.01)])
    router = priced_router(
        {
            "primary": [("a", {"input_cost_per_token": 1e-3, "output_cost_per_token": 1e-3})],
            "backup": [("b", {})],
        },
        fallbacks=[{"primary": ["backup"]}],
        guards=[guard],
    )
    resp = await router.acompletion(model="primary", messages=MSG, max_tokens=20)
    rep = get_report(resp)
    assert rep.served_group == "backup" and rep.fallback_level == 1
    assert rep.attempts[0].error_class == "budget"
    assert sim.count("a") == 0 and sim.count("b") == 1
    # nothing fits: the budget error is kept and nothing is sent
    with pytest.raises(BudgetExceededError):
        await router.acompletion(model="primary", messages=MSG, max_tokens=100_000)
    assert sim.count() == 1


async def test_estimate_takes_the_most_expensive_admissible_deployment_and_settles_at_the_served_one(
    priced_router: PricedFactory, sim: ProviderSimulator
):
    guard = CostGuard([Budget.daily(1)], token_counter=lambda m, msgs: 100, prompt_margin=0)
    router = priced_router(
        {
            "primary": [
                ("cheap", {"input_cost_per_token": 1e-7, "output_cost_per_token": 2e-7}),
                ("pricey", {"input_cost_per_token": 1e-5, "output_cost_per_token": 3e-5}),
            ]
        },
        guards=[guard],
    )
    for _ in range(6):
        resp = await router.acompletion(model="primary", messages=MSG, max_tokens=10)
        rep = get_report(resp)
        info = guard.call_info(rep.call_id)
        assert info["estimate"] == pytest.approx(100 * 1e-5 + 10 * 3e-5)
        u = resp.usage
        price = {"cheap": (1e-7, 2e-7), "pricey": (1e-5, 3e-5)}[rep.deployment_id]
        assert info["cost"] == pytest.approx(
            u.prompt_tokens * price[0] + u.completion_tokens * price[1], abs=1e-12
        )


# -- pricing -------------------------------------------------------------------------------------------


def test_unknown_model_is_a_config_error_when_the_router_is_bound(priced_router: PricedFactory):
    router = priced_router({"primary": [("a", {"model": "openai/my-private-model"})]})
    with pytest.raises(ConfigError) as ei:
        CostGuard([Budget.daily(1)], router=router)
    assert ei.value.field == "unknown_model"
    assert "my-private-model" in str(ei.value) and "'a'" in str(ei.value)
    with pytest.raises(ConfigError):
        CostGuard([Budget.daily(1)], models=["openai/my-private-model"])
    CostGuard([Budget.daily(1)], router=router, unknown_model="zero")
    CostGuard([Budget.daily(1)], router=router, prices={"my-private-model": (1e-6, 2e-6)})


async def test_unbound_guard_refuses_an_unknown_model_before_sending(
    priced_router: PricedFactory, sim: ProviderSimulator
):
    guard = CostGuard([Budget.daily(1)])
    with pytest.raises(ConfigError, match="my-private-model"):
        # a router that binds its guards raises here; otherwise the first attempt does
        router = priced_router({"primary": [("a", {"model": "openai/my-private-model"})]}, guards=[guard])
        await router.acompletion(model="primary", messages=MSG, max_tokens=5)
    assert sim.count() == 0


async def test_unknown_model_policies_zero_and_fixed_price(
    priced_router: PricedFactory, sim: ProviderSimulator
):
    fixed = CostGuard([Budget.daily(1)], unknown_model=(1e-6, 2e-6))
    zero = CostGuard([Budget.daily(1)], unknown_model="zero")
    r1 = priced_router({"primary": [("a", {"model": "openai/my-private-model"})]}, guards=[zero])
    r2 = priced_router({"primary": [("a", {"model": "openai/my-private-model"})]}, guards=[fixed])
    await r1.acompletion(model="primary", messages=MSG, max_tokens=5)
    resp = await r2.acompletion(model="primary", messages=MSG, max_tokens=5)
    assert daily_usage(zero)[0] == 0.0
    u = resp.usage
    assert daily_usage(fixed)[0] == pytest.approx(
        u.prompt_tokens * 1e-6 + u.completion_tokens * 2e-6, abs=1e-12
    )


async def test_deployment_price_overrides_win_over_the_price_map(
    priced_router: PricedFactory, sim: ProviderSimulator
):
    guard = CostGuard([Budget.daily(1)])
    router = priced_router(
        {"primary": [("a", {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6})]}, guards=[guard]
    )
    resp = await router.acompletion(model="primary", messages=MSG, max_tokens=5)
    u = resp.usage
    assert daily_usage(guard)[0] == pytest.approx(
        u.prompt_tokens * 1e-6 + u.completion_tokens * 2e-6, abs=1e-12
    )
    p = guard.prices.for_deployment(router.deployments("primary")[0])
    assert (p.input_cost_per_token, p.output_cost_per_token, p.source) == (1e-6, 2e-6, "deployment")
    assert p.max_output_tokens == 16384  # the rest comes from the price map


def test_prices_come_from_the_bundled_map_offline():
    guard = CostGuard([Budget.daily(1)])
    p = guard.prices.for_model("openai/gpt-4o-mini")
    assert (p.input_cost_per_token, p.output_cost_per_token, p.source) == (IN, OUT, "litellm")
    assert guard.prices.for_model("gpt-4o-mini") == Price(IN, OUT, "litellm", 16384, "gpt-4o-mini")
    o = CostGuard([Budget.daily(1)], prices={"gpt-4o-mini": {"input_cost_per_token": 1e-6}})
    assert o.prices.for_model("openai/gpt-4o-mini").input_cost_per_token == 1e-6


async def test_output_bound_is_max_tokens_else_default_else_model_maximum(
    make_router: RouterFactory, sim: ProviderSimulator
):
    g1 = CostGuard([Budget.daily(1)], token_counter=lambda m, msgs: 10, prompt_margin=0)
    g2 = CostGuard(
        [Budget.daily(1)], token_counter=lambda m, msgs: 10, prompt_margin=0, default_max_tokens=100
    )
    r1 = make_router({"primary": ["a"]}, guards=[g1])
    r2 = make_router({"primary": ["a"]}, guards=[g2])
    resp1 = await r1.acompletion(model="primary", messages=MSG)
    resp2 = await r2.acompletion(model="primary", messages=MSG)
    resp3 = await r2.acompletion(model="primary", messages=MSG, max_tokens=7)
    assert g1.call_info(get_report(resp1).call_id)["estimate"] == pytest.approx(10 * IN + 16384 * OUT)
    assert g2.call_info(get_report(resp2).call_id)["estimate"] == pytest.approx(10 * IN + 100 * OUT)
    assert g2.call_info(get_report(resp3).call_id)["estimate"] == pytest.approx(10 * IN + 7 * OUT)


def test_prompt_tokens_are_counted_offline_with_litellm_plus_the_margin():
    import litellm

    guard = CostGuard([Budget.daily(1)])
    msgs = [{"role": "user", "content": "How much will this prompt cost me, roughly?"}]
    n = litellm.token_counter(model="openai/gpt-4o-mini", messages=msgs)
    amount, pt, out, _ = guard.estimate(
        [("x", "openai/gpt-4o-mini", guard.prices.for_model("openai/gpt-4o-mini"))],
        messages=msgs,
        max_tokens=3,
    )
    assert pt == -(-n * 11 // 10) and out == 3
    assert amount == pytest.approx(pt * IN + 3 * OUT)


# -- alerts ------------------------------------------------------------------------------------------


async def test_alert_fires_once_per_window_and_scope_as_log_and_callback(
    make_router: RouterFactory, sim: ProviderSimulator, caplog
):
    tz = ZoneInfo("Europe/Paris")
    clock = [datetime(2026, 3, 10, 12, 0, tzinfo=tz).timestamp()]
    alerts: list[BudgetAlert] = []
    one = estimate_prompt_tokens(MSG) * IN + 5 * OUT
    guard = CostGuard(
        # the per-request budget is 67 % used by every call: alerts are not for requests
        [Budget.daily(10 * one), Budget.scoped("tenant", 4 * one), Budget.per_request(1.5 * one)],
        alert_at=[0.5, 0.8],
        on_alert=alerts.append,
        timezone="Europe/Paris",
        now=lambda: clock[0],
        token_counter=sim_counter,
        prompt_margin=0,
    )
    router = make_router({"primary": ["a"]}, guards=[guard])
    caplog.set_level(logging.WARNING, logger="llm_resilience.cost")
    for tenant in ["acme"] * 4 + ["bob"] * 4:
        await router.acompletion(model="primary", messages=MSG, max_tokens=5, metadata={"tenant": tenant})
    fired = sorted((a.budget, a.scope, a.threshold) for a in alerts)
    assert fired == [
        ("daily", None, 0.5),
        ("daily", None, 0.8),
        ("tenant/day", "tenant=acme", 0.5),
        ("tenant/day", "tenant=acme", 0.8),
        ("tenant/day", "tenant=bob", 0.5),
        ("tenant/day", "tenant=bob", 0.8),
    ]
    logged = [r for r in caplog.records if getattr(r, "llm_event_name", None) == "budget_alert"]
    assert len(logged) == 6 and all(r.llm_event["window"] == "2026-03-10" for r in logged)
    # next day in Paris: a new window, the alerts can fire again - once
    clock[0] = datetime(2026, 3, 11, 0, 30, tzinfo=tz).timestamp()
    alerts.clear()
    for _ in range(3):
        await router.acompletion(model="primary", messages=MSG, max_tokens=5, metadata={"tenant": "acme"})
    assert sorted((a.budget, a.threshold, a.window) for a in alerts) == [
        ("tenant/day", 0.5, "2026-03-11"),
    ]


# -- configuration errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: Budget.daily(0), "Budget.limit"),
        (lambda: Budget.daily(-5), "Budget.limit"),
        (lambda: Budget.daily(float("inf")), "Budget.limit"),
        (lambda: Budget.daily("50"), "Budget.limit"),
        (lambda: Budget.daily(True), "Budget.limit"),
        (lambda: Budget(5, "week"), "Budget.period"),
        (lambda: Budget.scoped("tenant", 5, period="hour"), "Budget.period"),
        (lambda: Budget.scoped("tenant", 5, period="request"), "Budget.period"),
        (lambda: Budget.scoped("", 5), "Budget.scope"),
        (lambda: CostGuard(Budget.daily(5)), "budgets"),
        (lambda: CostGuard([Budget.daily(5), Budget.daily(6)]), "budgets"),
        (lambda: CostGuard(["daily"]), "budgets"),
        (lambda: CostGuard([Budget.daily(5)], alert_at=0), "alert_at"),
        (lambda: CostGuard([Budget.daily(5)], alert_at=[0.5, 1.5]), "alert_at"),
        (lambda: CostGuard([Budget.daily(5)], timezone="Mars/Olympus"), "timezone"),
        (lambda: CostGuard([Budget.daily(5)], ledger="postgres://x"), "ledger"),
        (lambda: CostGuard([Budget.daily(5)], ledger="sqlite:////no/such/dir/spend.db"), "ledger"),
        (lambda: CostGuard([Budget.daily(5)], ledger=42), "ledger"),
        (lambda: CostGuard([Budget.daily(5)], unknown_model="ignore"), "unknown_model"),
        (lambda: CostGuard([Budget.daily(5)], unknown_model=(-1, 0)), "input_cost_per_token"),
        (lambda: CostGuard([Budget.daily(5)], prices={"m": {"input": 1}}), "prices['m']"),
        (lambda: CostGuard([Budget.daily(5)], default_max_tokens=0), "default_max_tokens"),
        (lambda: CostGuard([Budget.daily(5)], prompt_margin=-0.1), "prompt_margin"),
        (lambda: CostGuard([Budget.daily(5)], reservation_ttl=0), "reservation_ttl"),
        (lambda: CostGuard([Budget.daily(5)], price_resolver=42), "price_resolver"),
    ],
)
def test_bad_configuration_is_a_config_error_naming_the_field(build: Callable[[], Any], field: str):
    with pytest.raises(ConfigError) as ei:
        build()
    assert ei.value.field == field
    assert ei.value.message  # says how to fix it


def test_budget_default_names_and_guard_repr():
    names = [
        b.name
        for b in (
            Budget.per_request(1),
            Budget.per_run(1),
            Budget.daily(1),
            Budget.monthly(1),
            Budget.total(1),
            Budget.scoped("tenant", 1, period="month"),
            Budget.daily(1, name="ops"),
        )
    ]
    assert names == ["per_request", "per_run", "daily", "monthly", "total", "tenant/month", "ops"]
    g = CostGuard([Budget.daily(50)], ledger=MemoryLedger())
    assert "daily=$50" in repr(g)


# -- the router's other guard hooks ----------------------------------------------------------------------


async def test_headroom_lets_the_router_shed_low_priority_tiers_first(
    make_router: RouterFactory, sim: ProviderSimulator
):
    from llm_resilience_plugin import LoadShedError

    one = estimate_prompt_tokens(MSG) * IN + 5 * OUT
    guard = CostGuard(
        [Budget.daily(100 * one), Budget.scoped("tenant", 4 * one)],
        token_counter=sim_counter,
        prompt_margin=0,
    )
    router = make_router({"primary": ["a"]}, guards=[guard])
    acme = {"tenant": "acme"}
    assert guard.headroom(acme) == 1.0 and guard.headroom() == 1.0
    for _ in range(3):
        await router.acompletion(model="primary", messages=MSG, max_tokens=5, metadata=acme)
    assert guard.headroom(acme) == pytest.approx(0.25)
    assert guard.headroom() == pytest.approx(0.97)
    with pytest.raises(LoadShedError):  # P3 sheds below 50 %: nothing is sent
        await router.acompletion(model="primary", messages=MSG, max_tokens=5, metadata=acme, priority="P3")
    assert sim.count() == 3
    await router.acompletion(model="primary", messages=MSG, max_tokens=5, metadata=acme, priority="P0")
    await router.acompletion(
        model="primary", messages=MSG, max_tokens=5, metadata={"tenant": "bob"}, priority="P3"
    )
    assert sim.count() == 5


async def test_on_cancel_release_trusts_a_cancelled_attempt_cost_nothing(
    make_router: RouterFactory, sim: ProviderSimulator
):
    guard = CostGuard([Budget.daily(1.0)], on_cancel="release")
    router = make_router({"primary": ["a"]}, guards=[guard])
    stream = await router.acompletion(model="primary", messages=MSG, stream=True, max_tokens=50)
    await stream.aclose()  # closed before any content reached the caller (a stream that had
    # produced content is never released: tests/integration/test_spend.py)
    assert daily_usage(guard) == (0, 0)
    assert guard.ledger.entries() == []
    with pytest.raises(ConfigError):
        CostGuard([Budget.daily(1.0)], on_cancel="ignore")  # type: ignore[arg-type]
