"""The simulator's audio, moderation and rerank endpoints, with every scripted fault of the others.

* ``POST .../audio/transcriptions`` (multipart, as OpenAI's SDK uploads it): ``{"text": ...}``
  naming the file and its size; ``response_format: "verbose_json"`` adds ``duration`` (one second
  per 16 000 bytes) and ``language``; ``"text"``/``"srt"``/``"vtt"`` answer plain text.
* ``POST .../audio/speech``: ``input`` read back as audio bytes (``audio/mpeg``, an ``ID3`` header
  and the text), so a test can check what it got.
* ``POST .../moderations``: one unflagged result per input (``flagged`` when the text has
  ``"FLAG"`` in it).
* ``POST .../rerank`` and ``/v2/rerank`` (Cohere's, which LiteLLM's ``cohere/`` provider posts
  to ``<api_base>/v2/rerank``; ``api_base`` is ``{base_url}/{deployment}``): the documents
  ranked by the words they share with the query.

Faults (:mod:`._intake`): ``http_error``, ``reset``, ``silence`` and ``ok`` delays as for chat;
``malformed_chunk`` truncates a JSON answer. A request missing its payload gets a 400 (logged as
``bad_request``, no script consumed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from llm_resilience_plugin.testing._intake import (
    REDACTED_HEADERS,
    Admissions,
    Handler,
    Intake,
    Rejection,
    add_post_routes,
    read_request,
)
from llm_resilience_plugin.testing._messages import JSONDict, estimate_tokens
from llm_resilience_plugin.testing._state import SimulatorState
from llm_resilience_plugin.testing._writers import Call, send_json

__all__ = ["AUDIO_PREFIX", "AudioEndpoints", "speech_bytes"]

AUDIO_PREFIX = b"ID3\x04\x00\x00\x00\x00\x00\x00"
"""What every simulated speech answer starts with (an MP3's ID3 tag header)."""

_BYTES_PER_SECOND = 16_000


def speech_bytes(deployment: str, text: str) -> bytes:
    """The audio bytes the simulator returns for ``text`` on ``deployment``."""
    return AUDIO_PREFIX + f"{deployment}:{text}".encode()


async def _read_multipart(request: web.Request) -> Intake:
    """A multipart upload as an :class:`Intake`: its fields, the file as ``{filename, bytes}``."""
    if not request.content_type.startswith("multipart/"):
        return await read_request(request)
    started = time.monotonic()
    headers = {k.lower(): ("***" if k.lower() in REDACTED_HEADERS else v) for k, v in request.headers.items()}
    body: JSONDict = {}
    form = await request.post()
    for key, value in form.items():
        if isinstance(value, web.FileField):
            data = value.file.read()
            body[key] = {"filename": value.filename, "bytes": len(data)}
        else:
            body[key] = str(value)
    model = body.get("model")
    model = model if isinstance(model, str) else ""
    deployment = request.match_info.get("deployment") or model or "default"
    return Intake(started, body, body, headers, model, deployment, False)


def _needs(field: str, ok: Callable[[Any], bool]) -> Callable[[Intake], Rejection | None]:
    def check(intake: Intake) -> Rejection | None:
        if isinstance(intake.parsed, dict) and ok(intake.body.get(field)):
            return None
        error = {
            "message": f"Request body must carry a non-empty '{field}'.",
            "type": "invalid_request_error",
            "param": field,
            "code": None,
        }
        return Rejection(400, {"error": error})

    return check


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [
            v if isinstance(v, str) else str(v.get("text", "")) if isinstance(v, dict) else str(v)
            for v in value
        ]
    return []


def _document_text(doc: Any) -> str:
    if isinstance(doc, dict):
        return str(doc.get("text", ""))
    return str(doc)


async def _delay(call: Call) -> None:
    delay = call.behavior.latency + call.behavior.ttft
    if delay > 0:
        await asyncio.sleep(delay)


async def _send_raw(call: Call, payload: bytes, content_type: str) -> web.StreamResponse:
    """A 200 of raw bytes after the behaviour's delays (cut in half for ``malformed_chunk``)."""
    await _delay(call)
    if call.behavior.kind == "malformed_chunk":
        payload = payload[: max(1, len(payload) // 2)]
    response = web.Response(
        status=200,
        body=payload,
        content_type=content_type,
        headers={"x-simulator-deployment": call.deployment, **call.record.limit_headers},
    )
    call.record.status = 200
    call.record.finish()
    await response.prepare(call.request)
    await response.write_eof()
    return response


class AudioEndpoints:
    """aiohttp handlers for transcriptions, speech, moderations and rerank (see module docs)."""

    def __init__(self, state: SimulatorState, active: set[asyncio.Task[Any]]) -> None:
        self._admissions = Admissions(state, active)

    def add_routes(self, app: web.Application) -> None:
        """Register the four endpoints, with and without a ``/{deployment}`` prefix and ``/v1``."""
        table: dict[str, Handler] = {
            "audio/transcriptions": self.handle_transcription,
            "audio/speech": self.handle_speech,
            "moderations": self.handle_moderation,
            "rerank": self.handle_rerank,
        }
        add_post_routes(app, table)
        for path in ("/v2/rerank", "/{deployment}/v2/rerank"):  # Cohere's v2 (LiteLLM's default)
            app.router.add_post(path, self.handle_rerank)

    async def handle_transcription(self, request: web.Request) -> web.StreamResponse:
        """``POST .../audio/transcriptions``: the upload's name and size as its text."""
        return await self._admissions.serve(
            request,
            check=_needs("file", lambda f: isinstance(f, dict) and f.get("bytes", 0) > 0),
            tokens_of=lambda b: 0,
            answer=self._transcribe,
            read=_read_multipart,
        )

    async def _transcribe(self, call: Call) -> web.StreamResponse:
        body = call.body
        upload = body.get("file") or {}
        text = call.behavior.text or (
            f"transcript of {upload.get('filename')} ({upload.get('bytes')} bytes) on {call.deployment}"
        )
        form = body.get("response_format") or "json"
        if form in ("text", "srt", "vtt"):
            return await _send_raw(call, text.encode(), "text/plain")
        out: JSONDict = {"text": text}
        if form == "verbose_json":
            seconds = max(1.0, int(upload.get("bytes", 0)) / _BYTES_PER_SECOND)
            out.update({"task": "transcribe", "language": "english", "duration": seconds, "segments": []})
        return await send_json(call, out)

    async def handle_speech(self, request: web.Request) -> web.StreamResponse:
        """``POST .../audio/speech``: the input text as audio bytes."""
        return await self._admissions.serve(
            request,
            check=_needs("input", lambda v: isinstance(v, str) and bool(v)),
            tokens_of=lambda b: estimate_tokens(str(b.get("input") or "")),
            answer=self._speak,
        )

    async def _speak(self, call: Call) -> web.StreamResponse:
        text = call.behavior.text or str(call.body.get("input"))
        return await _send_raw(call, speech_bytes(call.deployment, text), "audio/mpeg")

    async def handle_moderation(self, request: web.Request) -> web.StreamResponse:
        """``POST .../moderations``: one result per input."""
        return await self._admissions.serve(
            request,
            check=_needs("input", lambda v: v not in (None, "", [])),
            tokens_of=lambda b: sum(estimate_tokens(t) for t in _texts(b.get("input"))),
            answer=self._moderate,
        )

    async def _moderate(self, call: Call) -> web.StreamResponse:
        categories = ("harassment", "hate", "self-harm", "sexual", "violence")
        results = []
        for text in _texts(call.body.get("input")):
            flagged = "FLAG" in text
            results.append(
                {
                    "flagged": flagged,
                    "categories": {c: flagged and c == "violence" for c in categories},
                    "category_scores": {
                        c: (0.9 if flagged and c == "violence" else 0.001) for c in categories
                    },
                }
            )
        return await send_json(
            call, {"id": f"modr-sim-{call.number}", "model": call.model, "results": results}
        )

    async def handle_rerank(self, request: web.Request) -> web.StreamResponse:
        """``POST .../rerank``: Cohere's shape, documents by words shared with the query."""
        return await self._admissions.serve(
            request,
            check=_needs("documents", lambda v: isinstance(v, list) and bool(v)),
            tokens_of=lambda b: (
                estimate_tokens(str(b.get("query") or ""))
                + sum(estimate_tokens(_document_text(d)) for d in b.get("documents") or [])
            ),
            answer=self._rerank,
        )

    async def _rerank(self, call: Call) -> web.StreamResponse:
        body = call.body
        query = set(str(body.get("query") or "").lower().split())
        docs = body.get("documents") or []
        scored = []
        for i, doc in enumerate(docs):
            words = set(_document_text(doc).lower().split())
            scored.append((len(query & words) / (len(query) or 1), i))
        scored.sort(key=lambda s: (-s[0], s[1]))
        top_n = body.get("top_n")
        if isinstance(top_n, int) and not isinstance(top_n, bool) and top_n > 0:
            scored = scored[:top_n]
        results: list[JSONDict] = []
        for score, i in scored:
            item: JSONDict = {"index": i, "relevance_score": round(score, 6)}
            if body.get("return_documents") is True:
                item["document"] = {"text": _document_text(docs[i])}
            results.append(item)
        meta = {"api_version": {"version": "1"}, "billed_units": {"search_units": 1}}
        return await send_json(call, {"id": f"rerank-sim-{call.number}", "results": results, "meta": meta})
