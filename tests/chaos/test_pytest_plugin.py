"""The pytest plugin's fixtures, used the way a user would (see docs/chaos.md)."""

from __future__ import annotations

import pytest

from llm_resilience_plugin.testing import Fault

HI = [{"role": "user", "content": "hi"}]


@pytest.mark.llm_resilience(config="router.yaml", scenario="deployment-down")
def test_my_chain_survives_a_dead_primary(llm_chaos):
    reply = llm_chaos.router.completion(model="primary", messages=HI)
    assert reply.choices[0].message.content
    assert llm_chaos.count("fallback") == 1


@pytest.mark.llm_resilience(config="router.yaml")
async def test_faults_by_selector_and_the_breaker_opens(llm_chaos):
    llm_chaos.fault("primary[0]", {"kind": "server_error", "status": 503})
    for _ in range(5):
        reply = await llm_chaos.router.acompletion(model="primary", messages=HI)
        assert reply.choices[0].message.content
    # fail_max 3: the breaker opens after three failures and the primary is left alone
    assert llm_chaos.count("primary") == 3
    assert llm_chaos.count("fallback") == 5


@pytest.mark.llm_resilience(config="router.yaml")
def test_a_behavior_works_too_and_the_simulator_is_shared(llm_chaos, llm_simulator, llm_clock):
    llm_chaos.fault("id:main", Fault.rate_limit(retry_after=1))
    llm_chaos.router.completion(model="primary", messages=HI)
    assert llm_chaos.requests("primary")[0].status == 429
    assert llm_simulator.count() == llm_chaos.count("all") >= 2
    assert llm_clock.monotonic() >= 1  # the Retry-After wait passed on the fake clock, instantly


def test_fixtures_do_not_clash_with_the_projects_own(sim, llm_simulator):
    assert sim is not llm_simulator


LATER = {
    "name": "later",
    "healthy": {"kind": "ok"},
    "timeline": {
        "primary[0]": [
            {"at": 0, "until": 2, "fault": {"kind": "server_error", "status": 503}},
            {"at": 10, "fault": {"kind": "auth"}},
        ]
    },
}


@pytest.mark.llm_resilience(config="router.yaml")
async def test_timeline_phases_apply_as_the_clock_reaches_them(llm_chaos, llm_clock):
    from llm_resilience_plugin import get_report
    from llm_resilience_plugin.testing.chaos import scenario_from_mapping

    llm_chaos.apply(scenario_from_mapping(LATER))
    assert llm_chaos.pending() == 2  # the 503 ends at 2 s, the 401 starts at 10 s
    reply = await llm_chaos.router.acompletion(model="primary", messages=HI)
    assert get_report(reply).served_group == "fallback"
    assert {r.behavior for r in llm_chaos.requests("primary")} == {"http_error:503"}
    llm_clock.advance(6)  # past the 503 phase and the breaker's 5 s reset: the probe succeeds
    reply = await llm_chaos.router.acompletion(model="primary", messages=HI)
    assert get_report(reply).served_group == "primary"
    assert llm_chaos.requests("primary")[-1].behavior == "ok" and llm_chaos.pending() == 1
    llm_clock.advance(5)  # 11 s: the key is revoked
    reply = await llm_chaos.router.acompletion(model="primary", messages=HI)
    assert get_report(reply).served_group == "fallback"
    assert llm_chaos.requests("primary")[-1].behavior == "http_error:401" and llm_chaos.pending() == 0


@pytest.mark.llm_resilience(config="router.yaml", scenario="flapping")
def test_a_marker_scenario_keeps_running_through_the_test(llm_chaos, llm_clock):
    assert llm_chaos.requests("primary") == [] and llm_chaos.pending() == 3
    llm_clock.advance(1.6)  # the first outage is over
    llm_chaos.tick()
    assert llm_chaos.pending() == 2
    llm_chaos.router.completion(model="primary", messages=HI)
    assert llm_chaos.requests("primary")[-1].behavior == "ok"
    assert llm_chaos.elapsed >= 1.6
