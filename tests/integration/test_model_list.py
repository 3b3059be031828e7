"""A model list that changes: add_deployment, upsert_deployment, delete_deployment and
set_model_list keep the breakers, paces, policies, fallbacks, dispatch plan and cost guard
consistent, over real HTTP against the simulator."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import pytest
from litellm.types.router import Deployment

from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin.cost import Budget, CostGuard
from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.events import hidden_params_of
from llm_resilience_plugin.testing import Fault
from tests.conftest import MSG, deployment, requires_capability


def _served_by(router: ResilientRouter, n: int, group: str = "g") -> list[str]:
    out = []
    for _ in range(n):
        resp = router.completion(model=group, messages=MSG)
        out.append(hidden_params_of(resp)["model_id"])
    return out


def _trip(router: ResilientRouter, sim, dep: str, group: str = "g") -> None:
    """Fail ``dep`` until its breaker opens (the group's other deployments answer)."""
    sim.set_default(dep, Fault.server_error(500))
    for _ in range(60):
        if router.breakers()[dep]["state"] == "open":
            return
        router.completion(model=group, messages=MSG)
    raise AssertionError(f"{dep}'s breaker did not open")


def _state(router: ResilientRouter) -> tuple:
    """Everything a refused change must leave as it was."""
    return (
        [d["model_info"]["id"] for d in router.get_model_list()],
        [d.id for d in router.deployments()],
        sorted(router.breakers()),
        sorted(router.paces()),
        router.dispatch_plan(),
        router.model_groups,
    )


def test_an_added_deployment_gets_traffic_a_breaker_and_a_plan(sim, make_router) -> None:
    router = make_router({"g": ["a"]})
    added = router.add_deployment(Deployment(**deployment(sim, "g", "b")))
    assert added is not None and added.model_info.id == "b"
    assert router.add_deployment(Deployment(**deployment(sim, "g", "b"))) is None  # its id is served
    assert [d.id for d in router.deployments("g")] == ["a", "b"]
    assert router.breakers()["b"]["state"] == "closed"
    assert "b" in router.paces()
    served = _served_by(router, 20)
    assert sim.count("b") > 0 and set(served) == {"a", "b"}
    # checked like the ones given at construction: its failures open its own breaker
    _trip(router, sim, "b")
    assert router.breakers()["a"]["state"] == "closed"


def test_a_new_group_is_served_like_one_from_construction(sim, make_router) -> None:
    router = make_router({"g": ["a"]})
    router.add_deployment({"model_name": "h", "litellm_params": deployment(sim, "h", "c")["litellm_params"]})
    (dep,) = router.deployments("h")
    assert dep.id.startswith("h/openai/gpt-4o-mini@127.0.0.1")  # a readable id, as at construction
    assert "h" in router.model_groups and router.effective_policy("h").deadline == 10
    assert router.retry_budget("h") is not None
    assert router.completion(model="h", messages=MSG).choices[0].message.content
    assert sim.count("c") == 1


@requires_capability("direct_dispatch")
def test_an_added_deployment_of_a_direct_group_is_sent_direct(sim, make_router) -> None:
    router = make_router({"g": ["a"]})
    assert router.dispatch_plan()["g"]["dispatcher"] == "direct"
    router.add_deployment(deployment(sim, "g", "b"))
    assert router.dispatch_plan()["g"]["dispatcher"] == "direct"
    before = router.engine.dispatcher.sent_direct
    _served_by(router, 12)
    assert router.engine.dispatcher.sent_direct - before == 12
    assert sim.count("b") > 0
    # a deployment only the Router reproduces moves its group to the Router, and says why
    router.add_deployment(deployment(sim, "g", "t", tags=["x"]))
    plan = router.dispatch_plan()["g"]
    assert plan["dispatcher"] == "router" and "deployment t sets tags" in plan["reason"]


def test_a_deleted_deployment_gets_no_traffic_and_no_breaker(sim, make_router) -> None:
    router = make_router({"g": ["a", "b"]})
    _trip(router, sim, "b")
    assert router.breakers()["b"]["state"] == "open"
    removed = router.delete_deployment("b")
    assert removed is not None and removed["model_info"]["id"] == "b"
    assert router.delete_deployment("b") is None  # no deployment has it
    assert "b" not in router.breakers() and "b" not in router.paces()
    assert [d.id for d in router.deployments()] == ["a"]
    with pytest.raises(KeyError):
        router.breaker("b")
    assert router.engine.all_clear()  # its open breaker no longer keeps the fast path off
    sim.clear_log()
    assert set(_served_by(router, 10)) == {"a"}
    assert sim.count("b") == 0


def test_a_re_added_id_starts_closed(sim, make_router) -> None:
    router = make_router({"g": ["a", "b"]})
    _trip(router, sim, "b")
    router.delete_deployment("b")
    sim.set_default("b", Fault.ok())
    router.add_deployment(deployment(sim, "g", "b"))
    assert router.breakers()["b"]["state"] == "closed"
    assert "b" in _served_by(router, 20)


def test_upsert_changing_api_base_and_rpm(sim, make_router) -> None:
    router = make_router({"g": ["a", "b"]})
    _trip(router, sim, "b")
    assert router.breakers()["b"]["state"] == "open"
    # rpm only: the same endpoint, its breaker kept; the pace takes the new limit
    moved = deployment(sim, "g", "b", rpm=600)
    assert router.upsert_deployment(Deployment(**moved)) is not None
    assert router.upsert_deployment(Deployment(**moved)) is None  # unchanged
    assert router.breakers()["b"]["state"] == "open"
    assert router.paces()["b"]["source"] == "config"
    assert router.paces()["b"]["rpm"] == pytest.approx(
        600 * router.policy.pacing.headroom
    )  # as at construction
    # api_base now at the simulator's deployment "c": a new endpoint, a new (closed) breaker
    moved["litellm_params"]["api_base"] = sim.api_base("c")
    assert router.upsert_deployment(moved) is not None
    assert router.breakers()["b"]["state"] == "closed"
    assert router.deployments("g")[1].api_base == sim.api_base("c")
    sim.clear_log()
    _served_by(router, 20)
    assert sim.count("c") > 0 and sim.count("b") == 0


def test_set_model_list_replaces_everything(sim, make_router) -> None:
    router = make_router({"g": ["a", "b"]})
    _trip(router, sim, "a")
    assert router.breakers()["a"]["state"] == "open"
    assert router.set_model_list([deployment(sim, "g", "a"), deployment(sim, "h", "d")]) is None
    assert sorted(router.breakers()) == ["a", "d"] and router.model_groups == ["g", "h"]
    assert router.breakers()["a"]["state"] == "open"  # a deployment that stays keeps its breaker
    assert [d["model_info"]["id"] for d in router.get_model_list()] == ["a", "d"]
    sim.set_default("a", Fault.ok())
    sim.clear_log()
    assert router.completion(model="h", messages=MSG).choices[0].message.content
    assert sim.count("d") == 1 and sim.count("b") == 0
    with pytest.raises(ConfigError, match="unknown model group 'nope'"):
        router.completion(model="nope", messages=MSG)


def test_bad_input_is_refused_with_the_router_unchanged(sim, make_router) -> None:
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    before = _state(router)
    cases = [
        (
            lambda: router.add_deployment({"model_name": "g", "litellm_params": {}}),
            "deployment.litellm_params.model",
        ),
        (lambda: router.add_deployment({"litellm_params": {"model": "openai/x"}}), "deployment.model_name"),
        (lambda: router.add_deployment(42), "deployment"),
        (
            lambda: router.add_deployment(
                deployment(sim, "g", "u", api_base="http://user:pw@127.0.0.1:1/v1")
            ),
            "deployment.litellm_params.api_base",
        ),
        (lambda: router.delete_deployment("b"), "delete_deployment"),  # backup: named by the fallbacks
        (lambda: router.set_model_list([deployment(sim, "primary", "a")]), "set_model_list"),
        (lambda: router.set_model_list([{"model_name": "x"}]), "model_list[0].litellm_params.model"),
        (lambda: router.set_model_list("nope"), "model_list"),
        (
            lambda: router.upsert_deployment({"model_name": "", "litellm_params": {"model": "x"}}),
            "deployment.model_name",
        ),
    ]
    for change, field in cases:
        with pytest.raises(ConfigError) as err:
            change()
        assert err.value.field == field, (field, str(err.value))
        assert _state(router) == before
    with pytest.raises(
        ConfigError, match=re.escape("last deployment of model group 'backup', which fallbacks.primary names")
    ):
        router.delete_deployment("b")
    assert router.completion(model="primary", messages=MSG).choices[0].message.content


def test_a_cost_guard_prices_a_new_deployment_before_it_is_in(sim, make_router) -> None:
    guard = CostGuard(budgets=[Budget.daily(10.0)], unknown_model="error")
    router = make_router({"g": ["a"]}, guards=[guard])
    before = _state(router)
    unpriced = deployment(sim, "g", "u", model="openai/not-a-model-anyone-prices")
    with pytest.raises(ConfigError, match="not-a-model-anyone-prices"):
        router.add_deployment(unpriced)
    assert _state(router) == before
    priced = deployment(sim, "g", "p", model="openai/not-a-model-anyone-prices", input_cost_per_token=1e-6)
    priced["litellm_params"]["output_cost_per_token"] = 2e-6
    router.add_deployment(priced)
    assert [c[0] for c in guard.candidates_for_model("g")] == ["a", "p"]


def test_secrets_of_an_added_deployment_are_scrubbed(sim, make_router) -> None:
    from llm_resilience_plugin._redaction import scrub

    router = make_router({"g": ["a"]})
    secret = "plain-added-secret-77zz"
    assert secret in scrub(f"x {secret} y")  # not held yet
    router.add_deployment(deployment(sim, "g", "b", api_key=secret))
    assert secret not in scrub(f"x {secret} y")
    router.close()
    assert secret in scrub(f"x {secret} y")


def test_calls_in_flight_during_changes(sim, make_router) -> None:
    """Many threads call while deployments come and go: every call is answered, a call in flight
    on a deployment that is taken out finishes, and once it is out no new call reaches it."""
    router = make_router({"g": ["a", "b"]})
    sim.set_default("b", Fault.ok(latency=0.3))
    results: list[str] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            for _ in range(6):
                results.append(hidden_params_of(router.completion(model="g", messages=MSG))["model_id"])
        except BaseException as e:  # pragma: no cover - reported below
            import traceback

            traceback.print_exc()
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for i in range(5):
        router.add_deployment(deployment(sim, "g", f"n{i}"))
        router.upsert_deployment(deployment(sim, "g", f"n{i}", rpm=6000))
    router.delete_deployment("b")  # calls are in flight on it (0.3 s each)
    out_at = time.monotonic()
    router.set_model_list([deployment(sim, "g", "a"), deployment(sim, "g", "n0")])
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 36
    # nothing new reached it once it was out (a request sent just before may arrive a little later)
    assert not [r for r in sim.requests("b") if r.started_at > out_at + 0.2]
    assert sorted(router.breakers()) == ["a", "n0"]
    sim.clear_log()
    assert set(_served_by(router, 10)) <= {"a", "n0"}


async def test_async_calls_in_flight_on_a_deleted_deployment_finish(sim, make_router) -> None:
    router = make_router({"g": ["a", "b", "c"]})
    await asyncio.to_thread(_trip, router, sim, "c")  # an open breaker: every attempt takes a ticket
    assert not router.engine.all_clear()
    sim.set_default("a", Fault.ok(latency=0.4))
    sim.set_default("b", Fault.ok(latency=0.4))
    calls = [asyncio.create_task(router.acompletion(model="g", messages=MSG)) for _ in range(8)]
    await asyncio.sleep(0.15)
    assert sim.count("b") > 0
    router.delete_deployment("b")
    got = await asyncio.gather(*calls)
    assert all(r.choices[0].message.content for r in got)  # their outcomes reach b's retired breaker
    assert "b" in {hidden_params_of(r)["model_id"] for r in got}
    assert "b" not in router.breakers()
    before = sim.count("b")
    await asyncio.gather(*(router.acompletion(model="g", messages=MSG) for _ in range(6)))
    assert sim.count("b") == before


def test_a_group_whose_last_deployment_leaves_is_no_longer_served(sim, make_router) -> None:
    router = make_router({"g": ["a"], "h": ["b"]})
    router.delete_deployment("b")  # no fallback or policy names h
    assert router.model_groups == ["g"]
    with pytest.raises(ConfigError, match="unknown model group 'h'"):
        router.completion(model="h", messages=MSG)
    with pytest.raises(ConfigError, match="unknown model group 'h'"):
        router.effective_policy("h")
    # a deployment can move to another group: it is new there (a closed breaker, its group's policy)
    router.upsert_deployment(deployment(sim, "h", "a"))
    assert router.model_groups == ["h"] and [d.model_group for d in router.deployments()] == ["h"]
    assert router.completion(model="h", messages=MSG).choices[0].message.content


def test_set_model_list_takes_litellm_deployments(sim, make_router) -> None:
    router = make_router({"g": ["a"]})
    router.set_model_list([Deployment(**deployment(sim, "g", "b")), deployment(sim, "g", "c")])
    assert sorted(router.breakers()) == ["b", "c"]
    assert set(_served_by(router, 12)) <= {"b", "c"} and sim.count("a") == 0
