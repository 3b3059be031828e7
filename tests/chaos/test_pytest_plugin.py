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
