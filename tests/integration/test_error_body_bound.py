"""A provider's long error body does not stall the event loop: the plugin's attempts get it cut at
the HTTP transport, before LiteLLM redacts it on the loop (six passes or so per error, over the
message and the traceback repeating it). Real calls against the simulator over loopback; the
lag is what a ticker task sees while the errors come back."""

from __future__ import annotations

import time

import litellm
import pytest

from llm_resilience_plugin import ResilientRouter, get_report
from llm_resilience_plugin._error_bodies import ERROR_BODY_LIMIT
from llm_resilience_plugin._litellm import capabilities
from llm_resilience_plugin.errors import ErrorClass
from llm_resilience_plugin.testing import FakeClock, Fault, ProviderSimulator
from tests.conftest import FAST_POLICY, MSG, deployment, worst_loop_lag

ECHO = "The input was: " + "lorem ipsum dolor " * 17_000  # ~306 kB echoed back, as providers do


def _router(sim: ProviderSimulator, dispatch: str = "auto") -> ResilientRouter:
    return ResilientRouter(
        model_list=[deployment(sim, "g", "a")],
        policy={**FAST_POLICY, "dispatch": dispatch},
        clock=FakeClock(),
    )


@pytest.mark.parametrize("dispatch", ["auto", "router"])
async def test_a_300_kb_error_body_does_not_stall_the_loop(sim: ProviderSimulator, dispatch: str) -> None:
    assert capabilities()["error_body_bound"].available
    router = _router(sim, dispatch)
    errors: list[BaseException] = []
    try:
        await router.acompletion(model="g", messages=MSG)  # warm: imports, clients

        async def three_errors() -> None:
            for _ in range(3):
                with pytest.raises(litellm.BadRequestError) as bad:
                    await router.acompletion(model="g", messages=MSG)
                errors.append(bad.value)

        sim.set_default("a", Fault.http_error(400, message=ECHO))
        lag = await worst_loop_lag(three_errors)
    finally:
        await router.aclose()
    # Before: LiteLLM redacted ~2 MB of text per such error on the loop (1-4 s held here).
    assert lag < 0.3, f"loop held {lag:.3f} s"
    text = str(errors[-1])
    assert len(text) < 2 * ERROR_BODY_LIMIT, len(text)
    assert (
        text.count("lorem") > 100 and "more characters not shown]" in text
    )  # the head, and how much was cut
    report = get_report(errors[-1])
    assert report is not None and report.attempts[-1].error_class is ErrorClass.BAD_REQUEST
    assert report.attempts[-1].status == 400


async def test_a_stream_refused_with_a_long_body_is_cut_the_same(sim: ProviderSimulator) -> None:
    router = _router(sim)
    try:
        sim.set_default("a", Fault.http_error(400, message=ECHO))
        with pytest.raises(litellm.BadRequestError) as bad:
            stream = await router.acompletion(model="g", messages=MSG, stream=True)
            [c async for c in stream]
    finally:
        await router.aclose()
    assert len(str(bad.value)) < 2 * ERROR_BODY_LIMIT and "more characters not shown]" in str(bad.value)


async def test_a_cut_body_keeps_its_meaning(sim: ProviderSimulator) -> None:
    """The provider's words come first: a context-window refusal followed by an echo is still one;
    a 429's Retry-After header is kept."""
    router = _router(sim)
    try:
        message = "This model's maximum context length is 8192 tokens. " + ECHO
        sim.set_default("a", Fault.http_error(400, message=message, code="context_length_exceeded"))
        with pytest.raises(litellm.ContextWindowExceededError) as ctx:
            await router.acompletion(model="g", messages=MSG)
        report = get_report(ctx.value)
        assert report is not None and report.attempts[-1].error_class is ErrorClass.CONTEXT_WINDOW
        assert len(str(ctx.value)) < 2 * ERROR_BODY_LIMIT
        sim.set_default("a", Fault.http_error(429, message=ECHO, retry_after=7, code="rate_limit_exceeded"))
        with pytest.raises(Exception) as limited:
            await router.acompletion(model="g", messages=MSG)
        report = get_report(limited.value)
        assert report is not None and report.attempts[0].error_class is ErrorClass.RATE_LIMIT
        assert len(str(limited.value)) < 4 * ERROR_BODY_LIMIT
    finally:
        await router.aclose()


async def test_an_anthropic_error_body_is_cut_too(sim: ProviderSimulator) -> None:
    """LiteLLM's own HTTP handler (Anthropic and the other non-SDK providers) builds its
    transports the same way as the OpenAI SDK's clients."""
    dep = {
        "model_name": "g",
        "litellm_params": {
            "model": "anthropic/claude-haiku-4-5",
            "api_base": sim.anthropic_base("c"),
            "api_key": "sk-ant-sim",
        },
        "model_info": {"id": "c"},
    }
    router = ResilientRouter(model_list=[dep], policy=FAST_POLICY, clock=FakeClock())
    try:
        sim.set_default("c", Fault.http_error(400, message=ECHO))
        with pytest.raises(litellm.BadRequestError) as bad:
            await router.acompletion(model="g", messages=MSG)
    finally:
        await router.aclose()
    assert len(str(bad.value)) < 2 * ERROR_BODY_LIMIT and "more characters not shown]" in str(bad.value)


async def test_calls_outside_the_plugin_get_the_whole_body(sim: ProviderSimulator) -> None:
    """Only the plugin's attempts are cut: LiteLLM called directly in the same process is not."""
    sim.set_default("a", Fault.http_error(400, message=ECHO))
    with pytest.raises(litellm.BadRequestError) as bad:
        await litellm.acompletion(
            model="openai/gpt-4o-mini",
            api_base=sim.api_base("a"),
            api_key="sk-sim-secret",
            messages=MSG,
            max_retries=0,
        )
    assert ECHO.strip()[-200:] in str(bad.value)


def test_the_blocking_api_gets_the_cut_too(sim: ProviderSimulator) -> None:
    """``completion()`` runs its attempts on the router's private loop: the same cut."""
    router = _router(sim)
    try:
        sim.set_default("a", Fault.http_error(400, message=ECHO))
        started = time.perf_counter()
        with pytest.raises(litellm.BadRequestError) as bad:
            router.completion(model="g", messages=MSG)
        assert time.perf_counter() - started < 2.0
    finally:
        router.close()
    assert len(str(bad.value)) < 2 * ERROR_BODY_LIMIT and "more characters not shown]" in str(bad.value)
