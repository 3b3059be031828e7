"""Failure-mode depth: layered timeouts, stream restarts, hedging, idempotency, degradation and
priority tiers, each asserting the caller's outcome and the simulator's request log."""

from __future__ import annotations

import asyncio
import time

import litellm
import pytest

from llm_resilience_plugin import ConfigError, ErrorClass, get_report
from llm_resilience_plugin._engine.idempotency import fingerprint
from llm_resilience_plugin.errors import LoadShedError
from llm_resilience_plugin.events import CallReport, HedgeSent, StreamRestart, hidden_params_of
from llm_resilience_plugin.testing import Clock
from llm_resilience_plugin.testing._simulator import Fault
from tests.conftest import MSG, RouterFactory

LONG = [{"role": "user", "content": "tell me a long story about cats and dogs and birds"}]


def p95(values: list[float]) -> float:
    values = sorted(values)
    return values[int(0.95 * (len(values) - 1))]


# -- layered timeouts -----------------------------------------------------------------------------


async def test_per_call_attempt_timeout_overrides_policy(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"attempt_timeout": 5},
        clock=Clock(),
    )
    sim.set_default("a", Fault.silence(max_hold=5))
    t0 = time.monotonic()
    resp = await router.acompletion(model="primary", messages=MSG, attempt_timeout=0.3)
    assert time.monotonic() - t0 < 1.5
    assert get_report(resp).served_group == "backup"  # type: ignore[union-attr]
    # LiteLLM's own `timeout=` argument means the same thing (LangChain passes it).
    sim.clear_log()
    t0 = time.monotonic()
    await router.acompletion(model="primary", messages=MSG, timeout=0.3)
    assert time.monotonic() - t0 < 1.5 and sim.count("a") == 1


async def test_stream_idle_timeout_detects_a_stall_within_the_limit(make_router: RouterFactory, sim):
    from llm_resilience_plugin import StreamInterruptedError

    router = make_router({"primary": ["a"]}, policy={"attempt_timeout": 5}, clock=Clock())
    sim.set_default("a", Fault.stream_stall(after_chunks=2, seconds=5))
    stream = await router.acompletion(
        model="primary", messages=LONG, stream=True, stream_idle_timeout=0.3, recover_streams=False
    )
    t0 = time.monotonic()
    with pytest.raises(StreamInterruptedError) as info:
        async for _ in stream:
            pass
    assert time.monotonic() - t0 < 1.2
    assert info.value.partial_text
    assert get_report(stream).attempts[-1].error_class is ErrorClass.TIMEOUT  # type: ignore[union-attr]


async def test_first_chunk_timeout_per_call(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}], clock=Clock()
    )
    sim.set_default("a", Fault.slow_first_token(2))
    t0 = time.monotonic()
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, first_chunk_timeout=0.3)
    async for _ in stream:
        pass
    assert time.monotonic() - t0 < 1.5
    assert get_report(stream).served_group == "backup"  # type: ignore[union-attr]


async def test_bad_per_call_options_fail_before_sending(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a"]})
    for kwargs, field in [
        ({"attempt_timeout": -1}, "attempt_timeout"),
        ({"first_chunk_timeout": "x"}, "first_chunk_timeout"),
        ({"priority": "P9"}, "priority"),
        ({"idempotency_key": ""}, "idempotency_key"),
    ]:
        with pytest.raises(ConfigError) as info:
            await router.acompletion(model="primary", messages=MSG, **kwargs)
        assert info.value.field == field
    assert sim.count() == 0


# -- stream restart (opt-in) ----------------------------------------------------------------------


async def test_broken_stream_restarts_on_fallback_with_marker(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"restart_broken_streams": True, "breaker": {"fail_max": 1}},
    )
    sim.set_default("a", Fault.stream_cut(after_chunks=3))
    events: list[object] = []
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, listener=events.append)
    items = [c async for c in stream]
    markers = [c for c in items if isinstance(c, StreamRestart)]
    assert len(markers) == 1 and markers[0].discarded_text.startswith("Hello from a.")
    after = items[items.index(markers[0]) + 1 :]
    text = "".join(c.choices[0].delta.content or "" for c in after if c.choices)
    assert text.startswith("Hello from b.") and text.endswith(".")
    rep = get_report(stream)
    assert rep is not None and rep.stream_restarts == 1 and rep.outcome == "success"
    assert any(isinstance(e, StreamRestart) for e in events)
    # The router stays healthy: the next call is served (by the backup while a's breaker is open).
    resp = await router.acompletion(model="primary", messages=MSG)
    assert get_report(resp).served_group == "backup"  # type: ignore[union-attr]


