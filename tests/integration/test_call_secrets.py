"""A call's own credentials and a huge error body, through real calls against the simulator: a
per-call ``api_key`` never reaches an exception, a report or a log line; a 100 kB error body does
not block the loop; a router's keys are forgotten when it closes; nothing shows a credential."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import litellm
import pytest

from llm_resilience_plugin import AllRoutesFailedError, ResilientRouter, StreamInterruptedError, get_report
from llm_resilience_plugin._redaction import REDACTED, scrub
from llm_resilience_plugin.observability import JsonFormatter, attach_router_logging
from llm_resilience_plugin.testing import FakeClock, Fault, ProviderSimulator
from tests.conftest import FAST_POLICY, MSG, deployment, worst_loop_lag

CALL_KEY = "byok-0f1e2d3c4b5a69788796a5b4"  # no key shape: only registration catches it


@pytest.fixture
def json_logs() -> Iterator[io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("llm_resilience")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield out
    logger.removeHandler(handler)
    logger.setLevel(level)


def _router(sim: ProviderSimulator, **kw: Any) -> ResilientRouter:
    return ResilientRouter(
        model_list=[deployment(sim, "primary", "a"), deployment(sim, "backup", "b")],
        policy=FAST_POLICY,
        fallbacks=[{"primary": ["backup"]}],
        clock=FakeClock(),
        **kw,
    )


async def test_a_per_call_api_key_echoed_by_the_provider_never_leaks(
    sim: ProviderSimulator, json_logs: io.StringIO
) -> None:
    router = _router(sim)
    detach = attach_router_logging(router)
    echo = f"Incorrect API key provided: {CALL_KEY}"
    try:
        sim.set_default("a", Fault.http_error(400, message=echo))
        with pytest.raises(litellm.BadRequestError) as bad:
            await router.acompletion(model="primary", messages=MSG, api_key=CALL_KEY)
        assert CALL_KEY not in str(bad.value) and REDACTED in str(bad.value)
        report = get_report(bad.value)
        assert report is not None and CALL_KEY not in json.dumps(report.to_dict(), default=str)
        # Served by the fallback after a 500 that echoed it; and nothing serving it.
        sim.set_default("a", Fault.http_error(500, message=echo))
        resp = await router.acompletion(model="primary", messages=MSG, api_key=CALL_KEY)
        assert CALL_KEY not in json.dumps(get_report(resp).to_dict(), default=str)  # type: ignore[union-attr]
        sim.set_default("b", Fault.http_error(503, message=echo))
        with pytest.raises(AllRoutesFailedError) as failed:
            router.completion(model="primary", messages=MSG, api_key=CALL_KEY)  # the blocking twin
        assert CALL_KEY not in str(failed.value) + repr(failed.value.attempts)
        # A stream that fails before its first chunk.
        with pytest.raises(AllRoutesFailedError) as streamed:
            stream = await router.acompletion(model="primary", messages=MSG, api_key=CALL_KEY, stream=True)
            [c async for c in stream]
        assert CALL_KEY not in str(streamed.value)
        assert json_logs.getvalue() and CALL_KEY not in json_logs.getvalue()
    finally:
        detach()
        router.close()
    # Held for the call's lifetime only: afterwards it is no secret of this process.
    assert scrub(CALL_KEY) == CALL_KEY


async def test_a_100_kb_error_body_does_not_block_the_loop(
    sim: ProviderSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llm_resilience_plugin._engine import attempts

    spent: list[float] = []
    real = attempts.classify

    def timed(exc: BaseException) -> Any:
        t0 = time.perf_counter()
        try:
            return real(exc)
        finally:
            spent.append(time.perf_counter() - t0)

    monkeypatch.setattr(attempts, "classify", timed)
    router = _router(sim)
    body = "The input was: " + "lorem ipsum dolor " * 6_000  # ~108 kB echoed back, as providers do
    sim.set_default("a", Fault.http_error(400, message=body))
    errors: list[BaseException] = []

    async def three_errors() -> None:
        for _ in range(3):
            with pytest.raises(litellm.BadRequestError) as bad:
                await router.acompletion(model="primary", messages=MSG)
            errors.append(bad.value)

    try:
        lag = await worst_loop_lag(three_errors)
    finally:
        router.close()
    # Before: every error scrubbed ~9 times by a quadratic pattern, 47 s of blocked loop. The
    # plugin's share is now a few milliseconds; LiteLLM's own redaction of the body is bounded by
    # the transport's cut (tests/integration/test_error_body_bound.py).
    assert len(spent) == 3 and sum(spent) < 0.05, spent
    assert lag < 2.0, f"loop blocked {lag:.3f} s"
    assert "more characters not shown" in str(errors[-1])  # the record keeps a bounded part


def test_a_closed_routers_keys_are_forgotten(sim: ProviderSimulator) -> None:
    own = "live-7a6b5c4d3e2f1a0b9c8d"
    model_list = [deployment(sim, "g", "a", api_key=own)]
    first, second = ResilientRouter(model_list=model_list), ResilientRouter(model_list=model_list)
    assert scrub(own) == REDACTED
    first.close()
    assert scrub(own) == REDACTED  # the other router still holds it
    second.close()
    assert scrub(own) == own


def test_deployments_and_check_show_no_credential(sim: ProviderSimulator, tmp_path: Any, capsys: Any) -> None:
    from llm_resilience_plugin.cli import main

    base = sim.api_base("a") + "?key=AIzaQueryKey123&alt=sse"
    dep = deployment(
        sim,
        "g",
        "a",
        api_base=base,
        extra_headers={"X-Gateway-Token": "hdr-secret-value-1234"},
        vertex_credentials='{"private_key": "-----BEGIN PRIVATE KEY-----MIIEv", "client_email": "x@y"}',
        aws_secret_access_key="aws-secret-value-123456",
        aws_session_token="aws-session-value-123456",
    )
    held = ("hdr-secret-value-1234", "aws-secret-value-123456", "aws-session-value-123456")
    secrets = ("AIzaQueryKey123", "MIIEv", *held)
    router = ResilientRouter(model_list=[dep])
    try:
        shown = repr(router.deployments())
        assert not any(s in shown for s in secrets), shown
        assert "key=***" in shown and "'X-Gateway-Token': '***'" in shown
        # Echoed by a provider, each is scrubbed while the router is open.
        assert not any(s in scrub(f"echo {s}") for s in held)
    finally:
        router.close()
    cfg = tmp_path / "router.yaml"
    cfg.write_text(
        json.dumps({"model_list": [{**dep, "litellm_params": {**dep["litellm_params"], "api_key": "sk-x"}}]})
    )
    assert main(["check", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "deployment a" in out and not any(s in out for s in secrets), out


async def test_a_streams_own_key_is_let_go_when_the_stream_ends_not_when_it_is_collected(
    sim: ProviderSimulator,
) -> None:
    router = _router(sim)
    try:
        sim.set_default("a", Fault.ok(text="one two three four"))
        # Read to its end: held while chunks come, let go at the last one (the stream still alive).
        stream = await router.acompletion(model="primary", messages=MSG, api_key=CALL_KEY, stream=True)
        async for _ in stream:
            assert scrub(CALL_KEY) == REDACTED
        assert scrub(CALL_KEY) == CALL_KEY
        # Closed early.
        early = await router.acompletion(model="primary", messages=MSG, api_key=CALL_KEY, stream=True)
        await early.__aiter__().__anext__()
        assert scrub(CALL_KEY) == REDACTED
        await early.aclose()
        assert scrub(CALL_KEY) == CALL_KEY
        # The blocking twin, read to its end.
        blocking = router.completion(model="primary", messages=MSG, api_key=CALL_KEY, stream=True)
        assert [c for c in blocking] and scrub(CALL_KEY) == CALL_KEY
        # Broken after content with no route left: held until the error is raised, then let go.
        sim.set_default("a", Fault.stream_cut(after_chunks=2))
        sim.set_default("b", Fault.stream_cut(after_chunks=0))
        broken = await router.acompletion(model="primary", messages=MSG, api_key=CALL_KEY, stream=True)
        with pytest.raises(StreamInterruptedError) as failed:
            async for _ in broken:
                assert scrub(CALL_KEY) == REDACTED
        assert CALL_KEY not in str(failed.value)
        assert scrub(CALL_KEY) == CALL_KEY
    finally:
        router.close()
    # Cut by the router's shutdown.
    closing = _router(sim)
    sim.set_default("a", Fault.ok(text="word " * 400, chunk_delay=0.05))
    cut = await closing.acompletion(model="primary", messages=MSG, api_key=CALL_KEY, stream=True)
    await cut.__aiter__().__anext__()
    assert scrub(CALL_KEY) == REDACTED
    await closing.aclose(grace=0)
    assert scrub(CALL_KEY) == CALL_KEY
    assert cut.report.outcome == "cancelled"
