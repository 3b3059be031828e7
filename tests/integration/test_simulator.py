"""Tests for the fault-injecting ProviderSimulator, over real HTTP (httpx and LiteLLM)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import llm_resilience_plugin  # noqa: F401  (sets LiteLLM's offline env before litellm is imported)
from llm_resilience_plugin.testing import _simulator as simulator_module
from llm_resilience_plugin.testing._simulator import (
    Behavior,
    Fault,
    ProviderSimulator,
    RequestRecord,
    estimate_prompt_tokens,
    estimate_tokens,
)

USER_HI = [{"role": "user", "content": "hello there"}]


# --------------------------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared_sim() -> Iterator[ProviderSimulator]:
    with ProviderSimulator() as simulator:
        yield simulator


@pytest.fixture
def sim(shared_sim: ProviderSimulator) -> ProviderSimulator:
    shared_sim.reset()
    return shared_sim


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=5.0) as c:
        yield c


def url(sim: ProviderSimulator, deployment: str = "a") -> str:
    return sim.api_base(deployment) + "/chat/completions"


def chat(
    client: httpx.Client,
    sim: ProviderSimulator,
    deployment: str = "a",
    *,
    messages: list[dict[str, Any]] | None = None,
    **body: Any,
) -> httpx.Response:
    payload = {"model": "gpt-test", "messages": messages or USER_HI, **body}
    return client.post(url(sim, deployment), json=payload)


def sse_events(text: str) -> list[str]:
    """The data payloads of an SSE body, in order."""
    events = []
    for block in text.split("\n\n"):
        block = block.strip()
        if block:
            assert block.startswith("data: "), block
            events.append(block[len("data: ") :])
    return events


def stream_content(events: list[str]) -> str:
    parts = []
    for event in events:
        if event == "[DONE]":
            continue
        for choice in json.loads(event)["choices"]:
            parts.append(choice["delta"].get("content") or "")
    return "".join(parts)


def wait_until(predicate: Any, timeout: float = 1.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


# --------------------------------------------------------------------------------------------
# Success paths
# --------------------------------------------------------------------------------------------


def test_ok_non_stream(sim: ProviderSimulator, client: httpx.Client) -> None:
    response = chat(client, sim, "alpha")
    assert response.status_code == 200
    assert response.headers["x-simulator-deployment"] == "alpha"
    data = response.json()
    assert data["object"] == "chat.completion"
    assert data["id"].startswith("chatcmpl-sim-")
    assert data["model"] == "gpt-test"
    assert data["system_fingerprint"] == "sim"
    assert isinstance(data["created"], int)
    choice = data["choices"][0]
    assert choice["message"] == {
        "role": "assistant",
        "content": "Hello from alpha. You said: hello there.",
    }
    assert choice["finish_reason"] == "stop"
    usage = data["usage"]
    assert usage["prompt_tokens"] == estimate_prompt_tokens(USER_HI) == 4 + 3 + 2
    assert usage["completion_tokens"] == 7
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_ok_stream_with_usage(sim: ProviderSimulator, client: httpx.Client) -> None:
    response = chat(client, sim, stream=True, stream_options={"include_usage": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    words = [c["choices"][0]["delta"]["content"] for c in chunks[:-2]]
    assert words == ["Hello ", "from ", "a. ", "You ", "said: ", "hello ", "there."]
    finish, usage = chunks[-2], chunks[-1]
    assert finish["choices"][0]["delta"] == {}
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == len(words)


def test_stream_without_usage_option(sim: ProviderSimulator, client: httpx.Client) -> None:
    events = sse_events(chat(client, sim, stream=True).text)
    assert events[-1] == "[DONE]"
    assert all("usage" not in json.loads(e) for e in events[:-1])
    assert stream_content(events) == "Hello from a. You said: hello there."


def test_fixed_text_default_and_script_fifo(sim: ProviderSimulator, client: httpx.Client) -> None:
    sim.set_default("a", Fault.ok(text="default text"))
    sim.script("a", Fault.ok(text="first"), Fault.rate_limit(), Fault.ok(text="third"))
    results = [chat(client, sim) for _ in range(5)]
    assert [r.status_code for r in results] == [200, 429, 200, 200, 200]
    contents = [r.json()["choices"][0]["message"]["content"] for r in results if r.is_success]
    assert contents == ["first", "third", "default text", "default text"]
    assert [r.behavior for r in sim.requests("a")] == [
        "ok",
        "http_error:429",
        "ok",
        "ok",
        "ok",
    ]
    # Other deployments are independent.
    assert chat(client, sim, "b").json()["choices"][0]["message"]["content"].startswith("Hello from b.")


def test_routes_and_model_keyed_deployments(sim: ProviderSimulator, client: httpx.Client) -> None:
    sim.script("gpt-x", Fault.ok(text="by model"))
    base = sim.base_url
    response = client.post(base + "/v1/chat/completions", json={"model": "gpt-x", "messages": USER_HI})
    assert response.json()["choices"][0]["message"]["content"] == "by model"
    assert response.headers["x-simulator-deployment"] == "gpt-x"
    response = client.post(base + "/chat/completions", json={"model": "m2", "messages": USER_HI})
    assert response.headers["x-simulator-deployment"] == "m2"
    assert [r.deployment for r in sim.requests()] == ["gpt-x", "m2"]
    assert client.get(base + "/health").json() == {"status": "ok"}
    models = client.get(sim.api_base("dep") + "/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "dep"
    assert client.get(base + "/v1/models").json()["object"] == "list"
    assert sim.count() == 2  # GETs are not logged


def test_bad_request_is_logged_without_consuming_script(sim: ProviderSimulator, client: httpx.Client) -> None:
    sim.script("a", Fault.rate_limit())
    response = client.post(url(sim), content=b"{not json", headers={"content-type": "x"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert client.post(url(sim), json={"model": "m"}).status_code == 400
    assert [r.behavior for r in sim.requests()] == ["bad_request", "bad_request"]
    assert chat(client, sim).status_code == 429


def test_max_tokens_and_stop(sim: ProviderSimulator, client: httpx.Client) -> None:
    data = chat(client, sim, max_tokens=3).json()
    assert data["choices"][0]["message"]["content"] == "Hello from a. "
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 3
    data = chat(client, sim, max_completion_tokens=2, stream=True).text
    events = sse_events(data)
    assert stream_content(events) == "Hello from "
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    data = chat(client, sim, stop=["said", "zzz"]).json()
    assert data["choices"][0]["message"]["content"] == "Hello from a. You "
    assert data["choices"][0]["finish_reason"] == "stop"
    data = chat(client, sim, stop=".").json()
    assert data["choices"][0]["message"]["content"] == "Hello from a"


def test_token_estimate() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2
    messages = [
        {"role": "system", "content": "x" * 9},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "abcd"},
                {"type": "image_url", "image_url": {"url": "data:..."}},
                {"type": "text", "text": "efgh"},
            ],
        },
        {"role": "assistant", "content": None},
    ]
    assert estimate_prompt_tokens(messages) == (4 + 3) + (4 + 2 + 85) + 4 + 2


# --------------------------------------------------------------------------------------------
# HTTP error faults
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "status", "error_type", "code", "message_start"),
    [
        (Fault.rate_limit(), 429, "rate_limit_exceeded", "rate_limit_exceeded", "Rate limit"),
        (Fault.server_error(), 500, "server_error", None, "The server had an error"),
        (Fault.server_error(503), 503, "server_error", None, "The service"),
        (Fault.overloaded(), 529, "overloaded_error", None, "Overloaded"),
        (Fault.auth(), 401, "invalid_request_error", "invalid_api_key", "Incorrect API key"),
        (
            Fault.content_filter(),
            400,
            "invalid_request_error",
            "content_filter",
            "The response was filtered due to the prompt triggering Azure OpenAI's content",
        ),
        (Fault.not_found(), 404, "invalid_request_error", "model_not_found", "The model `gpt-t"),
        (Fault.http_error(418, "teapot", code="c", type="t"), 418, "t", "c", "teapot"),
        (Fault.http_error(422), 422, "invalid_request_error", None, "Unprocessable"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_http_error_faults(
    sim: ProviderSimulator,
    client: httpx.Client,
    fault: Behavior,
    status: int,
    error_type: str,
    code: str | None,
    message_start: str,
    stream: bool,
) -> None:
    sim.script("a", fault)
    response = chat(client, sim, stream=stream)
    assert response.status_code == status
    assert response.headers["x-simulator-deployment"] == "a"
    assert "retry-after" not in response.headers
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == error_type
    assert error["code"] == code
    assert error["param"] is None
    assert error["message"].startswith(message_start)
    record = sim.requests("a")[0]
    assert record.behavior == f"http_error:{status}"
    assert record.status == status
    assert record.stream is stream


@pytest.mark.parametrize(
    ("retry_after", "header"),
    [(2, "2"), (0.5, "0.5"), (3.0, "3"), ("Wed, 21 Oct 2015 07:28:00 GMT", None), (None, None)],
)
def test_retry_after_header(
    sim: ProviderSimulator, client: httpx.Client, retry_after: Any, header: str | None
) -> None:
    sim.script("a", Fault.rate_limit(retry_after=retry_after))
    response = chat(client, sim)
    assert response.status_code == 429
    expected = retry_after if isinstance(retry_after, str) else header
    assert response.headers.get("retry-after") == expected


def test_context_length_fault_message(sim: ProviderSimulator, client: httpx.Client) -> None:
    sim.script("a", Fault.context_length())
    response = chat(client, sim)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    tokens = estimate_prompt_tokens(USER_HI)
    assert error["message"] == (
        "This model's maximum context length is 8192 tokens. However, your messages resulted "
        f"in {tokens} tokens. Please reduce the length of the messages."
    )


# --------------------------------------------------------------------------------------------
# Connection-level faults
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_reset_aborts_connection(sim: ProviderSimulator, client: httpx.Client, stream: bool) -> None:
    sim.script("a", Fault.reset())
    with pytest.raises(httpx.TransportError):
        chat(client, sim, stream=stream)
    record = sim.requests("a")[0]
    assert record.behavior == "reset"
    assert record.status is None
    assert record.finished_at is not None
    assert chat(client, sim).status_code == 200  # the server is fine afterwards


def test_stream_cut_on_non_stream_request_resets(sim: ProviderSimulator, client: httpx.Client) -> None:
    sim.script("a", Fault.stream_cut())
    with pytest.raises(httpx.TransportError):
        chat(client, sim)
    assert sim.requests()[0].status is None


def test_silence_until_client_timeout(sim: ProviderSimulator) -> None:
    sim.script("a", Fault.silence(max_hold=5.0))
    started = time.monotonic()
    with httpx.Client(timeout=0.3) as short, pytest.raises(httpx.ReadTimeout):
        chat(short, sim)
    assert time.monotonic() - started < 1.0
    # The holder notices that the client left and finishes the record promptly.
    assert wait_until(lambda: sim.requests()[0].finished_at is not None, timeout=1.0)
    record = sim.requests()[0]
    assert record.behavior == "silence"
    assert record.status is None
    assert record.finished_at is not None and record.finished_at - record.started_at < 1.0


def test_silence_max_hold_then_abort(sim: ProviderSimulator, client: httpx.Client) -> None:
    sim.script("a", Fault.silence(max_hold=0.2))
    started = time.monotonic()
    with pytest.raises(httpx.TransportError):
        chat(client, sim)
    assert 0.15 < time.monotonic() - started < 1.0


def test_silence_does_not_block_other_requests(sim: ProviderSimulator, client: httpx.Client) -> None:
    sim.script("a", Fault.silence(max_hold=0.5))
    errors: list[BaseException] = []

    def hold() -> None:
        with httpx.Client(timeout=2.0) as other:
            try:
                chat(other, sim)
            except httpx.TransportError as exc:
                errors.append(exc)

    holder = threading.Thread(target=hold)
    holder.start()
    assert wait_until(lambda: sim.count("a") == 1)
    started = time.monotonic()
    assert chat(client, sim, "b").status_code == 200
    assert time.monotonic() - started < 0.2
    holder.join()
    assert len(errors) == 1


def test_stream_cut_gives_partial_content_then_error(sim: ProviderSimulator, client: httpx.Client) -> None:
    sim.script("a", Fault.stream_cut(after_chunks=2))
    lines: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError):
        with client.stream("POST", url(sim), json={"model": "m", "messages": USER_HI, "stream": True}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line:
                    lines.append(line)
    events = [line[len("data: ") :] for line in lines]
    assert stream_content(events) == "Hello from "
    assert "[DONE]" not in events
    record = sim.requests()[0]
    assert (record.behavior, record.status) == ("stream_cut", 200)


def test_stream_cut_beyond_reply_length(sim: ProviderSimulator, client: httpx.Client) -> None:
    sim.script("a", Fault.stream_cut(after_chunks=100))
    payload = {"model": "m", "messages": USER_HI, "stream": True}
    lines: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError):
        with client.stream("POST", url(sim), json=payload) as r:
            lines.extend(line for line in r.iter_lines() if line)
    events = [line[len("data: ") :] for line in lines]
    assert stream_content(events) == "Hello from a. You said: hello there."
    assert all(json.loads(e)["choices"][0]["finish_reason"] is None for e in events)


def test_stream_stall(sim: ProviderSimulator) -> None:
    sim.script("a", Fault.stream_stall(after_chunks=1, seconds=5.0))
    lines: list[str] = []
    payload = {"model": "m", "messages": USER_HI, "stream": True}
    started = time.monotonic()
    with httpx.Client(timeout=0.3) as short, pytest.raises(httpx.ReadTimeout):
        with short.stream("POST", url(sim), json=payload) as r:
            for line in r.iter_lines():
                if line:
                    lines.append(line)
    assert time.monotonic() - started < 1.0
    assert stream_content([line[6:] for line in lines]) == "Hello "
    assert wait_until(lambda: sim.requests()[0].finished_at is not None)


def test_stream_stall_non_stream_is_silence(sim: ProviderSimulator, client: httpx.Client) -> None:
    sim.script("a", Fault.stream_stall(seconds=0.1))
    with pytest.raises(httpx.TransportError):
        chat(client, sim)
    assert sim.requests()[0].behavior == "stream_stall"


def test_malformed_chunk_without_text_and_repeated(sim: ProviderSimulator, client: httpx.Client) -> None:
    sim.script("a", Fault.malformed_chunk(after_chunks=1, content=False, repeat=2))
    events = sse_events(chat(client, sim, stream=True).text)
    bad = [i for i, e in enumerate(events) if e.startswith('{"id": "broken"')]
    assert bad == [1, 3]  # one good chunk between the two
    assert all('"content"' not in events[i] for i in bad)
    good = [e for i, e in enumerate(events) if i not in bad]
    assert good[-1] == "[DONE]" and stream_content(good) == "Hello from a. You said: hello there."
    with pytest.raises(ValueError, match="repeat"):
        Fault.malformed_chunk(repeat=0)


def test_malformed_chunk(sim: ProviderSimulator, client: httpx.Client) -> None:
    sim.script("a", Fault.malformed_chunk(after_chunks=1), Fault.malformed_chunk())
    text = chat(client, sim, stream=True).text
    assert '\ndata: {"id": "broken", "choices": [{"delta": {"content": "oops"\n\n' in text
    events = sse_events(text)
    assert events[1].startswith('{"id": "broken"')
    with pytest.raises(json.JSONDecodeError):
        json.loads(events[1])
    good = [e for i, e in enumerate(events) if i != 1]
    assert good[-1] == "[DONE]"
    assert stream_content(good) == "Hello from a. You said: hello there."
    response = chat(client, sim)
    assert response.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(response.content)


def test_no_done(sim: ProviderSimulator, client: httpx.Client) -> None:
    sim.script("a", Fault.no_done(), Fault.no_done())
    events = sse_events(chat(client, sim, stream=True, stream_options={"include_usage": True}).text)
    assert "[DONE]" not in events
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "stop"
    assert json.loads(events[-1])["usage"]["total_tokens"] > 0
    assert stream_content(events) == "Hello from a. You said: hello there."
    assert chat(client, sim).json()["choices"][0]["finish_reason"] == "stop"


def test_latency_ttft_and_chunk_delay(sim: ProviderSimulator, client: httpx.Client) -> None:
    sim.script("a", Fault.ok(latency=0.15), Fault.slow_first_token(0.15))
    for _ in range(2):
        started = time.monotonic()
        assert chat(client, sim).status_code == 200
        assert 0.14 < time.monotonic() - started < 0.6

    sim.script("a", Fault.ok(text="one two three", ttft=0.15, chunk_delay=0.05))
    payload = {"model": "m", "messages": USER_HI, "stream": True}
    started = time.monotonic()
    arrivals: list[float] = []
    with client.stream("POST", url(sim), json=payload) as r:
        headers_at = time.monotonic() - started
        for line in r.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.monotonic() - started)
    assert headers_at < 0.1
    assert arrivals[0] > 0.14
    assert arrivals[2] - arrivals[0] > 0.09


# --------------------------------------------------------------------------------------------
# Outage, token bucket, context window, precedence, flaky
# --------------------------------------------------------------------------------------------


def test_outage_window_then_healthy(sim: ProviderSimulator, client: httpx.Client) -> None:
    sim.script("a", Fault.ok(text="scripted"))
    sim.outage("a", 0.3)
    statuses = [chat(client, sim).status_code for _ in range(3)]
    assert statuses == [503, 503, 503]
    assert sim.requests()[0].behavior == "outage:http_error:503"
    time.sleep(0.3)
    response = chat(client, sim)
    assert response.json()["choices"][0]["message"]["content"] == "scripted"


def test_outage_with_custom_behavior(sim: ProviderSimulator, client: httpx.Client) -> None:
    sim.outage("a", 5.0, Fault.reset())
    with pytest.raises(httpx.TransportError):
        chat(client, sim)
    assert sim.requests()[0].behavior == "outage:reset"


def test_token_bucket(sim: ProviderSimulator, client: httpx.Client) -> None:
    sim.token_bucket("a", rate=0.0, burst=2, retry_after=1.5)
    statuses = [chat(client, sim) for _ in range(3)]
    assert [r.status_code for r in statuses] == [200, 200, 429]
    assert statuses[2].headers["retry-after"] == "1.5"
    assert statuses[2].json()["error"]["code"] == "rate_limit_exceeded"
    assert sim.requests()[2].behavior == "token_bucket:429"

    sim.token_bucket("b", rate=20.0, burst=1)
    assert chat(client, sim, "b").status_code == 200
    rejected = chat(client, sim, "b")
    assert rejected.status_code == 429
    assert "retry-after" not in rejected.headers
    time.sleep(0.06)
    assert chat(client, sim, "b").status_code == 200


def test_context_window(sim: ProviderSimulator, client: httpx.Client) -> None:
    sim.set_context_window("a", 20)
    assert chat(client, sim).status_code == 200
    long = [{"role": "user", "content": "x" * 100}]
    response = chat(client, sim, messages=long)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "maximum context length is 20 tokens" in error["message"]
    assert f"resulted in {estimate_prompt_tokens(long)} tokens" in error["message"]
    assert sim.requests()[1].behavior == "context_window"
    sim.set_context_window("a", None)
    assert chat(client, sim, messages=long).status_code == 200


def test_precedence(sim: ProviderSimulator, client: httpx.Client) -> None:
    long = [{"role": "user", "content": "x" * 100}]
    sim.script("a", Fault.ok(text="queued"))
    sim.set_context_window("a", 10)
    sim.token_bucket("a", rate=0.0, burst=1)
    sim.outage("a", 0.2, Fault.server_error(502))
    assert chat(client, sim, messages=long).status_code == 502  # outage beats everything
    time.sleep(0.2)
    assert chat(client, sim, messages=long).status_code == 400  # window (bucket had a token)
    assert chat(client, sim, messages=long).status_code == 429  # bucket beats window
    assert [r.behavior for r in sim.requests()] == [
        "outage:http_error:502",
        "context_window",
        "token_bucket:429",
    ]
    sim.token_bucket("a", rate=0.0, burst=5)
    response = chat(client, sim)  # the queue was not consumed by the rejections
    assert response.json()["choices"][0]["message"]["content"] == "queued"


def test_flaky_is_deterministic(sim: ProviderSimulator, client: httpx.Client) -> None:
    flaky = Fault.flaky(0.5, Fault.server_error(503), seed=42)

    def run() -> list[int]:
        sim.reset()
        sim.set_default("a", flaky)
        return [chat(client, sim).status_code for _ in range(16)]

    first = run()
    assert first == run()
    assert set(first) == {200, 503}
    names = {r.behavior for r in sim.requests()}
    assert names == {"flaky:ok", "flaky:http_error:503"}

    sim.reset()
    sim.script("a", Fault.flaky(0.0, Fault.reset()), Fault.flaky(1.0, Fault.rate_limit()))
    assert [chat(client, sim).status_code for _ in range(2)] == [200, 429]


@pytest.mark.parametrize(
    ("build", "argument"),
    [
        (lambda: Fault.ok(latency=-1), "latency"),
        (lambda: Fault.ok(ttft=-0.1), "ttft"),
        (lambda: Fault.ok(chunk_delay=float("nan")), "chunk_delay"),
        (lambda: Fault.http_error(99), "status"),
        (lambda: Fault.http_error(600), "status"),
        (lambda: Fault.server_error(404), "status"),
        (lambda: Fault.rate_limit(retry_after=-1), "retry_after"),
        (lambda: Fault.silence(-1), "max_hold"),
        (lambda: Fault.slow_first_token(-1), "seconds"),
        (lambda: Fault.stream_cut(-1), "after_chunks"),
        (lambda: Fault.stream_stall(seconds=-1), "seconds"),
        (lambda: Fault.malformed_chunk(-2), "after_chunks"),
        (lambda: Fault.flaky(1.5, Fault.reset()), "p"),
        (lambda: Fault.flaky(-0.1, Fault.reset()), "p"),
        (lambda: Fault.context_length(0), "limit"),
        (lambda: ProviderSimulator(port=70000), "port"),
        (lambda: ProviderSimulator().outage("a", -1), "seconds"),
        (lambda: ProviderSimulator().token_bucket("a", rate=-1, burst=1), "rate"),
        (lambda: ProviderSimulator().token_bucket("a", rate=1, burst=-1), "burst"),
        (lambda: ProviderSimulator().set_context_window("a", 0), "tokens"),
        (lambda: ProviderSimulator().script("a/b", Fault.ok()), "deployment"),
    ],
)
def test_argument_validation(build: Any, argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        build()


def test_behaviors_are_frozen_and_hashable() -> None:
    behavior = Fault.flaky(0.5, Fault.rate_limit(retry_after=1), seed=1)
    assert hash(behavior) == hash(Fault.flaky(0.5, Fault.rate_limit(retry_after=1), seed=1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        behavior.p = 1.0  # type: ignore[misc]
    assert Fault.slow_first_token(1).name == "ok"
    assert Fault.overloaded().name == "http_error:529"


# --------------------------------------------------------------------------------------------
# Tool calls and structured output
# --------------------------------------------------------------------------------------------

MAGIC_TOOL = {
    "type": "function",
    "function": {
        "name": "magic_function",
        "description": "Applies a magic function to an input.",
        "parameters": {
            "type": "object",
            "properties": {"input": {"type": "integer"}},
            "required": ["input"],
        },
    },
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "number"},
                "detailed": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "hours": {"type": "array", "items": {"type": "integer"}, "minItems": 1},
                "where": {"$ref": "#/$defs/Location"},
                "note": {"anyOf": [{"type": "null"}, {"type": "string"}]},
            },
            "$defs": {
                "Location": {
                    "type": "object",
                    "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                }
            },
        },
    },
}


def tool_call_of(response: httpx.Response) -> tuple[str, dict[str, Any], dict[str, Any]]:
    data = response.json()
    choice = data["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["type"] == "function"
    assert call["id"].startswith("call_sim_")
    return call["function"]["name"], json.loads(call["function"]["arguments"]), data


def test_tool_call_auto_by_name_with_numbers(sim: ProviderSimulator, client: httpx.Client) -> None:
    messages = [{"role": "user", "content": "What is the value of magic_function(3)? Use the tool."}]
    response = chat(client, sim, messages=messages, tools=[WEATHER_TOOL, MAGIC_TOOL])
    name, args, data = tool_call_of(response)
    assert (name, args) == ("magic_function", {"input": 3})
    assert data["choices"][0]["message"]["content"] in (None, "")
    arguments = data["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert data["usage"]["completion_tokens"] == math.ceil(len(arguments) / 4) + 5


def test_tool_call_generated_arguments(sim: ProviderSimulator, client: httpx.Client) -> None:
    messages = [{"role": "user", "content": "get_weather for 5 days, at hour 7, near 1.5 and -2.25"}]
    response = chat(client, sim, messages=messages, tools=[MAGIC_TOOL, WEATHER_TOOL])
    name, args, _ = tool_call_of(response)
    assert name == "get_weather"
    assert args == {
        "city": "example",
        "unit": "celsius",
        "days": 5.0,
        "detailed": True,
        "tags": [],
        "hours": [7],
        "where": {"lat": 1.5, "lon": -2.25},
        "note": "example",
    }


def test_tool_string_arguments_take_quoted_phrases(sim: ProviderSimulator, client: httpx.Client) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "unicode_customer",
            "parameters": {
                "type": "object",
                "properties": {
                    "customer_name": {"type": "string"},
                    "description": {"type": "string"},
                },
            },
        },
    }
    prompt = "Create a customer named '你好啊集团' (Hello Group) - don't forget it"
    response = chat(client, sim, messages=[{"role": "user", "content": prompt}], tools=[tool])
    assert "你好啊集团" in response.text  # sent as UTF-8, not \\u-escaped
    _, args, _ = tool_call_of(response)
    assert args == {"customer_name": "你好啊集团", "description": "example"}


def test_tool_choice_variants(sim: ProviderSimulator, client: httpx.Client) -> None:
    tools = [WEATHER_TOOL, MAGIC_TOOL]
    named = {"type": "function", "function": {"name": "magic_function"}}
    name, args, _ = tool_call_of(chat(client, sim, tools=tools, tool_choice=named))
    assert (name, args) == ("magic_function", {"input": 1})
    name, _, _ = tool_call_of(chat(client, sim, tools=tools, tool_choice="required"))
    assert name == "get_weather"
    name, _, _ = tool_call_of(chat(client, sim, tools=tools))  # auto, no name in text: first
    assert name == "get_weather"
    response = chat(client, sim, tools=tools, tool_choice="none")
    assert response.json()["choices"][0]["message"]["content"].startswith("Hello from a.")
    sim.script("a", Fault.ok(text="plain"))
    assert chat(client, sim, tools=tools).json()["choices"][0]["message"]["content"] == "plain"


def test_tool_result_answer(sim: ProviderSimulator, client: httpx.Client) -> None:
    messages = [
        {"role": "user", "content": "What is magic_function(3)?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "magic_function", "arguments": '{"input": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
    data = chat(client, sim, messages=messages, tools=[MAGIC_TOOL]).json()
    assert data["choices"][0]["message"]["content"] == "The tool returned: 5."
    assert data["choices"][0]["finish_reason"] == "stop"


def test_tool_call_stream(sim: ProviderSimulator, client: httpx.Client) -> None:
    messages = [{"role": "user", "content": "call magic_function with 12"}]
    text = chat(client, sim, messages=messages, tools=[MAGIC_TOOL], stream=True).text
    events = sse_events(text)
    chunks = [json.loads(e) for e in events[:-1]]
    first = chunks[0]["choices"][0]["delta"]
    assert first["role"] == "assistant"
    head = first["tool_calls"][0]
    assert head["index"] == 0 and head["id"].startswith("call_sim_")
    assert head["type"] == "function"
    assert head["function"] == {"name": "magic_function", "arguments": ""}
    fragments = []
    for chunk in chunks[1:-1]:
        (call,) = chunk["choices"][0]["delta"]["tool_calls"]
        assert set(call) == {"index", "function"} and set(call["function"]) == {"arguments"}
        fragments.append(call["function"]["arguments"])
    assert len(fragments) >= 1
    assert json.loads("".join(fragments)) == {"input": 12}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_json_schema_response_format(sim: ProviderSimulator, client: httpx.Client) -> None:
    schema = {
        "type": "object",
        "properties": {
            "setup": {"type": "string"},
            "punchline": {"type": "string"},
            "rating": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "kind": {"$ref": "#/$defs/Kind"},
            "created": {"type": "string", "format": "date-time"},
        },
        "required": ["setup", "punchline"],
        "$defs": {"Kind": {"type": "string", "enum": ["pun", "dad"]}},
    }
    messages = [{"role": "user", "content": "Tell me a joke about cats, rated 8 out of 10"}]
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "Joke", "schema": schema, "strict": True},
    }
    data = chat(client, sim, messages=messages, response_format=response_format).json()
    content = json.loads(data["choices"][0]["message"]["content"])
    assert content == {
        "setup": "example setup",
        "punchline": "example punchline",
        "rating": 8,
        "kind": "pun",
        "created": "2024-01-01T00:00:00Z",
    }


def test_json_object_response_format(sim: ProviderSimulator, client: httpx.Client) -> None:
    messages = [
        {"role": "system", "content": "Reply in JSON with keys 'name' and `age`."},
        {"role": "user", "content": 'Also include "city", please. Don\'t forget.'},
    ]
    data = chat(client, sim, messages=messages, response_format={"type": "json_object"}).json()
    content = json.loads(data["choices"][0]["message"]["content"])
    assert content == {"name": "example name", "age": "example age", "city": "example city"}
    data = chat(client, sim, response_format={"type": "json_object"}).json()
    assert list(json.loads(data["choices"][0]["message"]["content"])) == ["answer"]


# --------------------------------------------------------------------------------------------
# Request log
# --------------------------------------------------------------------------------------------


def test_request_log(sim: ProviderSimulator, client: httpx.Client) -> None:
    before = time.monotonic()
    client.post(
        url(sim, "a"),
        json={"model": "m1", "messages": USER_HI, "temperature": 0.2},
        headers={"Authorization": "Bearer sk-secret", "api-key": "k", "X-Custom": "v"},
    )
    chat(client, sim, "b", stream=True)
    chat(client, sim, "a")
    after = time.monotonic()
    assert sim.count() == 3
    assert sim.count("a") == 2 and sim.count("b") == 1 and sim.count("zzz") == 0
    records = sim.requests()
    assert [r.deployment for r in records] == ["a", "b", "a"]
    first = records[0]
    assert isinstance(first, RequestRecord)
    assert first.model == "m1"
    assert first.stream is False and records[1].stream is True
    assert first.body["temperature"] == 0.2
    assert first.headers["authorization"] == "***"
    assert first.headers["api-key"] == "***"
    assert first.headers["x-custom"] == "v"
    assert all(k == k.lower() for k in first.headers)
    assert first.behavior == "ok" and first.status == 200
    for record in records:
        assert record.finished_at is not None
        assert before <= record.started_at <= record.finished_at <= after
    assert records[0].started_at <= records[1].started_at <= records[2].started_at
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.status = 500  # type: ignore[misc]

    sim.script("a", Fault.rate_limit())
    sim.clear_log()
    assert sim.count() == 0
    assert chat(client, sim).status_code == 429  # clear_log keeps scripts
    sim.script("a", Fault.rate_limit())
    sim.reset()
    assert sim.count() == 0
    assert chat(client, sim).status_code == 200  # reset drops scripts


async def test_concurrent_async_requests(sim: ProviderSimulator) -> None:
    sim.set_default("a", Fault.ok(latency=0.05))
    async with httpx.AsyncClient(timeout=5.0) as aclient:
        started = time.monotonic()
        responses = await asyncio.gather(
            *[aclient.post(url(sim, "a"), json={"model": "m", "messages": USER_HI}) for _ in range(50)]
        )
    assert all(r.status_code == 200 for r in responses)
    assert time.monotonic() - started < 2.0
    assert sim.count("a") == 50
    ids = {r.json()["id"] for r in responses}
    assert len(ids) == 50


# --------------------------------------------------------------------------------------------
# Lifecycle
# --------------------------------------------------------------------------------------------


def test_lifecycle_and_stop_while_silence_holding() -> None:
    simulator = ProviderSimulator()
    with pytest.raises(RuntimeError):
        _ = simulator.port
    simulator.start()
    port = simulator.port
    assert simulator.api_base("x") == f"http://127.0.0.1:{port}/x/v1"
    assert simulator.start() is simulator  # idempotent
    simulator.script("a", Fault.silence(max_hold=30.0), Fault.silence(max_hold=30.0))
    errors: list[BaseException] = []

    def hold() -> None:
        with httpx.Client(timeout=10.0) as c:
            try:
                chat(c, simulator)
            except httpx.TransportError as exc:
                errors.append(exc)

    holders = [threading.Thread(target=hold) for _ in range(2)]
    for holder in holders:
        holder.start()
    assert wait_until(lambda: simulator.count() == 2)
    started = time.monotonic()
    simulator.stop()
    assert time.monotonic() - started < 1.0
    for holder in holders:
        holder.join(2.0)
    assert len(errors) == 2
    assert all(r.finished_at is not None for r in simulator.requests())
    simulator.stop()  # idempotent

    with httpx.Client(timeout=1.0) as c, pytest.raises(httpx.ConnectError):
        chat(c, simulator)
    # Restarting keeps the port, so existing api_base URLs work again.
    with simulator:
        assert simulator.port == port
        with httpx.Client(timeout=1.0) as c:
            assert chat(c, simulator).status_code == 200


def test_command_line_entry_point(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: dict[str, Any] = {}

    def fake_wait(simulator: ProviderSimulator) -> None:
        out = capsys.readouterr().out
        seen["lines"] = out.splitlines()
        response = httpx.post(
            simulator.api_base("b") + "/chat/completions",
            json={"model": "m", "messages": USER_HI},
        )
        seen["content"] = response.json()["choices"][0]["message"]["content"]
        raise KeyboardInterrupt  # what Ctrl-C does

    monkeypatch.setattr(simulator_module, "wait_forever", fake_wait)
    assert simulator_module.main(["--port", "0", "--deployments", "a, b"]) == 0
    lines = seen["lines"]
    assert lines[0].startswith("ProviderSimulator listening on http://127.0.0.1:")
    assert lines[1].strip().startswith("a: http://127.0.0.1:") and lines[1].endswith("/a/v1")
    assert lines[2].strip().startswith("b: ") and lines[2].endswith("/b/v1")
    assert seen["content"] == "Hello from b. You said: hello there."


def test_cli_simulator_takes_the_standalone_options() -> None:
    from llm_resilience_plugin.cli import build_parser

    for argv in ([], ["--host", "0.0.0.0", "--port", "8900", "--deployments", "a,b"]):
        via_cli = vars(build_parser().parse_args(["simulator", *argv]))
        assert via_cli.pop("command") == "simulator"
        assert via_cli == vars(simulator_module.build_parser().parse_args(argv))


def test_cli_simulator_rejects_bad_options_without_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from llm_resilience_plugin.cli import main as cli_main

    assert cli_main(["simulator", "--deployments", "a,b/c"]) == 2
    assert "deployment must be a non-empty name without '/'" in capsys.readouterr().err
    assert cli_main(["simulator", "--port", "70000"]) == 2
    assert "port must be an integer in [0, 65535]" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert cli_main(["simulator", "--port", str(taken.getsockname()[1])]) == 1
    assert "error: cannot listen on 127.0.0.1:" in capsys.readouterr().err


def _entry_point() -> Path:
    script = Path(sys.executable).with_name("llm-resilience")
    if not script.exists():
        pytest.skip(f"the llm-resilience entry point is not installed next to {sys.executable}")
    return script


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_installed_entry_point_simulator_help() -> None:
    done = subprocess.run(
        [str(_entry_point()), "simulator", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: llm-resilience simulator")
    for option in ("--host", "--port", "--deployments"):
        assert option in done.stdout


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_installed_entry_point_serves_until_stopped(stop_signal: signal.Signals) -> None:
    port = _free_port()
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    proc = subprocess.Popen(
        [str(_entry_point()), "simulator", "--port", str(port), "--deployments", "a,b"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # As from a terminal: Ctrl-C's default action. A pytest-xdist worker (and a shell's
        # background job) ignores SIGINT, and a child inherits that; Python then installs no
        # KeyboardInterrupt handler and the SIGINT case would wait forever.
        preexec_fn=_default_sigint,
    )
    try:
        deadline = time.monotonic() + 30.0
        while True:  # the port accepts once the simulator is bound
            assert proc.poll() is None, proc.communicate()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the simulator did not start listening"
                time.sleep(0.05)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        base = f"http://127.0.0.1:{port}"
        request = urllib.request.Request(
            f"{base}/b/v1/chat/completions",
            data=json.dumps({"model": "m", "messages": USER_HI}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with opener.open(request, timeout=10.0) as response:
            assert response.status == 200
            reply = json.loads(response.read())
        assert reply["choices"][0]["message"]["content"] == "Hello from b. You said: hello there."
        with opener.open(f"{base}/v1/models", timeout=10.0) as response:
            assert [m["id"] for m in json.loads(response.read())["data"]] == ["a", "b"]
        proc.send_signal(stop_signal)
        out, err = proc.communicate(timeout=15.0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert lines[0] == f"ProviderSimulator listening on {base}"
    assert lines[1].strip() == f"a: {base}/a/v1"
    assert lines[2].strip() == f"b: {base}/b/v1"
    assert "Traceback" not in err


# --------------------------------------------------------------------------------------------
# Through LiteLLM
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def litellm_module() -> Any:
    import litellm

    litellm.suppress_debug_info = True
    return litellm


def lite_kwargs(sim: ProviderSimulator, deployment: str = "a", **extra: Any) -> dict[str, Any]:
    return {
        "model": "openai/gpt-4o-mini",
        "api_base": sim.api_base(deployment),
        "api_key": "sk-sim",
        "messages": USER_HI,
        "max_retries": 0,
        "timeout": 5.0,
        **extra,
    }


async def test_litellm_ok_and_stream(sim: ProviderSimulator, litellm_module: Any) -> None:
    response = await litellm_module.acompletion(**lite_kwargs(sim))
    assert response.choices[0].message.content == "Hello from a. You said: hello there."
    assert response.usage.prompt_tokens == estimate_prompt_tokens(USER_HI)
    stream = await litellm_module.acompletion(
        **lite_kwargs(sim, stream=True, stream_options={"include_usage": True})
    )
    parts = []
    usage = None
    async for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
        if getattr(chunk, "usage", None):
            usage = chunk.usage
    assert "".join(parts) == "Hello from a. You said: hello there."
    assert usage is not None and usage.completion_tokens == 7
    assert sim.requests()[0].headers["authorization"] == "***"


def _causes(exc: BaseException | None) -> Iterator[BaseException]:
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


def test_litellm_sync_errors(sim: ProviderSimulator, litellm_module: Any) -> None:
    sim.script("a", Fault.rate_limit(retry_after=2), Fault.server_error(503))
    with pytest.raises(litellm_module.RateLimitError) as rate_limited:
        litellm_module.completion(**lite_kwargs(sim))
    assert rate_limited.value.status_code == 429
    # LiteLLM 1.110 copies the provider's headers onto its error's response; 1.105-1.108 keep
    # them on the openai error underneath
    sent = [getattr(getattr(e, "response", None), "headers", None) or {} for e in _causes(rate_limited.value)]
    assert any(h.get("retry-after") == "2" for h in sent)
    with pytest.raises(litellm_module.ServiceUnavailableError) as unavailable:
        litellm_module.completion(**lite_kwargs(sim))
    assert unavailable.value.status_code == 503


async def test_litellm_connection_faults(sim: ProviderSimulator, litellm_module: Any) -> None:
    import openai

    # A reset surfaces as InternalServerError(500) "Connection error." with an
    # openai.APIConnectionError in its cause chain (not as litellm.APIConnectionError).
    sim.script("a", Fault.reset())
    with pytest.raises(litellm_module.InternalServerError) as reset:
        await litellm_module.acompletion(**lite_kwargs(sim))
    assert reset.value.status_code == 500
    assert "Connection error." in str(reset.value)
    causes = []
    cause: BaseException | None = reset.value
    while cause is not None:
        causes.append(cause)
        cause = cause.__cause__ or cause.__context__
    assert any(isinstance(c, openai.APIConnectionError) for c in causes)

    sim.script("a", Fault.silence(max_hold=2.0))
    started = time.monotonic()
    with pytest.raises(litellm_module.Timeout):
        await litellm_module.acompletion(**lite_kwargs(sim, timeout=0.3))
    assert time.monotonic() - started < 1.0

    sim.script("a", Fault.stream_cut(after_chunks=2))
    stream = await litellm_module.acompletion(**lite_kwargs(sim, stream=True))
    parts = []
    with pytest.raises(litellm_module.exceptions.MidStreamFallbackError) as cut:
        async for chunk in stream:
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
    assert "".join(parts) == "Hello from "
    assert cut.value.generated_content == "Hello from "


async def test_litellm_tool_call(sim: ProviderSimulator, litellm_module: Any) -> None:
    messages = [{"role": "user", "content": "What is the value of magic_function(3)? Use the tool."}]
    response = await litellm_module.acompletion(**lite_kwargs(sim, messages=messages, tools=[MAGIC_TOOL]))
    call = response.choices[0].message.tool_calls[0]
    assert call.function.name == "magic_function"
    assert json.loads(call.function.arguments) == {"input": 3}
    assert response.choices[0].finish_reason == "tool_calls"


def test_litellm_structured_output(sim: ProviderSimulator, litellm_module: Any) -> None:
    from pydantic import BaseModel

    class Joke(BaseModel):
        setup: str
        punchline: str
        rating: int | None = None

    messages = [{"role": "user", "content": "A joke, rated 7"}]
    response = litellm_module.completion(**lite_kwargs(sim, messages=messages, response_format=Joke))
    joke = Joke.model_validate_json(response.choices[0].message.content)
    assert joke == Joke(setup="example setup", punchline="example punchline", rating=7)
