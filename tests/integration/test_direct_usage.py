"""Direct attempts on deployments with rpm/tpm limits count their usage in the wrapped Router's own
counters exactly as the Router's attempts do: the same requests and tokens of the minute, the same
success/failure counts, the same ``x-ratelimit-*`` headers. (Such groups dispatch direct by default;
``USAGE_DIRECT = False`` sends them back through the Router. This suite proves the switch safe.)"""

from __future__ import annotations

from typing import Any

import pytest

from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin.events import hidden_params_of
from llm_resilience_plugin.routing import _direct_plan
from llm_resilience_plugin.routing._direct import DirectDispatcher
from llm_resilience_plugin.testing import FakeClock
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator
from tests.conftest import FAST_POLICY, MSG, deployment, requires_capability

# The equivalence suite of a LiteLLM internal: skipped, naming it, where this LiteLLM lacks it.
pytestmark = requires_capability("usage_counting")

MODES = ("router", "direct")
EMBED = {"model": "openai/text-embedding-3-small"}


@pytest.fixture
def routers(routers: list[ResilientRouter], monkeypatch: pytest.MonkeyPatch) -> list[ResilientRouter]:
    """The shared fixture, with usage-counted groups sent directly."""
    monkeypatch.setattr(_direct_plan, "USAGE_DIRECT", True)
    return routers


def _pair(made: list[ResilientRouter], model_list: list[Any]) -> dict[str, ResilientRouter]:
    fail = {c: {"action": "fail"} for c in ("server", "rate_limit")}
    rs = {
        mode: ResilientRouter(
            model_list=model_list,
            policy={**FAST_POLICY, "classes": fail, "dispatch": mode},
            clock=FakeClock(),
            seed=7,
        )
        for mode in MODES
    }
    made.extend(rs.values())
    assert isinstance(rs["direct"].engine.dispatcher, DirectDispatcher)
    return rs


def _counters(r: ResilientRouter) -> dict[str, Any]:
    cache = r.litellm_router.health().store.in_memory_cache.cache_dict
    return {k: v for k, v in cache.items() if k.endswith((":successes", ":fails"))}


def _limits(h: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in h.items() if k.startswith("x-ratelimit") or k.startswith("x-litellm-attempted")}


@pytest.mark.parametrize("limits", [{"rpm": 50}, {"tpm": 5000}, {"rpm": 50, "tpm": 5000}], ids=str)
@pytest.mark.parametrize("op", ["chat", "embedding"])
async def test_usage_counts_and_headers_are_the_same(
    sim: ProviderSimulator, routers: list[ResilientRouter], limits: dict[str, Any], op: str
) -> None:
    extra = EMBED if op == "embedding" else {}
    rs = _pair(routers, [deployment(sim, "g", "a", **limits, **extra)])

    async def call(r: ResilientRouter) -> Any:
        if op == "embedding":
            return await r.aembedding("g", ["alpha", "beta"])
        return await r.acompletion(model="g", messages=MSG)

    seen: dict[str, list[Any]] = {m: [] for m in MODES}
    for mode, r in rs.items():
        for fault in (None, Fault.server_error(500), None, Fault.rate_limit(), None):
            if fault is not None:
                sim.script("a", fault)
                with pytest.raises(Exception):  # noqa: B017 - compared across modes below
                    await call(r)
            else:
                resp = await call(r)
                seen[mode].append(_limits(hidden_params_of(resp)["additional_headers"]))
            seen[mode].append(await r.litellm_router.health().usage("g", kind="remaining"))
        seen[mode].append(_counters(r))
    assert rs["direct"].engine.dispatcher.sent_direct == 5  # type: ignore[union-attr]
    assert seen["router"] == seen["direct"]
    assert any(k.startswith("x-ratelimit-remaining") for k in seen["direct"][0])


async def test_streams_on_counted_deployments_use_the_router(
    sim: ProviderSimulator, routers: list[ResilientRouter]
) -> None:
    """The Router holds the deployment's slot for the whole stream and counts its usage at the end."""
    rs = _pair(routers, [deployment(sim, "g", "a", rpm=50)])
    r = rs["direct"]
    stream = await r.acompletion(model="g", messages=MSG, stream=True)
    async for _ in stream:
        pass
    assert r.engine.dispatcher.sent_direct == 0  # type: ignore[union-attr]
    await r.acompletion(model="g", messages=MSG)
    assert r.engine.dispatcher.sent_direct == 1  # type: ignore[union-attr]


