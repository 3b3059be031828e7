"""Direct dispatch is equivalent to the Router's: the same calls through both dispatchers against the
simulator send the same ``litellm.acompletion`` arguments, request bodies and headers, and give the
same responses, callbacks, stream chunks, errors and parallel-request limits. Configs where that is
not proven go through the Router (the plan says why)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import litellm
import pytest
from litellm.integrations.custom_logger import CustomLogger

from llm_resilience_plugin import AllRoutesFailedError, ConfigError, ResilientRouter
from llm_resilience_plugin.events import hidden_params_of
from llm_resilience_plugin.routing._direct import DirectDispatcher
from llm_resilience_plugin.routing._dispatch import RouterDispatcher
from llm_resilience_plugin.testing import FakeClock
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator
from tests.conftest import FAST_POLICY, MSG, deployment, requires_capability
from tests.integration._parity import Events

# The equivalence suite of a LiteLLM internal: skipped, naming it, where this LiteLLM lacks it.
pytestmark = requires_capability("direct_dispatch")

MODES = ("router", "direct")
# Per-request values: ids and clocks, and the plugin's own attempt token.
VOLATILE_HIDDEN = {"created_at", "_response_ms", "litellm_overhead_time_ms", "headers", "litellm_call_id"}
VOLATILE_HIDDEN |= {"received_model_id"}  # the provider's response id
VOLATILE_HEADERS = {"date", "llm_provider-date", "x-litellm-response-duration-ms"}


def _routers(
    model_list: list[dict[str, Any]], policy: dict[str, Any] | None = None, **kw: Any
) -> dict[str, ResilientRouter]:
    return {
        mode: ResilientRouter(
            model_list=model_list,
            policy={**FAST_POLICY, **(policy or {}), "dispatch": mode},
            clock=FakeClock(),
            seed=7,
            **kw,
        )
        for mode in MODES
    }


class Recorder:
    """Wraps ``litellm.acompletion`` to record the kwargs each attempt passes it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[dict[str, Any]] = []
        orig = litellm.acompletion

        async def rec(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(kwargs)
            return await orig(*args, **kwargs)

        monkeypatch.setattr(litellm, "acompletion", rec)


def _normal_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    out = dict(kw)
    out.pop("litellm_trace_id")
    state = out.pop("_context_compaction_state")
    out["_context_compaction_state"] = (type(state).__name__, state.surface, state.config)
    md = dict(out["metadata"])
    md.pop("_llm_resilience_attempt")
    md.pop("llm_api_timing_windows", None)  # written by LiteLLM during the call
    md.pop("hidden_params", None)  # written by LiteLLM's success logging after the call
    out["metadata"] = md
    return out


def _choices(resp: Any) -> list[dict[str, Any]]:
    out = [c.model_dump() for c in resp.choices]
    for c in out:  # the simulator numbers its tool calls
        for t in c["message"].get("tool_calls") or []:
            t["id"] = "call"
    return out


def _normal_headers(h: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in h.items() if k not in VOLATILE_HEADERS}


async def _one_each(
    sim: ProviderSimulator, rs: dict[str, ResilientRouter], monkeypatch: pytest.MonkeyPatch, **call: Any
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """One call through each router: (responses, acompletion kwargs, simulator records) by mode."""
    rec = Recorder(monkeypatch)
    resps, kws, reqs = {}, {}, {}
    for mode, r in rs.items():
        sim.clear_log()
        n = len(rec.calls)
        resps[mode] = await r.acompletion(model="g", messages=MSG, **call)
        assert len(rec.calls) == n + 1
        kws[mode] = rec.calls[-1]
        (reqs[mode],) = sim.requests()
    return resps, kws, reqs


def test_dispatch_plan_default_and_modes(sim: ProviderSimulator) -> None:
    ml = [deployment(sim, "g", "a")]
    r = ResilientRouter(model_list=ml)
    try:
        assert r.dispatch_plan()["g"]["dispatcher"] == "direct"
        assert isinstance(r.engine.dispatcher, DirectDispatcher)
    finally:
        r.close()
    r = ResilientRouter(model_list=ml, policy={"dispatch": "router"})
    try:
        assert r.dispatch_plan() == {"g": {"dispatcher": "router", "reason": "policy dispatch: router"}}
        assert isinstance(r.engine.dispatcher, RouterDispatcher)
    finally:
        r.close()


@pytest.mark.parametrize(
    ("params", "settings", "why"),
    [
        ({"tags": ["x"]}, {}, "tags"),
        ({"order": 1}, {}, "order"),
        ({}, {"routing_strategy": "latency-based-routing"}, "routing_strategy"),
        ({}, {"enable_pre_call_checks": True}, "enable_pre_call_checks"),
        ({}, {"enable_tag_filtering": True}, "enable_tag_filtering"),
        ({}, {"model_group_alias": {"h": "g"}}, "model_group_alias"),
        ({}, {"default_priority": 1}, "default_priority"),
        ({}, {"optional_pre_call_checks": ["prompt_caching"]}, "optional_pre_call_checks"),
    ],
)
def test_configs_not_proven_equivalent_use_the_router(
    sim: ProviderSimulator,
    params: dict[str, Any],
    settings: dict[str, Any],
    why: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(litellm, "callbacks", list(litellm.callbacks))  # a Router may register its checks
    ml = [deployment(sim, "g", "a", **params), deployment(sim, "h", "b")]
    r = ResilientRouter(model_list=ml, router_settings=settings)
    try:
        plan = r.dispatch_plan()
        assert plan["g"]["dispatcher"] == "router" and why in plan["g"]["reason"]
        if params:  # a deployment's setting keeps only its own group on the Router
            assert plan["h"]["dispatcher"] == "direct"
    finally:
        r.close()
    with pytest.raises(ConfigError) as e:
        ResilientRouter(model_list=ml, router_settings=settings, policy={"dispatch": "direct"})
    assert e.value.field == "resilience.dispatch" and why in str(e.value)


async def test_same_arguments_bodies_headers_and_responses(
    sim: ProviderSimulator, monkeypatch: pytest.MonkeyPatch, routers: list[ResilientRouter]
) -> None:
    monkeypatch.setenv("DIRECT_TEST_KEY", "sk-from-env")
    ml = [
        deployment(
            sim,
            "g",
            "eq",
            api_key="os.environ/DIRECT_TEST_KEY",
            input_cost_per_token=1e-6,
            output_cost_per_token=2e-6,
            temperature=0.3,
            extra_headers={"x-team": "blue"},
            timeout=7,
        )
    ]
    rs = _routers(ml, router_settings={"timeout": 9, "stream_timeout": 4})
    routers.extend(rs.values())
    for call in (
        {},
        {"metadata": {"tags": ["t1"], "user_id": "u"}, "max_tokens": 20, "user": "me"},
        {"timeout": 3, "seed": 1},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]},
    ):
        resps, kws, reqs = await _one_each(sim, rs, monkeypatch, **call)
        assert _normal_kwargs(kws["router"]) == _normal_kwargs(kws["direct"])
        assert kws["direct"]["api_key"] == "sk-from-env"  # os.environ/ resolved as the Router does
        assert reqs["router"].body == reqs["direct"].body
        assert reqs["router"].headers == reqs["direct"].headers
        a, b = resps["router"], resps["direct"]
        assert a.model == b.model and a.usage == b.usage
        assert _choices(a) == _choices(b)
        ha, hb = hidden_params_of(a), hidden_params_of(b)
        for key in ("model_id", "api_base", "response_cost", "custom_llm_provider", "litellm_model_name"):
            assert ha[key] == hb[key], key
        assert ha["response_cost"] > 0
        assert _normal_headers(ha["additional_headers"]) == _normal_headers(hb["additional_headers"])
        assert set(ha) == set(hb)


async def test_weights_are_reproduced(sim: ProviderSimulator, routers: list[ResilientRouter]) -> None:
    """The Router's own simple_shuffle over the admitted deployments: weights keep their shares."""
    ml = [deployment(sim, "g", "a", weight=3), deployment(sim, "g", "b", weight=1)]
    rs = _routers(ml)
    routers.extend(rs.values())
    counts: dict[str, Counter[str]] = {}
    for mode, r in rs.items():
        sim.clear_log()
        await asyncio.gather(*(r.acompletion(model="g", messages=MSG) for _ in range(200)))
        counts[mode] = Counter(rec.deployment for rec in sim.requests())
    for mode in MODES:  # 3:1 -> 150 expected of 200 on "a"; 5 sigma is about 30
        assert 120 <= counts[mode]["a"] <= 180, counts


SLO_KEYS = (
    "model_id",
    "model_group",
    "api_base",
    "response_cost",
    "prompt_tokens",
    "completion_tokens",
    "status",
    "model",
)


async def test_callbacks_fire_alike(
    sim: ProviderSimulator, monkeypatch: pytest.MonkeyPatch, routers: list[ResilientRouter]
) -> None:
    ml = [deployment(sim, "g", "cb", input_cost_per_token=1e-6)]  # its own id: prices are per id
    rs = _routers(ml, policy={"classes": {"server": {"action": "fail"}}})
    routers.extend(rs.values())
    events = Events()
    monkeypatch.setattr(litellm, "callbacks", [*litellm.callbacks, events])
    got: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for mode, r in rs.items():
        assert r.dispatch_plan()["g"]["dispatcher"] == mode  # a logger does not take part in routing
        events.seen.clear()
        await r.acompletion(model="g", messages=MSG, metadata={"k": "v"})
        sim.script("cb", Fault.server_error(500))
        with pytest.raises(Exception):  # noqa: B017 - the same for both: compared below
            await r.acompletion(model="g", messages=MSG)
        for _ in range(100):  # the success event is logged in the background
            if sum(e[1].get("model_id") == "cb" for e in events.seen) >= 2:
                break
            await asyncio.sleep(0.01)
        # only this test's deployment: another test's background logging may land here late
        got[mode] = sorted((e for e in events.seen if e[1].get("model_id") == "cb"), key=lambda e: e[0])
        assert [kind for kind, _ in got[mode]] == ["failure", "success"]
    for (kind_a, a), (kind_b, b) in zip(got["router"], got["direct"], strict=True):
        assert kind_a == kind_b
        assert {k: a.get(k) for k in SLO_KEYS} == {k: b.get(k) for k in SLO_KEYS}, kind_a
        ea, eb = a.get("error_information") or {}, b.get("error_information") or {}
        assert (ea.get("error_class"), ea.get("error_code")) == (eb.get("error_class"), eb.get("error_code"))
        ma, mb = dict(a["metadata"]), dict(b["metadata"])
        assert set(ma) == set(mb)
        assert (ma.get("requester_metadata") or {}).keys() == (mb.get("requester_metadata") or {}).keys()


class Rerouter(CustomLogger):
    """A global deployment filter: the Router runs it, so its presence sends attempts there."""

    async def async_filter_deployments(  # type: ignore[override]
        self,
        model: str,
        healthy_deployments: list[dict[str, Any]],
        messages: Any,
        request_kwargs: Any = None,
        parent_otel_span: Any = None,
    ) -> list[dict[str, Any]]:
        return [d for d in healthy_deployments if d["model_info"]["id"] == "b"]


async def test_global_routing_hooks_send_attempts_through_the_router(
    sim: ProviderSimulator, monkeypatch: pytest.MonkeyPatch, routers: list[ResilientRouter]
) -> None:
    rs = _routers([deployment(sim, "g", "a"), deployment(sim, "g", "b")])
    routers.extend(rs.values())
    monkeypatch.setattr(litellm, "callbacks", [*litellm.callbacks, Rerouter()])
    for r in rs.values():
        sim.clear_log()
        for _ in range(6):
            await r.acompletion(model="g", messages=MSG)
        assert {rec.deployment for rec in sim.requests()} == {"b"}


CLASSES = (
    "server",
    "rate_limit",
    "auth",
    "bad_request",
    "context_window",
    "content_policy",
    "connection",
    "timeout",
)


@pytest.mark.parametrize(
    "fault",
    [
        Fault.server_error(500),
        Fault.server_error(503),
        Fault.rate_limit(),
        Fault.auth(),
        Fault.not_found(),
        Fault.context_length(10),
        Fault.content_filter(),
        Fault.http_error(400),
    ],
    ids=lambda f: f.name + (f":{f.code}" if f.code else ""),
)
async def test_errors_are_the_same(
    sim: ProviderSimulator, routers: list[ResilientRouter], fault: Any
) -> None:
    fail_all = {c: {"action": "fail"} for c in CLASSES}
    rs = _routers([deployment(sim, "g", "a")], policy={"classes": fail_all})
    routers.extend(rs.values())
    errors = {}
    for mode, r in rs.items():
        sim.script("a", fault)
        with pytest.raises(Exception) as e:
            await r.acompletion(model="g", messages=MSG)
        errors[mode] = e.value
    a, b = errors["router"], errors["direct"]
    assert type(a) is type(b)
    if isinstance(a, AllRoutesFailedError):
        assert [(x.error_class, x.status) for x in a.attempts] == [
            (x.error_class, x.status) for x in b.attempts
        ]
        a, b = a.__cause__, b.__cause__
    assert _same_error(a, b)
    assert rs["direct"].engine.dispatcher.sent_direct == 1  # type: ignore[union-attr]


# What the Router appends to a failed group's error: its own fallback explanation (the plugin's
# fallbacks are its own, so a direct attempt's error has no such line).
ROUTER_SUFFIX = "\n\nLiteLLM: model group 'g' failed with the error above. No fallback was attempted."


def _same_error(a: Any, b: Any) -> bool:
    assert type(a) is type(b)
    assert getattr(a, "status_code", None) == getattr(b, "status_code", None)
    assert getattr(a, "llm_provider", None) == getattr(b, "llm_provider", None)
    assert getattr(a, "failed_deployment_id", None) == getattr(b, "failed_deployment_id", None) == "a"
    # the Router appends its own fallback advice (no fallback was attempted, or set
    # context_window_fallbacks); the plugin does its own fallbacks, so a direct error has none
    rest = str(a).removeprefix(str(b))
    assert str(a).startswith(str(b)) and (rest == "" or rest == ROUTER_SUFFIX or "fallback" in rest), rest
    return True


async def test_streams_give_the_same_chunks(
    sim: ProviderSimulator, monkeypatch: pytest.MonkeyPatch, routers: list[ResilientRouter]
) -> None:
    rs = _routers([deployment(sim, "g", "a", input_cost_per_token=1e-6)])
    routers.extend(rs.values())
    rec = Recorder(monkeypatch)
    chunks: dict[str, list[dict[str, Any]]] = {}
    reqs = {}
    for asked in (False, True):
        for mode, r in rs.items():
            sim.clear_log()
            opts = {"stream_options": {"include_usage": True}} if asked else {}
            stream = await r.acompletion(model="g", messages=MSG, stream=True, **opts)
            got = []
            async for chunk in stream:
                d = chunk.model_dump()
                d.pop("id"), d.pop("created")
                hidden = {k: v for k, v in hidden_params_of(chunk).items() if k not in VOLATILE_HIDDEN}
                hidden["additional_headers"] = _normal_headers(hidden.get("additional_headers") or {})
                got.append({**d, "_hidden_params": hidden})
            chunks[mode] = got
            (reqs[mode],) = sim.requests()
            report = stream.report
            assert report.outcome == "success" and report.deployment_id == "a"
        assert chunks["router"] == chunks["direct"]
        assert reqs["router"].body == reqs["direct"].body and reqs["router"].headers == reqs["direct"].headers
        assert _normal_kwargs(rec.calls[-2]) == _normal_kwargs(rec.calls[-1])


async def test_max_parallel_requests_is_one_shared_limit(
    sim: ProviderSimulator, routers: list[ResilientRouter]
) -> None:
    """A deployment's max_parallel_requests: the Router's own limit object, so a call over it gets
    the same 429 whichever dispatcher (or the wrapped Router itself) holds the slots."""
    no_retry = {"classes": {"rate_limit": {"action": "fail"}}}
    rs = _routers([deployment(sim, "g", "a", max_parallel_requests=1)], policy=no_retry)
    routers.extend(rs.values())
    errors = {}
    for mode, r in rs.items():
        await r.acompletion(model="g", messages=MSG)  # the Router builds its limit on first use
        store = r.litellm_router.health().store
        limit = store.get_cache(key="a_max_parallel_requests_client", local_only=True)
        assert limit is not None and limit.max_parallel_requests == 1
        sim.script("a", Fault.ok(latency=0.3))
        first = asyncio.ensure_future(r.acompletion(model="g", messages=MSG))
        await asyncio.sleep(0.1)
        assert limit.in_flight == 1
        with pytest.raises(AllRoutesFailedError) as e:
            await r.acompletion(model="g", messages=MSG)
        errors[mode] = e.value.__cause__
        await first
        assert limit.in_flight == 0
        await r.acompletion(model="g", messages=MSG)
    assert isinstance(errors["direct"], litellm.RateLimitError)
    assert _same_error(errors["router"], errors["direct"])


async def test_no_new_http_client_per_call(sim: ProviderSimulator, routers: list[ResilientRouter]) -> None:
    rs = _routers([deployment(sim, "g", "a")])
    routers.extend(rs.values())
    r = rs["direct"]
    await r.acompletion(model="g", messages=MSG)
    cache = litellm.in_memory_llm_clients_cache
    before = dict(getattr(cache, "cache_dict", {}) or {})
    for _ in range(20):
        await r.acompletion(model="g", messages=MSG)
    after = dict(getattr(cache, "cache_dict", {}) or {})
    assert before.keys() == after.keys()
    assert all(after[k] is before[k] for k in before)


async def test_breakers_and_retries_work_direct(
    sim: ProviderSimulator, routers: list[ResilientRouter]
) -> None:
    """The engine's filter picks for a direct attempt: a retry prefers the other deployment and an
    open breaker keeps a deployment out, with exactly one request per attempt."""
    rs = _routers([deployment(sim, "g", "a"), deployment(sim, "g", "b")])
    routers.extend(rs.values())
    r = rs["direct"]
    sim.set_default("a", Fault.server_error(500))
    for _ in range(40):
        resp = await r.acompletion(model="g", messages=MSG)
        assert hidden_params_of(resp)["model_id"] == "b"
        if r.breakers()["a"]["state"] == "open":
            break
    assert r.breakers()["a"]["state"] == "open"
    n = sim.count("a")
    for _ in range(5):
        await r.acompletion(model="g", messages=MSG)
    assert sim.count("a") == n
    assert sim.count() == sim.count("a") + sim.count("b")


def test_sync_completion_goes_direct(sim: ProviderSimulator, routers: list[ResilientRouter]) -> None:
    rs = _routers([deployment(sim, "g", "a")])
    routers.extend(rs.values())
    resp = rs["direct"].completion(model="g", messages=MSG)
    assert hidden_params_of(resp)["model_id"] == "a"
    assert hidden_params_of(resp)["additional_headers"]["x-litellm-model-group"] == "g"


def test_check_says_which_dispatcher_each_group_uses(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from llm_resilience_plugin.cli import main

    cfg = tmp_path / "router.yaml"
    cfg.write_text(
        "model_list:\n"
        "  - model_name: fast\n"
        "    litellm_params: {model: openai/gpt-4o-mini, api_key: sk-x, api_base: 'http://127.0.0.1:9/v1'}\n"
        "  - model_name: limited\n"
        "    litellm_params: {model: openai/gpt-4o-mini, api_key: sk-x, rpm: 60}\n"
        "  - model_name: ordered\n"
        "    litellm_params: {model: openai/gpt-4o-mini, api_key: sk-x, order: 1}\n"
    )
    assert main(["check", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "dispatch: direct (equivalent to the Router" in out
    assert "dispatch: router (deployment ordered/openai/gpt-4o-mini sets order" in out
    assert main(["check", str(cfg), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["groups"]["fast"]["dispatch"]["dispatcher"] == "direct"
    assert doc["groups"]["limited"]["dispatch"]["dispatcher"] == "direct"  # rpm: counted in the Router
    assert doc["groups"]["ordered"]["dispatch"]["dispatcher"] == "router"


async def test_direct_attempts_never_register_litellm_hooks(
    sim: ProviderSimulator, routers: list[ResilientRouter]
) -> None:
    """Retries, open breakers and guards included: the pick is the plugin's, so no attempt needs
    the process-wide filter or pick hook (which cost every Router in the process while held)."""
    from llm_resilience_plugin.events import AttemptRecord
    from llm_resilience_plugin.routing import _hooks as module

    def registered() -> tuple[bool, bool]:
        return (
            any(cb is module.PICK.hook for cb in litellm.input_callback),
            any(cb is module.FILTER.hook for cb in litellm.callbacks),
        )

    rs = _routers([deployment(sim, "g", "a"), deployment(sim, "g", "b")])
    routers.extend(rs.values())
    r = rs["direct"]
    seen: list[tuple[bool, bool]] = []
    r.subscribe(lambda e: seen.append(registered()) if isinstance(e, AttemptRecord) else None)
    sim.script("a", Fault.server_error(500))
    sim.script("b", Fault.server_error(500))
    await r.acompletion(model="g", messages=MSG)
    assert len(seen) >= 3 and set(seen) == {(False, False)}  # two failures, then an answer


async def test_unweighted_deployments_share_evenly(
    sim: ProviderSimulator, routers: list[ResilientRouter]
) -> None:
    rs = _routers([deployment(sim, "g", "a"), deployment(sim, "g", "b")])
    routers.extend(rs.values())
    for r in rs.values():
        sim.clear_log()
        await asyncio.gather(*(r.acompletion(model="g", messages=MSG) for _ in range(200)))
        share = Counter(rec.deployment for rec in sim.requests())["a"]
        assert 65 <= share <= 135, share  # 100 expected; 5 sigma is about 35
