"""The simulator's other OpenAI endpoints: embeddings, text completions, image generations and the
Responses API, each with every scripted fault of the chat endpoint.

A request is admitted through the same :class:`SimulatorState` as a chat request (outage window,
token bucket, context window, scripted queue, default), logged with the same record, and answered:

* ``POST .../embeddings``: one deterministic unit vector per input (a hash of deployment and
  text), of the deployment's dimension (:meth:`OtherEndpoints.set_dimension`, default 16, or the
  request's ``dimensions``); ``encoding_format: "base64"`` (the OpenAI SDK's default on the wire)
  gives little-endian float32; ``usage.prompt_tokens`` is the token estimate of the inputs.
* ``POST .../completions``: a ``text_completion`` with the chat reply's text for the prompt, plain
  or streamed (``data: [DONE]``).
* ``POST .../images/generations``: ``n`` images as ``b64_json`` (a 1x1 PNG) or ``url``.
* ``POST .../responses``: a ``response`` object, or, with ``stream: true``, the typed events from
  ``response.created`` to ``response.completed``.

Faults: ``http_error`` (any status, ``Retry-After``), ``reset``, ``silence``, ``ok`` delays
(``latency`` + ``ttft``), ``malformed_chunk`` (a truncated JSON body, or an invalid event in a
stream), ``stream_cut`` / ``stream_stall`` (after ``after_chunks`` events; a reset / silence when
not streaming) and ``no_done``, exactly as for chat.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import json
import math
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from llm_resilience_plugin.testing._intake import Admissions, Handler, Intake, Rejection, add_post_routes
from llm_resilience_plugin.testing._messages import JSONDict, content_text, default_text, estimate_tokens
from llm_resilience_plugin.testing._state import SimulatorState
from llm_resilience_plugin.testing._writers import Call, send_events, send_json, sse_event

__all__ = ["DEFAULT_DIMENSION", "OtherEndpoints", "embedding_vector"]

DEFAULT_DIMENSION = 16
_DONE = b"data: [DONE]\n\n"
_MALFORMED = b'data: {"id": "broken", "choices": [{"text": "oops"\n\n'
# A 1x1 transparent PNG: what every simulated image is.
_PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6300010000050001"
        "0d0a2db40000000049454e44ae426082"
    )
).decode()


def embedding_vector(deployment: str, text: str, dimension: int) -> list[float]:
    """The deterministic unit vector the simulator returns for ``text`` on ``deployment``."""
    raw: list[float] = []
    counter = 0
    while len(raw) < dimension:
        digest = hashlib.sha256(f"{deployment}\x00{counter}\x00{text}".encode()).digest()
        raw.extend((b - 127.5) / 127.5 for b in digest)
        counter += 1
    raw = raw[:dimension]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


def _texts(value: Any) -> list[str]:
    """The texts of an ``input``/``prompt`` value: a string, a list of strings, or token lists."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        if value and all(isinstance(x, int) for x in value):
            return [" ".join(map(str, value))]
        return [x if isinstance(x, str) else json.dumps(x) for x in value]
    return []