def test_plan_sends_counted_groups_direct_by_default(sim: ProviderSimulator) -> None:
    r = ResilientRouter(model_list=[deployment(sim, "g", "a", rpm=50)])
    try:
        assert r.dispatch_plan()["g"]["dispatcher"] == "direct"
    finally:
        r.close()


def test_plan_keeps_counted_groups_on_the_router_when_switched_off(
    sim: ProviderSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_direct_plan, "USAGE_DIRECT", False)
    r = ResilientRouter(model_list=[deployment(sim, "g", "a", rpm=50)])
    try:
        plan = r.dispatch_plan()["g"]
        assert plan["dispatcher"] == "router"
        assert "per-minute usage is counted in the Router" in plan["reason"]
    finally:
        r.close()


def test_redis_keeps_groups_on_the_router_and_says_why(sim: ProviderSimulator) -> None:
    """Usage counters, cooldowns and slots shared through Redis are not proven for direct attempts."""
    r = ResilientRouter(
        model_list=[deployment(sim, "g", "a")], router_settings={"redis_url": "redis://127.0.0.1:1"}
    )
    try:
        plan = r.dispatch_plan()["g"]
        assert plan["dispatcher"] == "router"
        assert plan["reason"].startswith("router_settings redis_url (the Router shares its usage counters")
    finally:
        r.close()


def test_direct_plan_names_what_still_streams_through_the_router(sim: ProviderSimulator) -> None:
    r = ResilientRouter(
        model_list=[deployment(sim, "g", "a", max_parallel_requests=2), deployment(sim, "g", "b")]
    )
    try:
        reason = r.dispatch_plan()["g"]["reason"]
        assert reason.startswith("equivalent to the Router for this config (simple-shuffle)")
        assert "streams on a through the Router (a max_parallel_requests slot held" in reason
    finally:
        r.close()


async def test_callbacks_on_counted_deployments_are_the_same(
    sim: ProviderSimulator, monkeypatch: pytest.MonkeyPatch, routers: list[ResilientRouter]
) -> None:
    """A ``litellm.callbacks`` user sees the same success and failure events (and metadata keys)
    for a deployment whose usage is counted, whichever path counted it."""
    import asyncio

    import litellm

    from tests.integration.test_direct_operations import SLO_KEYS, Events

    for name in (
        "callbacks",
        "input_callback",
        "success_callback",
        "failure_callback",
        "_async_success_callback",
        "_async_failure_callback",
    ):  # LiteLLM's own copies of other tests' loggers (capped at 30) are left out
        kept = [cb for cb in getattr(litellm, name) if not type(cb).__module__.startswith("tests.")]
        monkeypatch.setattr(litellm, name, kept)
    events = Events()
    monkeypatch.setattr(litellm, "callbacks", [*litellm.callbacks, events])
    rs = _pair(routers, [deployment(sim, "g", "cbu", rpm=50)])
    got: dict[str, list[Any]] = {}
    for mode, r in rs.items():
        events.seen.clear()
        await r.acompletion(model="g", messages=MSG)
        sim.script("cbu", Fault.server_error(500))
        with pytest.raises(Exception):  # noqa: B017 - compared across modes below
            await r.acompletion(model="g", messages=MSG)
        for _ in range(100):  # the success event is logged in the background
            if sum(e[1].get("model_id") == "cbu" for e in events.seen) >= 2:
                break
            await asyncio.sleep(0.01)
        got[mode] = sorted((e for e in events.seen if e[1].get("model_id") == "cbu"), key=lambda e: e[0])
        assert [kind for kind, _ in got[mode]] == ["failure", "success"], mode
    assert rs["direct"].engine.dispatcher.sent_direct == 2  # type: ignore[union-attr]
    for (kind_a, a), (kind_b, b) in zip(got["router"], got["direct"], strict=True):
        assert kind_a == kind_b
        assert {k: a.get(k) for k in SLO_KEYS} == {k: b.get(k) for k in SLO_KEYS}, kind_a
        assert set(a["metadata"]) == set(b["metadata"]), kind_a