# -- hedging --------------------------------------------------------------------------------------


async def test_hedging_cuts_the_tail_and_cancels_the_loser(make_router: RouterFactory, sim):
    hedge = {"delay": 0.05, "max_extra_fraction": 1.0}
    plain = make_router({"primary": ["a", "b"]}, clock=Clock())
    hedged = make_router({"primary": ["a", "b"]}, policy={"hedge": hedge}, clock=Clock())
    sim.set_default("a", Fault.ok(latency=0.6))

    async def latencies(router, n: int = 16) -> list[float]:
        out = []
        for _ in range(n):
            t = time.monotonic()
            await router.acompletion(model="primary", messages=MSG)
            out.append(time.monotonic() - t)
        return out

    slow = await latencies(plain)
    sim.clear_log()
    events: list[object] = []
    hedged.subscribe(events.append)
    fast = await latencies(hedged)
    assert p95(slow) > 0.5
    assert p95(fast) < 0.3
    hedges = [e for e in events if isinstance(e, HedgeSent)]
    # Calls that went to the slow "a" first were hedged; on a loaded machine "b" can also take
    # longer than the 50 ms delay now and then, and its hedge is as legitimate.
    assert any(h.first_deployment == "a" for h in hedges)
    # The loser was cancelled, counted neither way, and released.
    assert hedged.breakers()["a"]["fail_counter"] == 0
    cancelled = [e for e in events if type(e).__name__ == "AttemptRecord" and e.outcome == "cancelled"]
    assert len(cancelled) == len(hedges)
    assert sim.count() == 16 + len(hedges)


async def test_a_hedge_race_numbers_each_attempt_as_it_opened(make_router: RouterFactory, sim):
    """The first attempt and its hedge are attempts 1 and 2 in the report, whichever ends first."""
    router = make_router({"primary": ["a", "b"]}, policy={"hedge": {"delay": 0.05}}, clock=Clock())
    sim.set_default("a", Fault.ok(latency=0.4))
    sim.set_default("b", Fault.ok(latency=0.4))
    resp = await router.acompletion(model="primary", messages=MSG)
    rep = get_report(resp)
    assert rep is not None and rep.hedged
    numbers = {a.deployment_id: a.attempt for a in rep.attempts}
    assert sorted(numbers.values()) == [1, 2], rep.attempts


async def test_hedges_stay_within_the_configured_fraction(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a", "b"]},
        policy={"hedge": {"delay": 0.02, "max_extra_fraction": 0.25}},
        clock=Clock(),
    )
    sim.set_default("a", Fault.ok(latency=0.15))
    sim.set_default("b", Fault.ok(latency=0.15))
    n = 24
    for _ in range(n):
        await router.acompletion(model="primary", messages=MSG)
    extra = sim.count() - n
    assert 1 <= extra <= int(0.25 * n) + 1


