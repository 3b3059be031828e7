"""The simulator's transcription, speech, moderation and rerank endpoints on the wire: OpenAI's
(and Cohere's) shapes, multipart uploads, audio bytes, and the chat endpoint's faults applied."""

from __future__ import annotations

import time

import httpx
import pytest

from llm_resilience_plugin.testing import Fault, ProviderSimulator
from llm_resilience_plugin.testing._audio import AUDIO_PREFIX, speech_bytes


def send(sim: ProviderSimulator, path: str, timeout: float = 5.0, **body: object) -> httpx.Response:
    if path == "audio/transcriptions":
        data = {k: str(v) for k, v in body.items() if k != "file"}
        files = {"file": body["file"]} if "file" in body else None
        headers = {"Authorization": "Bearer sk-sim-secret"}
        return httpx.post(
            f"{sim.api_base('d')}/{path}", data=data, files=files, headers=headers, timeout=timeout
        )
    base = f"{sim.base_url}/d/v2" if path == "rerank" else sim.api_base("d")
    return httpx.post(f"{base}/{path}", json=body, timeout=timeout)


CALLS = {
    "audio/transcriptions": {"model": "whisper-1", "file": ("clip.mp3", b"x" * 32000)},
    "audio/speech": {"model": "tts-1", "input": "hello", "voice": "alloy"},
    "moderations": {"model": "omni-moderation-latest", "input": ["fine", "FLAG this"]},
    "rerank": {"model": "rerank-english-v3.0", "query": "red cube", "documents": ["blue", "a red cube"]},
}


@pytest.mark.parametrize("path", list(CALLS))
def test_each_endpoint_answers_in_its_shape_and_is_logged(sim: ProviderSimulator, path: str) -> None:
    resp = send(sim, path, **CALLS[path])
    assert resp.status_code == 200 and resp.headers["x-simulator-deployment"] == "d"
    if path == "audio/transcriptions":
        assert resp.json()["text"] == "transcript of clip.mp3 (32000 bytes) on d"
    elif path == "audio/speech":
        assert resp.headers["content-type"] == "audio/mpeg"
        assert resp.content == speech_bytes("d", "hello") and resp.content.startswith(AUDIO_PREFIX)
    elif path == "moderations":
        assert [r["flagged"] for r in resp.json()["results"]] == [False, True]
    else:
        assert [r["index"] for r in resp.json()["results"]] == [1, 0]
    (record,) = sim.requests("d")
    assert record.behavior == "ok" and record.status == 200


def test_transcription_formats(sim: ProviderSimulator) -> None:
    verbose = send(sim, "audio/transcriptions", response_format="verbose_json", file=("a.wav", b"x" * 32000))
    assert verbose.json()["duration"] == 2.0
    assert sim.requests("d")[0].headers["authorization"] == "***"  # credentials never logged
    plain = send(sim, "audio/transcriptions", response_format="text", file=("a.wav", b"x"))
    assert plain.headers["content-type"].startswith("text/plain") and "a.wav" in plain.text


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("audio/transcriptions", {"model": "whisper-1"}, "file"),
        ("audio/speech", {"model": "tts-1", "input": ""}, "input"),
        ("moderations", {"model": "m", "input": []}, "input"),
        ("rerank", {"model": "r", "query": "q", "documents": []}, "documents"),
    ],
)
def test_a_request_missing_its_payload_is_a_400_consuming_no_script(
    sim: ProviderSimulator, path: str, body: dict, param: str
) -> None:
    sim.script("d", Fault.server_error(500))
    resp = send(sim, path, **body)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param
    assert sim.requests("d")[0].behavior == "bad_request"
    assert send(sim, path, **CALLS[path]).status_code == 500  # the script is still there


@pytest.mark.parametrize("path", list(CALLS))
def test_faults_apply_as_for_chat(sim: ProviderSimulator, path: str) -> None:
    sim.script("d", Fault.rate_limit(retry_after=2), Fault.ok(latency=0.2), Fault.malformed_chunk())
    limited = send(sim, path, **CALLS[path])
    assert limited.status_code == 429 and limited.headers["retry-after"] == "2"
    t0 = time.monotonic()
    assert send(sim, path, **CALLS[path]).status_code == 200
    assert time.monotonic() - t0 >= 0.2
    full = send(sim, path, **CALLS[path]).content
    assert len(full) < len(send(sim, path, **CALLS[path]).content)  # truncated body
    sim.set_default("d", Fault.reset())
    with pytest.raises(httpx.HTTPError):
        send(sim, path, **CALLS[path])


def test_faults_scripted_over_http_reach_these_endpoints(sim: ProviderSimulator) -> None:
    assert (
        httpx.post(f"{sim.base_url}/_faults/d", json={"kind": "server_error", "status": 503}).status_code
        == 200
    )
    assert send(sim, "audio/speech", **CALLS["audio/speech"]).status_code == 503
