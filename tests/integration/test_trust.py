"""Trust: no secret leaves, no caller mistake counts against a deployment, errors say what
happened. Each test plants the problem through the real simulator over loopback."""

from __future__ import annotations

import json
import math
from typing import Any

import litellm
import pytest

from llm_resilience_plugin import (
    AllRoutesFailedError,
    ConfigError,
    DeadlineExceededError,
    ErrorClass,
    ResilientRouter,
    get_report,
)
from llm_resilience_plugin.events import hidden_params_of
from llm_resilience_plugin.testing import Fault, ProviderSimulator
from tests.conftest import FAST_POLICY, MSG, RouterFactory, deployment

# A key that does not look like one (only registration can catch it) and one that does.
PLAIN_KEY = "live-9f8e7d6c5b4a3210fedc"
SHAPED_KEY = "sk-live-abcdefghijklmnop0123"


def _echoing_router(sim: ProviderSimulator, **kw: Any) -> ResilientRouter:
    model_list = [
        {
            **deployment(sim, "primary", "a"),
            "litellm_params": {**deployment(sim, "primary", "a")["litellm_params"], "api_key": PLAIN_KEY},
        },
        deployment(sim, "backup", "b"),
    ]
    return ResilientRouter(
        model_list=model_list, policy=FAST_POLICY, fallbacks=[{"primary": ["backup"]}], **kw
    )


def _assert_clean(text: str) -> None:
    assert PLAIN_KEY not in text and SHAPED_KEY not in text, text


async def test_a_provider_echoing_the_key_never_reaches_reports_errors_or_responses(
    sim: ProviderSimulator,
) -> None:
    router = _echoing_router(sim)
    echo = f"Incorrect API key provided: {PLAIN_KEY}; also Bearer {SHAPED_KEY}"
    sim.set_default("a", Fault.http_error(500, message=echo))
    try:
        # Served by the fallback: the failed attempt's message is in the report and the response.
        resp = await router.acompletion(model="primary", messages=MSG)
        report = get_report(resp)
        assert report is not None and report.served_group == "backup"
        _assert_clean(json.dumps(report.to_dict(), default=str))
        hidden = hidden_params_of(resp)
        assert hidden is not None
        _assert_clean(str(hidden))
        # Nothing serves it: the error lists every attempt.
        sim.set_default("b", Fault.http_error(503, message=echo))
        with pytest.raises(AllRoutesFailedError) as info:
            await router.acompletion(model="primary", messages=MSG)
        _assert_clean(str(info.value))
        _assert_clean(repr(info.value.attempts))
        _assert_clean(str(info.value.__cause__))
    finally:
        router.close()
    # Raised as itself (a caller's error): the provider's own exception is clean too.
    router = _echoing_router(sim)
    sim.set_default("a", Fault.http_error(400, message=echo))
    try:
        with pytest.raises(litellm.BadRequestError) as bad:
            await router.acompletion(model="primary", messages=MSG)
        _assert_clean(str(bad.value))
        _assert_clean(json.dumps(get_report(bad.value).to_dict(), default=str))  # type: ignore[union-attr]
    finally:
        router.close()


def test_url_credentials_are_masked_or_refused(sim: ProviderSimulator) -> None:
    base = sim.api_base("a").replace("http://", "http://user:hunter2@")
    with pytest.raises(ConfigError) as info:
        ResilientRouter(model_list=[{**deployment(sim, "g", "a", api_base=base)}])
    assert "api_base" in info.value.field and "hunter2" not in str(info.value)
    no_key = deployment(sim, "g", "a", api_base=base)
    del no_key["litellm_params"]["api_key"]
    router = ResilientRouter(model_list=[no_key])
    try:
        shown = repr(router.deployments())
        assert "hunter2" not in shown and "***@" in shown
    finally:
        router.close()


BAD_CALLS: list[tuple[str, list[Any], dict[str, Any]]] = [
    ("messages[0]", [42], {}),
    ("messages[0].content", [{"role": "user", "content": "\udcff"}], {}),
    ("messages[0].content", [{"role": "user", "content": b"hi"}], {}),
    ("messages[0].role", [{"content": "hi"}], {}),
    ("max_tokens", MSG, {"max_tokens": math.nan}),
    ("max_tokens", MSG, {"max_tokens": math.inf}),
    ("temperature", MSG, {"temperature": True}),
    ("deadline", MSG, {"deadline": math.nan}),
    ("deadline", MSG, {"deadline": math.inf}),
    ("attempt_timeout", MSG, {"attempt_timeout": math.nan}),
]


@pytest.mark.parametrize(
    ("field", "messages", "kwargs"), BAD_CALLS, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD_CALLS)]
)
async def test_a_callers_mistake_is_refused_before_any_request(
    make_router: RouterFactory,
    sim: ProviderSimulator,
    field: str,
    messages: list[Any],
    kwargs: dict[str, Any],
) -> None:
    router = make_router({"primary": ["a"]})
    for _ in range(3):  # three bad calls: the breaker (fail_max 3) must not move
        with pytest.raises(ConfigError) as info:
            await router.acompletion(model="primary", messages=messages, **kwargs)
        assert info.value.field == field
    assert sim.requests() == []
    assert router.breakers()["a"]["state"] == "closed" and router.breakers()["a"]["fail_counter"] == 0


