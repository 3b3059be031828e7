"""Faults scripted over HTTP on a running simulator (what a standalone one offers)."""

from __future__ import annotations

import json
import urllib.request

import pytest


def _send(url: str, method: str, body: object = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _chat(sim, deployment: str) -> int:
    return _send(
        f"{sim.api_base(deployment)}/chat/completions",
        "POST",
        {"messages": [{"role": "user", "content": "hi"}]},
    )[0]


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def test_post_delete_script_and_outage(llm_simulator) -> None:
    base = f"{llm_simulator.base_url}/_faults"
    assert _send(f"{base}/a", "POST", {"kind": "rate_limit", "retry_after": 1})[0] == 200
    assert _chat(llm_simulator, "a") == 429 and _chat(llm_simulator, "a") == 429
    assert _send(f"{base}/a", "DELETE")[0] == 200
    assert _chat(llm_simulator, "a") == 200
    _send(f"{base}/b", "POST", {"script": [{"kind": "auth"}, {"kind": "server_error", "status": 502}]})
    assert [_chat(llm_simulator, "b") for _ in range(3)] == [401, 502, 200]
    _send(f"{base}/c", "POST", {"outage": 30, "fault": {"kind": "overloaded"}})
    assert _chat(llm_simulator, "c") == 529
    assert _send(base, "DELETE")[0] == 200
    assert _chat(llm_simulator, "c") == 200


def test_a_bad_fault_is_a_400_naming_the_field(llm_simulator) -> None:
    status, body = _send(f"{llm_simulator.base_url}/_faults/a", "POST", {"kind": "rate_limit", "status": 3})
    assert status == 400 and "rate_limit does not take status" in body["error"]
    status, body = _send(f"{llm_simulator.base_url}/_faults/a", "POST", {"script": "no"})
    assert status == 400 and "script" in body["error"]
