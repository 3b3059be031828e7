"""The simulator's embeddings, text-completion, image and Responses endpoints on the wire: OpenAI's
shapes, deterministic vectors, and the chat endpoint's faults applied to each."""

from __future__ import annotations

import base64
import json
import struct

import httpx
import pytest

from llm_resilience_plugin.testing import Fault, ProviderSimulator, embedding_vector

BODIES = {
    "embeddings": {"model": "m", "input": ["a", "b"]},
    "completions": {"model": "m", "prompt": "hello there"},
    "images/generations": {"model": "m", "prompt": "a cube", "n": 2},
    "responses": {"model": "m", "input": "hello there"},
}


def post(sim: ProviderSimulator, path: str, body: dict, timeout: float = 5.0) -> httpx.Response:
    return httpx.post(f"{sim.api_base('d')}/{path}", json=body, timeout=timeout)


@pytest.mark.parametrize("path", list(BODIES))
def test_each_endpoint_answers_in_openais_shape_and_is_logged(sim: ProviderSimulator, path: str) -> None:
    resp = post(sim, path, BODIES[path])
    assert resp.status_code == 200 and resp.headers["x-simulator-deployment"] == "d"
    body = resp.json()
    if path == "embeddings":
        assert [d["embedding"] for d in body["data"]] == [embedding_vector("d", t, 16) for t in "ab"]
        assert body["usage"]["prompt_tokens"] > 0
    elif path == "completions":
        assert body["object"] == "text_completion" and body["choices"][0]["text"].startswith("Hello from d")
    elif path == "images/generations":
        assert len(body["data"]) == 2 and base64.b64decode(body["data"][0]["b64_json"]).startswith(b"\x89PNG")
    else:
        assert body["object"] == "response" and body["status"] == "completed"
        assert body["output"][0]["content"][0]["text"].startswith("Hello from d")
        assert body["usage"]["input_tokens"] > 0
    (record,) = sim.requests("d")
    assert record.behavior == "ok" and record.status == 200


def test_embedding_dimension_and_base64(sim: ProviderSimulator) -> None:
    sim.set_embedding_dimension("d", 4)
    body = post(sim, "embeddings", {"model": "m", "input": "x", "encoding_format": "base64"}).json()
    raw = base64.b64decode(body["data"][0]["embedding"])
    assert list(struct.unpack("<4f", raw)) == pytest.approx(embedding_vector("d", "x", 4), rel=1e-6)
    assert (
        len(
            post(sim, "embeddings", {"model": "m", "input": "x", "dimensions": 6}).json()["data"][0][
                "embedding"
            ]
        )
        == 6
    )


@pytest.mark.parametrize("path", list(BODIES))
def test_errors_with_retry_after_and_outages_apply(sim: ProviderSimulator, path: str) -> None:
    sim.script("d", Fault.rate_limit(retry_after=2))
    resp = post(sim, path, BODIES[path])
    assert resp.status_code == 429 and resp.headers["retry-after"] == "2"
    sim.outage("d", 60)
    assert post(sim, path, BODIES[path]).status_code == 503
    assert [r.behavior for r in sim.requests("d")] == ["http_error:429", "outage:http_error:503"]


@pytest.mark.parametrize("path", list(BODIES))
def test_reset_silence_and_malformed_apply(sim: ProviderSimulator, path: str) -> None:
    sim.script("d", Fault.reset(), Fault.silence(max_hold=2), Fault.malformed_chunk())
    with pytest.raises(httpx.TransportError):
        post(sim, path, BODIES[path])
    with pytest.raises(httpx.ReadTimeout):
        post(sim, path, BODIES[path], timeout=0.3)
    with pytest.raises(json.JSONDecodeError):
        post(sim, path, BODIES[path]).json()


def test_a_bad_body_is_a_400_that_consumes_no_script(sim: ProviderSimulator) -> None:
    sim.script("d", Fault.server_error())
    resp = post(sim, "embeddings", {"model": "m"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "input"
    assert post(sim, "embeddings", BODIES["embeddings"]).status_code == 500


@pytest.mark.parametrize("path", ["completions", "responses"])
def test_streams_end_cleanly_or_as_their_fault_says(sim: ProviderSimulator, path: str) -> None:
    body = {**BODIES[path], "stream": True}
    with httpx.stream("POST", f"{sim.api_base('d')}/{path}", json=body, timeout=5) as resp:
        text = resp.read().decode()
    if path == "completions":
        assert text.rstrip().endswith("data: [DONE]")
    else:
        assert "event: response.created" in text and "event: response.completed" in text
        assert text.count("response.output_text.delta") >= 3
    sim.script("d", Fault.stream_cut(after_chunks=2))
    with (
        pytest.raises(httpx.HTTPError),
        httpx.stream("POST", f"{sim.api_base('d')}/{path}", json=body, timeout=5) as resp,
    ):
        resp.read()