async def test_missing_credentials_are_a_config_error_not_a_provider_failure(
    sim: ProviderSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLM_RESILIENCE_UNSET_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    dep = deployment(sim, "primary", "a", api_key="os.environ/LLM_RESILIENCE_UNSET_KEY")
    router = ResilientRouter(model_list=[dep], policy=FAST_POLICY)
    try:
        for _ in range(3):
            with pytest.raises(ConfigError) as info:
                await router.acompletion(model="primary", messages=MSG)
            assert info.value.field == "api_key"
            report = get_report(info.value)
            assert report is not None and len(report.attempts) == 1  # not retried
            assert (
                report.attempts[0].error_class is ErrorClass.BAD_REQUEST and report.attempts[0].status is None
            )
        assert sim.requests() == []
        assert router.breakers()["a"]["fail_counter"] == 0
    finally:
        router.close()


async def test_a_deadline_too_short_for_any_attempt_is_a_deadline_error(
    make_router: RouterFactory, sim
) -> None:
    router = make_router({"primary": ["a"]})
    with pytest.raises(DeadlineExceededError) as info:
        await router.acompletion(model="primary", messages=MSG, deadline=0.001)
    assert isinstance(info.value, TimeoutError)
    assert sim.requests() == []


async def test_a_timeout_on_a_single_deployment_group_is_reported_as_a_timeout(
    make_router: RouterFactory, sim
) -> None:
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"attempt_timeout": 0.2},
    )
    sim.set_default("a", Fault.silence(5))
    resp = await router.acompletion(model="primary", messages=MSG)
    report = get_report(resp)
    assert report is not None and report.served_group == "backup"
    classes = [a.error_class for a in report.attempts if a.model_group == "primary"]
    assert classes == [ErrorClass.TIMEOUT]  # no 'circuit_open' skip: the group had nowhere else to go
    assert router.breakers()["a"]["state"] == "closed"


async def _open_breaker(router: ResilientRouter, sim: ProviderSimulator, clock: Any) -> None:
    sim.set_default("a", Fault.server_error(500))
    with pytest.raises(AllRoutesFailedError):
        await router.acompletion(model="primary", messages=MSG)
    assert router.breakers()["a"]["state"] == "open"
    sim.set_default("a", Fault.ok())
    clock.advance(6)  # past FAST_POLICY's reset_timeout (5 s): the next call is a probe


async def test_a_dropped_probe_stream_does_not_wedge_the_breaker(make_router: RouterFactory, sim) -> None:
    import gc

    from llm_resilience_plugin.testing import FakeClock

    clock = FakeClock()
    router = make_router({"primary": ["a"]}, clock=clock)
    await _open_breaker(router, sim, clock)
    stream = await router.acompletion(model="primary", messages=MSG, stream=True)
    assert router.breakers()["a"]["probes_in_flight"] == 1
    del stream  # dropped: never iterated, never closed
    gc.collect()
    assert router.breakers()["a"]["probes_in_flight"] == 0
    resp = await router.acompletion(model="primary", messages=MSG)  # admitted as the next probe
    assert get_report(resp).deployment_id == "a"  # type: ignore[union-attr]
    assert router.breakers()["a"]["state"] == "closed"


async def test_a_probe_that_never_reports_back_frees_its_slot_after_its_lease(
    make_router: RouterFactory, sim
) -> None:
    from llm_resilience_plugin.testing import FakeClock

    clock = FakeClock()
    router = make_router({"primary": ["a"]}, clock=clock)
    await _open_breaker(router, sim, clock)
    kept = await router.acompletion(model="primary", messages=MSG, stream=True)  # held, never read
    with pytest.raises(AllRoutesFailedError):  # its slot is taken: nothing else is admitted
        await router.acompletion(model="primary", messages=MSG)
    clock.advance(11)  # past the probe's lease (the call deadline, 10 s in FAST_POLICY)
    resp = await router.acompletion(model="primary", messages=MSG)
    assert get_report(resp).deployment_id == "a"  # type: ignore[union-attr]
    await kept.aclose()


def test_closing_routers_leaves_no_thread_behind(sim: ProviderSimulator) -> None:
    import threading

    before = threading.active_count()
    for _ in range(10):
        router = ResilientRouter(model_list=[deployment(sim, "primary", "a")], policy=FAST_POLICY)
        router.completion("primary", MSG)  # starts the private loop (and LiteLLM's executor work)
        router.close()
        router.close()  # idempotent
    assert threading.active_count() <= before


async def test_a_deployments_own_timeout_is_its_attempt_timeout(sim: ProviderSimulator) -> None:
    """The user's own LiteLLM settings win: litellm_params.timeout is the attempt timeout (the
    policy's 5 s is only the default), in the call and in the effective policy check prints."""
    import time

    model_list = [deployment(sim, "primary", "a", timeout=0.3), deployment(sim, "backup", "b")]
    router = ResilientRouter(model_list=model_list, policy=FAST_POLICY, fallbacks=[{"primary": ["backup"]}])
    try:
        assert router.effective_policy("primary").attempt_timeout == 0.3
        assert router.effective_policy("backup").attempt_timeout == FAST_POLICY["attempt_timeout"]
        sim.set_default("a", Fault.silence(5))
        t0 = time.monotonic()
        resp = await router.acompletion(model="primary", messages=MSG)
        assert get_report(resp).served_group == "backup"  # type: ignore[union-attr]
        assert time.monotonic() - t0 < 2.0  # one 0.3 s attempt, not the policy's 5 s
    finally:
        router.close()


def test_deployments_without_an_id_get_a_readable_name(sim: ProviderSimulator) -> None:
    first = deployment(sim, "primary", "a")
    second = deployment(sim, "primary", "a")
    for d in (first, second):
        del d["model_info"]
    router = ResilientRouter(model_list=[first, second])
    try:
        ids = [d.id for d in router.deployments()]
        assert ids[0] == "primary/openai/gpt-4o-mini@127.0.0.1:" + str(sim.port)
        assert ids[1] == ids[0] + "#2"
        assert set(router.breakers()) == set(ids)
        resp = router.completion("primary", MSG)
        assert get_report(resp).deployment_id in ids  # type: ignore[union-attr]
    finally:
        router.close()
