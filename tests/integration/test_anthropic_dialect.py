"""The simulator's Anthropic Messages dialect: its wire format (checked with plain HTTP) and every
fault as LiteLLM's ``anthropic/`` provider surfaces it."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import litellm
import pytest

from llm_resilience_plugin.testing import Behavior
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator
from tests.conftest import requires_capability

HEADERS = {"x-api-key": "sk-ant-sim", "anthropic-version": "2023-06-01"}
BODY: dict[str, Any] = {
    "model": "claude-3-5-haiku-latest",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": [{"type": "text", "text": "look up order 42"}]}],
}
TOOL = {
    "name": "lookup_order",
    "input_schema": {"type": "object", "properties": {"order_id": {"type": "integer"}}},
}


def _post(sim: ProviderSimulator, body: dict[str, Any], headers: dict[str, str] = HEADERS) -> httpx.Response:
    return httpx.post(
        f"{sim.anthropic_base('c')}/v1/messages", json=body, headers=headers, timeout=5, trust_env=False
    )


def _events(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


# -- the wire ---------------------------------------------------------------------------------------


def test_a_message_has_anthropics_shape(sim: ProviderSimulator) -> None:
    resp = _post(sim, BODY)
    assert resp.status_code == 200 and resp.headers["x-simulator-deployment"] == "c"
    body = resp.json()
    assert body["type"] == "message" and body["role"] == "assistant" and body["model"] == BODY["model"]
    assert body["content"] == [{"type": "text", "text": "Hello from c. You said: look up order 42."}]
    assert body["stop_reason"] == "end_turn"
    assert body["usage"]["input_tokens"] == 2 + 4 + 4 and body["usage"]["output_tokens"] == 9
    tool = _post(sim, {**BODY, "tools": [TOOL]}).json()
    assert tool["stop_reason"] == "tool_use"
    (block,) = tool["content"]
    assert block["id"].startswith("toolu_sim_")
    assert block == {"type": "tool_use", "id": block["id"], "name": "lookup_order", "input": {"order_id": 42}}
    short = _post(sim, {**BODY, "max_tokens": 2}).json()
    assert short["stop_reason"] == "max_tokens" and short["content"][0]["text"] == "Hello from "


def test_a_stream_is_anthropics_event_sequence(sim: ProviderSimulator) -> None:
    events = _events(_post(sim, {**BODY, "stream": True}).text)
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[3:-3] == ["content_block_delta"] * 9
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in events)
    assert events[0][1]["message"]["usage"]["input_tokens"] == 10
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == "Hello from c. You said: look up order 42."
    assert (
        events[-2][1]["delta"]["stop_reason"] == "end_turn" and events[-2][1]["usage"]["output_tokens"] == 9
    )
    tool = _events(_post(sim, {**BODY, "stream": True, "tools": [TOOL]}).text)
    block = tool[1][1]["content_block"]
    assert block == {"type": "tool_use", "id": block["id"], "name": "lookup_order", "input": {}}
    assert block["id"].startswith("toolu_sim_")
    partial = "".join(d["delta"]["partial_json"] for n, d in tool if n == "content_block_delta")
    assert json.loads(partial) == {"order_id": 42}
    assert tool[-2][1]["delta"]["stop_reason"] == "tool_use"


@pytest.mark.parametrize(
    ("fault", "status", "kind"),
    [
        (Fault.rate_limit(retry_after=3), 429, "rate_limit_error"),
        (Fault.overloaded(retry_after=0.5), 529, "overloaded_error"),
        (Fault.server_error(503), 503, "api_error"),
        (Fault.auth(), 401, "authentication_error"),
        (Fault.not_found(), 404, "not_found_error"),
    ],
)
def test_errors_have_anthropics_body_and_keep_retry_after(
    sim: ProviderSimulator, fault: Behavior, status: int, kind: str
) -> None:
    sim.script("c", fault)
    resp = _post(sim, BODY)
    assert resp.status_code == status
    body = resp.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"]
    if fault.retry_after is not None:
        assert float(resp.headers["retry-after"]) == fault.retry_after
    sim.script("c", Fault.context_length(5))
    assert _post(sim, BODY).json()["error"]["message"] == "prompt is too long: 10 tokens > 5 maximum"


@pytest.mark.parametrize(
    ("change", "status", "needle"),
    [
        ({"headers": {"anthropic-version": "2023-06-01"}}, 401, "x-api-key"),
        ({"headers": {"x-api-key": "k"}}, 400, "anthropic-version"),
        ({"drop": "max_tokens"}, 400, "max_tokens"),
        ({"messages": []}, 400, "at least one message"),
        ({"messages": [{"role": "system", "content": "x"}]}, 400, "messages.0.role"),
        ({"tools": [{"name": "t"}]}, 400, "input_schema"),
        (
            {
                "messages": [
                    BODY["messages"][0],
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}}],
                    },
                    {"role": "user", "content": "and?"},
                ]
            },
            400,
            "without `tool_result`",
        ),
    ],
)
def test_requests_anthropic_refuses_are_refused_without_consuming_a_script(
    sim: ProviderSimulator, change: dict[str, Any], status: int, needle: str
) -> None:
    sim.script("c", Fault.rate_limit())
    body = {k: v for k, v in BODY.items() if k != change.get("drop")}
    body.update({k: v for k, v in change.items() if k not in ("headers", "drop")})
    resp = _post(sim, body, change.get("headers", HEADERS))
    assert resp.status_code == status and needle in resp.json()["error"]["message"]
    assert _post(sim, BODY).status_code == 429  # the scripted fault is still there
    assert [r.behavior for r in sim.requests("c")] == ["bad_request", "http_error:429"]
    assert sim.requests("c")[0].headers.get("x-api-key") in (None, "***")


# -- every fault through LiteLLM's anthropic/ provider ------------------------------------------------


async def _call(sim: ProviderSimulator, stream: bool = False, **kwargs: Any) -> tuple[str, Any]:
    resp = await litellm.acompletion(
        model="anthropic/claude-3-5-haiku-latest",
        api_base=sim.anthropic_base("c"),
        api_key="sk-ant-sim",
        messages=[{"role": "user", "content": "look up order 42"}],
        max_tokens=64,
        num_retries=0,
        stream=stream,
        **kwargs,
    )
    if not stream:
        return resp.choices[0].message.content, resp
    parts = []
    async for chunk in resp:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts), None


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(
    ("fault", "error"),
    [
        (Fault.rate_limit(retry_after=1), litellm.RateLimitError),
        (Fault.server_error(500), litellm.InternalServerError),
        (Fault.server_error(503), litellm.ServiceUnavailableError),
        (Fault.overloaded(retry_after=1), litellm.InternalServerError),  # LiteLLM says 500
        (Fault.auth(), litellm.AuthenticationError),
        (Fault.context_length(5), litellm.ContextWindowExceededError),
        pytest.param(Fault.reset(), litellm.InternalServerError, marks=requires_capability("single_send")),
    ],
)
async def test_every_error_fault_reaches_litellm(
    sim: ProviderSimulator, stream: bool, fault: Behavior, error: type[Exception]
) -> None:
    sim.script("c", fault)
    with pytest.raises(error) as info:
        await _call(sim, stream)
    if fault.retry_after is not None:
        assert info.value.litellm_response_headers["retry-after"] == "1"  # type: ignore[attr-defined]
    assert sim.requests("c")[0].stream is stream


async def test_outages_buckets_windows_and_flaky_apply_to_the_anthropic_dialect(
    sim: ProviderSimulator,
) -> None:
    sim.outage("c", 30)
    with pytest.raises(litellm.ServiceUnavailableError):
        await _call(sim)
    sim.reset()
    sim.token_bucket("c", rate=0.001, burst=1, retry_after=7)
    await _call(sim)
    with pytest.raises(litellm.RateLimitError):
        await _call(sim)
    sim.reset()
    sim.set_context_window("c", 5)
    with pytest.raises(litellm.ContextWindowExceededError):
        await _call(sim)
    sim.reset()
    sim.set_default("c", Fault.flaky(1.0, Fault.server_error(502)))
    with pytest.raises(litellm.BadGatewayError):
        await _call(sim)
    assert [r.behavior for r in sim.requests("c")] == ["flaky:http_error:502"]


async def test_silence_and_a_slow_first_token(sim: ProviderSimulator) -> None:
    sim.script("c", Fault.silence(max_hold=2))
    with pytest.raises(litellm.Timeout):
        await _call(sim, timeout=0.3)
    sim.script("c", Fault.slow_first_token(0.3))
    t0 = time.monotonic()
    text, _ = await _call(sim)
    assert text and time.monotonic() - t0 >= 0.3
    sim.script("c", Fault.slow_first_token(0.3))
    t0 = time.monotonic()
    text, _ = await _call(sim, stream=True)
    assert text and time.monotonic() - t0 >= 0.3


async def test_stream_cut_stall_undecodable_body_and_no_stop(sim: ProviderSimulator) -> None:
    from litellm.exceptions import MidStreamFallbackError

    sim.script("c", Fault.stream_cut(after_chunks=2))
    with pytest.raises(MidStreamFallbackError) as cut:
        await _call(sim, stream=True)
    assert cut.value.generated_content == "Hello from "
    sim.script("c", Fault.stream_stall(after_chunks=2, seconds=2))
    with pytest.raises((litellm.Timeout, MidStreamFallbackError)):
        await _call(sim, stream=True, timeout=0.3)
    sim.script("c", Fault.malformed_chunk())
    with pytest.raises(litellm.APIConnectionError):
        await _call(sim)
    sim.script("c", Fault.no_done())
    text, _ = await _call(sim, stream=True)
    assert text == "Hello from c. You said: look up order 42."
    assert [r.behavior for r in sim.requests("c")] == [
        "stream_cut",
        "stream_stall",
        "malformed_chunk",
        "no_done",
    ]


@requires_capability("eof_check")
async def test_an_undecodable_stream_event_breaks_the_stream(sim: ProviderSimulator) -> None:
    """LiteLLM's own check; without it the plugin reads the provider's finish itself
    (tests/integration/test_broken_response_class.py)."""
    from litellm.exceptions import MidStreamFallbackError

    sim.script("c", Fault.malformed_chunk(after_chunks=2))
    with pytest.raises(MidStreamFallbackError):
        await _call(sim, stream=True)
