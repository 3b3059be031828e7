"""How a long provider error body is cut at the transport (``_error_bodies``): JSON keeps its
structure and codes, other text its head, compressed bodies are decoded first, short bodies and
requests outside the plugin's attempts pass untouched."""

from __future__ import annotations

import gzip
import json
from typing import Any

import httpx
import pytest

from llm_resilience_plugin._error_bodies import (
    ERROR_BODY_LIMIT,
    LIST_LIMIT,
    STRING_LIMIT,
    bound_text,
    bound_transport,
    bounded,
    is_bounded,
)


def test_short_bodies_are_kept() -> None:
    assert bound_text("x" * ERROR_BODY_LIMIT) is None


def test_a_json_body_keeps_its_structure_and_codes() -> None:
    doc = {"error": {"message": "bad input: " + "y" * 100_000, "type": "invalid_request_error", "code": "x1"}}
    out = json.loads(bound_text(json.dumps(doc)) or "")
    assert out["error"]["code"] == "x1" and out["error"]["type"] == "invalid_request_error"
    message = out["error"]["message"]
    assert message.startswith("bad input: y") and message.endswith("more characters not shown]")
    assert len(message) < STRING_LIMIT + 50


def test_a_long_json_list_is_cut_to_its_first_items() -> None:
    doc = {"detail": [{"loc": ["body", i], "msg": "field required"} for i in range(2_000)]}
    out = json.loads(bound_text(json.dumps(doc)) or "")
    assert (
        len(out["detail"]) == LIST_LIMIT + 1
        and out["detail"][-1] == f"... [{2_000 - LIST_LIMIT} more items not shown]"
    )


def test_other_text_keeps_its_head() -> None:
    page = "<html><title>502 Bad Gateway</title>" + "<p>padding</p>" * 20_000
    out = bound_text(page) or ""
    assert out.startswith("<html><title>502 Bad Gateway</title>") and out.endswith(
        "more characters not shown]"
    )
    assert len(out) < ERROR_BODY_LIMIT + 50
    assert (bound_text("{not json" + "z" * 20_000) or "").startswith("{not json")


def _transport(status: int, body: bytes, headers: dict[str, str]) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=headers, content=body)

    transport = httpx.MockTransport(answer)
    bound_transport(transport)
    return transport


async def _get(transport: httpx.MockTransport, *, inside: bool) -> httpx.Response:
    async with httpx.AsyncClient(transport=transport) as client:
        if inside:
            with bounded():
                assert is_bounded()
                return await client.post("http://provider.test/v1/chat/completions", json={})
        assert not is_bounded()
        return await client.post("http://provider.test/v1/chat/completions", json={})


@pytest.mark.parametrize("inside", [True, False])
async def test_a_gzip_error_body_is_decoded_then_cut_inside_an_attempt_only(inside: bool) -> None:
    doc: dict[str, Any] = {"error": {"message": "m" * 200_000, "code": "too_long"}}
    raw = gzip.compress(json.dumps(doc).encode())
    transport = _transport(
        400, raw, {"content-encoding": "gzip", "content-type": "application/json", "retry-after": "3"}
    )
    resp = await _get(transport, inside=inside)
    assert resp.status_code == 400 and resp.headers["retry-after"] == "3"
    body = resp.json()
    assert body["error"]["code"] == "too_long"
    assert (len(body["error"]["message"]) < STRING_LIMIT + 50) is inside


async def test_successes_and_short_errors_pass_untouched() -> None:
    ok = await _get(_transport(200, b"a" * 50_000, {"content-type": "text/plain"}), inside=True)
    assert ok.text == "a" * 50_000
    short = await _get(
        _transport(404, b'{"error": "nope"}', {"content-type": "application/json"}), inside=True
    )
    assert short.json() == {"error": "nope"}