def _responses_text(value: Any) -> str:
    """The last user text of a Responses ``input`` (a string or a list of input items)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        for item in reversed(value):
            if isinstance(item, dict) and item.get("role", "user") == "user":
                return content_text(item.get("content"))[0]
    return ""


def _words(text: str, limit: Any) -> tuple[list[str], str]:
    words = [w + " " for w in text.split(" ")]
    if words:
        words[-1] = words[-1][:-1]
    if isinstance(limit, int) and not isinstance(limit, bool) and 0 <= limit < len(words):
        return words[:limit], "length"
    return words, "stop"


class OtherEndpoints:
    """aiohttp handlers for embeddings, text completions, images and Responses (see module docs);
    in-flight handlers join ``active`` so the server cancels them on stop."""

    def __init__(self, state: SimulatorState, active: set[asyncio.Task[Any]]) -> None:
        self._state = state
        self._admissions = Admissions(state, active)
        self.active = active
        self._dimensions: dict[str, int] = {}

    def set_dimension(self, deployment: str, dimension: int | None) -> None:
        """The length of ``deployment``'s embedding vectors (None: back to the default)."""
        if dimension is None:
            self._dimensions.pop(deployment, None)
            return
        if isinstance(dimension, bool) or not isinstance(dimension, int) or dimension < 1:
            raise ValueError(f"dimension must be a positive integer, got {dimension!r}")
        self._dimensions[deployment] = dimension

    def reset(self) -> None:
        """Forget every configured dimension."""
        self._dimensions.clear()

    def add_routes(self, app: web.Application) -> None:
        """Register the four endpoints, with and without a ``/{deployment}`` prefix and ``/v1``."""
        table: dict[str, Handler] = {
            "embeddings": self.handle_embeddings,
            "completions": self.handle_completions,
            "images/generations": self.handle_images,
            "responses": self.handle_responses,
        }
        add_post_routes(app, table)

    # -- the common exchange ---------------------------------------------------------------------

    async def _exchange(
        self,
        request: web.Request,
        required: str,
        tokens_of: Callable[[JSONDict], int],
        answer: Callable[[Call], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        """Read, log and admit one request (``required`` names the body field it needs), then
        apply its behaviour; ``answer`` writes a success."""

        def check(intake: Intake) -> Rejection | None:
            if isinstance(intake.parsed, dict) and intake.body.get(required) not in (None, "", []):
                return None
            error = {
                "message": f"Request body must be a JSON object with a non-empty '{required}'.",
                "type": "invalid_request_error",
                "param": required,
                "code": None,
            }
            return Rejection(400, {"error": error})

        return await self._admissions.serve(request, check=check, tokens_of=tokens_of, answer=answer)

    async def _send_events(self, call: Call, events: list[bytes], closing: list[bytes]) -> web.StreamResponse:
        """SSE ``events`` then ``closing`` with the behaviour's delays, cut, stall or bad event."""
        return await send_events(call, events, closing, malformed=_MALFORMED, done=_DONE)

    # -- embeddings -------------------------------------------------------------------------------

    async def handle_embeddings(self, request: web.Request) -> web.StreamResponse:
        """``POST .../embeddings``: deterministic vectors, OpenAI's shape."""
        return await self._exchange(
            request, "input", lambda b: sum(estimate_tokens(t) for t in _texts(b.get("input"))), self._embed
        )

    async def _embed(self, call: Call) -> web.StreamResponse:
        body = call.body
        dims = body.get("dimensions")
        if not (isinstance(dims, int) and not isinstance(dims, bool) and dims > 0):
            dims = self._dimensions.get(call.deployment, DEFAULT_DIMENSION)
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for i, text in enumerate(_texts(body.get("input"))):
            vector = embedding_vector(call.deployment, text, dims)
            value: Any = vector
            if as_base64:
                value = base64.b64encode(struct.pack(f"<{dims}f", *vector)).decode()
            data.append({"object": "embedding", "index": i, "embedding": value})
        out = {
            "object": "list",
            "data": data,
            "model": call.model,
            "usage": {"prompt_tokens": call.prompt_tokens, "total_tokens": call.prompt_tokens},
        }
        return await send_json(call, out)

    # -- text completions -----------------------------------------------------------------------

    async def handle_completions(self, request: web.Request) -> web.StreamResponse:
        """``POST .../completions``: a text completion, plain or streamed."""
        return await self._exchange(
            request,
            "prompt",
            lambda b: sum(estimate_tokens(t) for t in _texts(b.get("prompt"))),
            self._complete,
        )

    async def _complete(self, call: Call) -> web.StreamResponse:
        body = call.body
        prompts = _texts(body.get("prompt")) or [""]
        words, finish = _words(
            call.behavior.text or default_text(call.deployment, prompts[-1]), body.get("max_tokens")
        )
        usage = {
            "prompt_tokens": call.prompt_tokens,
            "completion_tokens": len(words),
            "total_tokens": call.prompt_tokens + len(words),
        }
        base = {
            "id": f"cmpl-sim-{call.number}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": call.model,
        }
        if not call.stream:
            choice = {"text": "".join(words), "index": 0, "logprobs": None, "finish_reason": finish}
            return await send_json(call, {**base, "choices": [choice], "usage": usage})

        def chunk(text: str, reason: str | None) -> bytes:
            return sse_event(
                {**base, "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": reason}]}
            )

        events = [chunk(w, None) for w in words]
        closing = [chunk("", finish)]
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage") is True:
            closing.append(sse_event({**base, "choices": [], "usage": usage}))
        closing.append(_DONE)
        return await self._send_events(call, events, closing)

    # -- images -----------------------------------------------------------------------------------

    async def handle_images(self, request: web.Request) -> web.StreamResponse:
        """``POST .../images/generations``: ``n`` tiny PNGs, base64 or URL."""
        return await self._exchange(
            request, "prompt", lambda b: estimate_tokens(str(b.get("prompt") or "")), self._image
        )

    async def _image(self, call: Call) -> web.StreamResponse:
        body = call.body
        n = body.get("n")
        n = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
        as_url = body.get("response_format") == "url"
        data = [
            {"url": f"http://127.0.0.1/{call.deployment}/images/{call.number}-{i}.png"}
            if as_url
            else {"b64_json": _PNG, "revised_prompt": str(body.get("prompt"))}
            for i in range(n)
        ]
        usage = {
            "input_tokens": call.prompt_tokens,
            "output_tokens": 0,
            "total_tokens": call.prompt_tokens,
            "input_tokens_details": {"text_tokens": call.prompt_tokens, "image_tokens": 0},
        }
        return await send_json(call, {"created": int(time.time()), "data": data, "usage": usage})

    # -- Responses API ----------------------------------------------------------------------------

    async def handle_responses(self, request: web.Request) -> web.StreamResponse:
        """``POST .../responses``: a Responses API answer, plain or as streamed events."""
        return await self._exchange(
            request, "input", lambda b: estimate_tokens(_responses_text(b.get("input"))) + 2, self._respond
        )

    async def _respond(self, call: Call) -> web.StreamResponse:
        body = call.body
        words, finish = _words(
            call.behavior.text or default_text(call.deployment, _responses_text(body.get("input"))),
            body.get("max_output_tokens"),
        )
        text = "".join(words)
        rid, mid = f"resp_sim_{call.number}", f"msg_sim_{call.number}"
        usage = {
            "input_tokens": call.prompt_tokens,
            "output_tokens": len(words),
            "total_tokens": call.prompt_tokens + len(words),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        part = {"type": "output_text", "text": text, "annotations": []}
        item = {"type": "message", "id": mid, "status": "completed", "role": "assistant", "content": [part]}

        def response(status: str, output: list[JSONDict], use: JSONDict | None) -> JSONDict:
            return {
                "id": rid,
                "object": "response",
                "created_at": int(time.time()),
                "status": status,
                "model": call.model,
                "output": output,
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
                "incomplete_details": {"reason": "max_output_tokens"} if finish == "length" else None,
                "usage": use,
            }

        final = response("completed" if finish == "stop" else "incomplete", [item], usage)
        if not call.stream:
            return await send_json(call, final)
        seq = itertools.count()

        def event(kind: str, **fields: Any) -> bytes:
            return sse_event({"type": kind, "sequence_number": next(seq), **fields}, kind)

        at = {"item_id": mid, "output_index": 0, "content_index": 0}
        opening = [
            event("response.created", response=response("in_progress", [], None)),
            event("response.in_progress", response=response("in_progress", [], None)),
            event(
                "response.output_item.added",
                output_index=0,
                item={**item, "status": "in_progress", "content": []},
            ),
            event("response.content_part.added", part={**part, "text": ""}, **at),
        ]
        deltas = [event("response.output_text.delta", delta=w, **at) for w in words]
        closing = [
            event("response.output_text.done", text=text, **at),
            event("response.content_part.done", part=part, **at),
            event("response.output_item.done", output_index=0, item=item),
            event("response.completed" if finish == "stop" else "response.incomplete", response=final),
        ]
        # The opening events are sent with the first delta, so ``after_chunks`` counts text deltas.
        if deltas:
            deltas[0] = b"".join(opening) + deltas[0]
        else:
            closing = opening + closing
        return await self._send_events(call, deltas, closing)