async def test_no_hedge_for_non_idempotent_calls(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a", "b"]}, policy={"hedge": {"delay": 0.02}}, clock=Clock())
    sim.set_default("a", Fault.ok(latency=0.2))
    sim.set_default("b", Fault.ok(latency=0.2))
    for _ in range(6):
        resp = await router.acompletion(model="primary", messages=MSG, idempotent=False)
        assert not get_report(resp).hedged  # type: ignore[union-attr]
    assert sim.count() == 6


async def test_hedge_delay_learned_from_p95(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a", "b"]},
        policy={"hedge": {"delay": "p95", "min_samples": 5, "initial_delay": 5}},
        clock=Clock(),
    )
    for _ in range(8):
        await router.acompletion(model="primary", messages=MSG)
    learned = router.engine.hedges["primary"].delay()
    assert 0.0 < learned < 1.0  # learned from real latencies, not the 5 s initial delay


# -- idempotency ----------------------------------------------------------------------------------


async def test_repeated_key_makes_no_second_upstream_request(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a"]}, idempotency_store="memory")
    first = await router.acompletion(model="primary", messages=MSG, idempotency_key="order-42")
    second = await router.acompletion(model="primary", messages=MSG, idempotency_key="order-42")
    assert sim.count("a") == 1
    assert second.choices[0].message.content == first.choices[0].message.content
    rep = get_report(second)
    assert rep is not None and rep.replayed and rep.idempotency_key == "order-42" and rep.response_cost == 0


async def test_default_key_is_a_content_fingerprint_and_concurrent_duplicates_share_one_request(
    make_router: RouterFactory, sim
):
    router = make_router({"primary": ["a"]}, idempotency_store="memory")
    sim.set_default("a", Fault.ok(latency=0.2))
    results = await asyncio.gather(*(router.acompletion(model="primary", messages=MSG) for _ in range(5)))
    assert sim.count("a") == 1
    keys = {get_report(r).idempotency_key for r in results}  # type: ignore[union-attr]
    assert len(keys) == 1 and next(iter(keys)).startswith("fp-")
    other = await router.acompletion(model="primary", messages=[{"role": "user", "content": "different"}])
    assert get_report(other).idempotency_key not in keys  # type: ignore[union-attr]
    assert sim.count("a") == 2


async def test_sqlite_idempotency_store_survives_a_new_router(make_router: RouterFactory, sim, tmp_path):
    url = f"sqlite:///{tmp_path / 'idem.db'}"
    r1 = make_router({"primary": ["a"]}, idempotency_store=url)
    await r1.acompletion(model="primary", messages=MSG, idempotency_key="k1")
    r2 = make_router({"primary": ["a"]}, idempotency_store=url)
    resp = await r2.acompletion(model="primary", messages=MSG, idempotency_key="k1")
    assert sim.count("a") == 1 and get_report(resp).replayed  # type: ignore[union-attr]


async def test_idempotency_key_is_reported_without_a_store(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a"]})
    resp = await router.acompletion(model="primary", messages=MSG, idempotency_key="abc")
    assert get_report(resp).idempotency_key == "abc"  # type: ignore[union-attr]
    await router.acompletion(model="primary", messages=MSG, idempotency_key="abc")
    assert sim.count("a") == 2  # no store: every call goes upstream


async def test_fingerprint_without_a_store_is_of_the_request_as_sent(make_router: RouterFactory, sim):
    """The content key is hashed only when read, yet it is the key of what was sent: appending the
    answer to the conversation afterwards does not change it."""
    router = make_router({"primary": ["a"]})
    history = [dict(m) for m in MSG]
    resp = await router.acompletion(model="primary", messages=history)
    history.append({"role": "assistant", "content": "hello"})
    key = get_report(resp).idempotency_key  # type: ignore[union-attr]
    assert key == fingerprint("primary", MSG, {})
    again = await router.acompletion(model="primary", messages=[dict(m) for m in MSG])
    assert get_report(again).idempotency_key == key  # type: ignore[union-attr]
    other = await router.acompletion(model="primary", messages=history)
    assert get_report(other).idempotency_key != key  # type: ignore[union-attr]


# -- degradation ----------------------------------------------------------------------------------


def history(turns: int) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        msgs.append({"role": "user", "content": f"question {i} " + "lorem ipsum " * 30})
        msgs.append({"role": "assistant", "content": f"answer {i} " + "dolor sit " * 30})
    msgs.append({"role": "user", "content": "and finally, the latest question?"})
    return msgs


async def test_context_overflow_trims_history_and_retries_once(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a"]},
        policy={"degradation": {"trim_context_on_overflow": True, "keep_last_messages": 1}},
    )
    sim.set_context_window("a", 300)
    msgs = history(6)
    resp = await router.acompletion(model="primary", messages=msgs)
    rep = get_report(resp)
    assert rep is not None and any(d.startswith("context trimmed") for d in rep.degraded)
    first, second = sim.requests("a")
    assert first.behavior == "context_window" and second.behavior == "ok"
    sent = second.body["messages"]
    assert len(sent) < len(msgs)
    assert sent[0]["role"] == "system" and sent[-1]["content"] == "and finally, the latest question?"
    assert msgs == history(6)  # the caller's list is untouched


async def test_context_overflow_without_trim_raises_and_never_resends(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a"]})
    sim.set_context_window("a", 300)
    with pytest.raises(litellm.ContextWindowExceededError):
        await router.acompletion(model="primary", messages=history(6))
    assert sim.count("a") == 1


async def test_static_answer_when_every_route_fails(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a"]},
        policy={"degradation": {"static_answers": {"faq": "We are busy; please try again shortly."}}},
    )
    sim.set_default("a", Fault.server_error(503))
    resp = await router.acompletion(model="primary", messages=MSG, scenario="faq")
    assert resp.choices[0].message.content == "We are busy; please try again shortly."
    rep = get_report(resp)
    assert rep is not None and rep.degraded == ["static answer: faq"] and rep.outcome == "success"
    assert hidden_params_of(resp)["degraded"] == "static_answer"
    seen: list[object] = []
    stream = await router.acompletion(
        model="primary", messages=MSG, scenario="faq", stream=True, listener=seen.append
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.content.startswith("We are busy")
    assert [e.outcome for e in seen if isinstance(e, CallReport)] == ["success"]  # published once read
    # Off by default: without a scenario the failure surfaces.
    from llm_resilience_plugin import AllRoutesFailedError

    with pytest.raises(AllRoutesFailedError):
        await router.acompletion(model="primary", messages=MSG)


async def test_capability_degradation_per_fallback_level(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"degradation": {"levels": {1: {"max_tokens": 5, "drop_tools": True}}}},
    )
    sim.set_default("a", Fault.server_error(500))
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    resp = await router.acompletion(model="primary", messages=MSG, tools=tools, max_tokens=100)
    body = sim.requests("b")[0].body
    assert body["max_tokens"] == 5 and "tools" not in body
    assert sim.requests("a")[0].body["max_tokens"] == 100
    rep = get_report(resp)
    assert rep is not None and rep.degraded == ["fallback level 1: max_tokens=5, tools dropped"]


# -- priority tiers -------------------------------------------------------------------------------


async def test_lowest_tier_is_shed_first_when_the_retry_budget_runs_low(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a"]},
        policy={"breaker": {"enabled": False}, "retry_budget": {"capacity": 10}},
    )
    sim.set_default("a", Fault.server_error(500))
    from llm_resilience_plugin import AllRoutesFailedError

    for _ in range(2):
        with pytest.raises(AllRoutesFailedError):
            await router.acompletion(model="primary", messages=MSG, priority="P0")
    assert router.retry_budget("primary").fraction < 0.5
    before = sim.count("a")
    with pytest.raises(LoadShedError) as info:
        await router.acompletion(model="primary", messages=MSG, priority="P3")
    assert "P3" in str(info.value) and "retry budget" in str(info.value)
    assert sim.count("a") == before  # shed before anything was sent
    sim.set_default("a", Fault.ok())
    resp = await router.acompletion(model="primary", messages=MSG, priority="P0")
    assert resp.choices[0].message.content


async def test_tier_limits_retries_and_fallback_depth(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a"], "backup": ["b"], "last": ["c"]},
        fallbacks=[{"primary": ["backup", "last"]}],
        policy={"breaker": {"enabled": False}},
    )
    sim.set_default("a", Fault.server_error(500))
    sim.set_default("b", Fault.server_error(500))
    from llm_resilience_plugin import AllRoutesFailedError

    with pytest.raises(AllRoutesFailedError):
        await router.acompletion(model="primary", messages=MSG, priority="P3")
    # P3: no retries, and at most one fallback level.
    assert (sim.count("a"), sim.count("b"), sim.count("c")) == (1, 1, 0)
    sim.clear_log()
    resp = await router.acompletion(model="primary", messages=MSG, priority="P0")
    assert get_report(resp).served_group == "last"  # type: ignore[union-attr]
    assert (sim.count("a"), sim.count("b"), sim.count("c")) == (3, 3, 1)


# -- mid-stream continuation by assistant prefill (opt-in) ----------------------------------------


def prefill_router(sim, policy):
    from llm_resilience_plugin import ResilientRouter
    from llm_resilience_plugin.testing import FakeClock
    from tests.conftest import FAST_POLICY, _merge, deployment

    backup = deployment(sim, "backup", "b")
    backup["model_info"]["supports_assistant_prefill"] = True
    return ResilientRouter(
        model_list=[deployment(sim, "primary", "a"), backup, deployment(sim, "plain", "c")],
        fallbacks=[{"primary": ["backup", "plain"]}],
        policy=_merge(FAST_POLICY, policy),
        clock=FakeClock(),
    )


async def test_broken_stream_continues_by_prefill_where_supported(sim):
    router = prefill_router(sim, {"continue_streams_with_prefill": True})
    sim.set_default("a", Fault.stream_cut(after_chunks=3))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    items = [c async for c in stream]
    marker = next(c for c in items if isinstance(c, StreamRestart))
    assert marker.mode == "continue" and marker.discarded_text.startswith("Hello from a.")
    sent = sim.requests("b")[0].body["messages"]
    assert sent[-1] == {"role": "assistant", "content": marker.discarded_text, "prefix": True}
    rest = "".join(c.choices[0].delta.content or "" for c in items[items.index(marker) + 1 :] if c.choices)
    assert rest.startswith("You said:")  # b continues a's words
    assert sim.count("c") == 0  # only a prefill-capable deployment may continue
    router.close()


async def test_rejected_prefill_never_hides_the_original_failure(sim):
    from llm_resilience_plugin import StreamInterruptedError

    router = prefill_router(sim, {"continue_streams_with_prefill": True})
    sim.set_default("a", Fault.stream_cut(after_chunks=3))
    sim.set_default("b", Fault.http_error(400, "assistant prefill is not supported here"))
    # A refused prefill restarts from scratch (c first, the refuser b last, see
    # test_stream_prefill.py); with c down too, the original failure is what surfaces.
    sim.set_default("c", Fault.http_error(503, "down"))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    with pytest.raises(StreamInterruptedError) as info:
        async for _ in stream:
            pass
    assert "Connection error" in str(info.value.cause)
    assert info.value.partial_text.startswith("Hello from a.")
    assert sim.count("b") == 2 and sim.count("c") >= 1  # the prefill, then b from scratch last
    router.close()


async def test_a_call_waiting_on_an_identical_one_keeps_its_own_deadline(make_router: RouterFactory, sim):
    """Single-flight: the follower waits for the leader's answer only as long as its own deadline."""
    from llm_resilience_plugin import DeadlineExceededError

    router = make_router({"primary": ["a"]}, idempotency_store="memory", clock=Clock())
    sim.set_default("a", Fault.ok(latency=1.5))
    leader = asyncio.create_task(router.acompletion(model="primary", messages=MSG, idempotency_key="k1"))
    await asyncio.sleep(0.1)
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceededError) as info:
        await router.acompletion(model="primary", messages=MSG, idempotency_key="k1", deadline=0.3)
    assert time.monotonic() - t0 < 1.0
    assert info.value.report.outcome == "failure"
    assert (await leader).choices[0].message.content  # the leader is not disturbed
    assert sim.count("a") == 1
