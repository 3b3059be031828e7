"""One model request's way in, shared by every endpoint and dialect: read and redact it, reject a
malformed one (logged as ``bad_request``, no script consumed), admit it through the scripted
state, then apply its behaviour (errors, resets, silences here; success via the endpoint's writer).

Chat, Azure (through chat), embeddings, text completions, images, Responses and Anthropic Messages
all enter through :class:`Admissions`, so a fault means the same thing whichever dialect is asked.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from llm_resilience_plugin.testing._messages import JSONDict
from llm_resilience_plugin.testing._state import MutableRecord, SimulatorState
from llm_resilience_plugin.testing._writers import Call, abort, send_behavior_error, send_error_body

__all__ = [
    "REDACTED_HEADERS",
    "Admissions",
    "Answer",
    "Handler",
    "Intake",
    "Rejection",
    "add_post_routes",
    "apply_behavior",
    "read_request",
]

REDACTED_HEADERS = frozenset({"authorization", "api-key", "x-api-key", "proxy-authorization"})
"""Headers logged as ``***``: credentials never reach the request log."""

Answer = Callable[[Call], Awaitable[web.StreamResponse]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def add_post_routes(app: web.Application, table: dict[str, Handler]) -> None:
    """Register each OpenAI-style endpoint of ``table``, with and without a ``/{deployment}``
    prefix and ``/v1``."""
    for path, handler in table.items():
        for prefix in ("/v1/", "/", "/{deployment}/v1/", "/{deployment}/"):
            app.router.add_post(prefix + path, handler)


@dataclass(frozen=True)
class Intake:
    """A request as read: its JSON (``parsed``, None if not JSON), the body as a dict, redacted
    headers, and the deployment (path segment, else the body's ``model``, else ``default``)."""

    started: float
    parsed: Any
    body: JSONDict
    headers: dict[str, str]
    model: str
    deployment: str
    stream: bool


@dataclass(frozen=True)
class Rejection:
    """A request refused before admission: the status and the dialect's JSON error body."""

    status: int
    payload: JSONDict
    behavior: str = "bad_request"


async def read_request(request: web.Request) -> Intake:
    """Read and parse one request body; credentials in the headers are redacted."""
    started = time.monotonic()
    raw = await request.read()
    headers = {k.lower(): ("***" if k.lower() in REDACTED_HEADERS else v) for k, v in request.headers.items()}
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = None
    body: JSONDict = parsed if isinstance(parsed, dict) else {}
    model = body.get("model")
    model = model if isinstance(model, str) else ""
    deployment = request.match_info.get("deployment") or model or "default"
    return Intake(started, parsed, body, headers, model, deployment, body.get("stream") is True)


async def apply_behavior(
    call: Call, answer: Answer, error: Answer = send_behavior_error
) -> web.StreamResponse:
    """Apply an admitted request's behaviour: ``error`` writes an ``http_error`` in the dialect's
    shape, resets and silences drop the connection, anything else is ``answer``'s to write."""
    behavior = call.behavior
    kind = behavior.kind
    if kind == "http_error":
        return await error(call)
    if kind == "reset" or (kind == "stream_cut" and not call.stream):
        call.record.finish()
        abort(call.request, rst=True)
        return web.Response()
    if kind == "silence" or (kind == "stream_stall" and not call.stream):
        await asyncio.sleep(behavior.seconds)
        call.record.finish()
        abort(call.request, rst=True)
        return web.Response()
    return await answer(call)


class Admissions:
    """Reads, logs and admits requests for one family of endpoints; in-flight handlers join
    ``active`` (shared by all families) so the server can cancel them on stop."""

    def __init__(self, state: SimulatorState, active: set[asyncio.Task[Any]]) -> None:
        self._state = state
        self._numbers = itertools.count(1)
        self.active = active

    async def serve(
        self,
        request: web.Request,
        *,
        check: Callable[[Intake], Rejection | None],
        tokens_of: Callable[[JSONDict], int],
        answer: Answer,
        error: Answer = send_behavior_error,
        read: Callable[[web.Request], Awaitable[Intake]] = read_request,
    ) -> web.StreamResponse:
        """One exchange: ``read`` reads it (JSON by default; multipart for audio uploads),
        ``check`` may refuse it, ``tokens_of`` estimates its prompt (for the context window),
        ``answer`` writes a success and ``error`` an ``http_error``."""
        task = asyncio.current_task()
        if task is not None:
            self.active.add(task)
        record: MutableRecord | None = None
        try:
            intake = await read(request)
            rejection = check(intake)
            if rejection is not None:
                record = MutableRecord(
                    intake.deployment,
                    intake.model,
                    intake.stream,
                    intake.started,
                    rejection.behavior,
                    intake.body,
                    intake.headers,
                )
                self._state.log(record)
                return await send_error_body(
                    request, record, intake.deployment, rejection.status, rejection.payload, None
                )
            prompt_tokens = tokens_of(intake.body)
            behavior, record = self._state.admit(
                intake.deployment,
                intake.model,
                intake.stream,
                intake.started,
                intake.body,
                intake.headers,
                prompt_tokens,
            )
            call = Call(
                request=request,
                record=record,
                behavior=behavior,
                body=intake.body,
                deployment=intake.deployment,
                model=intake.model,
                stream=intake.stream,
                prompt_tokens=prompt_tokens,
                number=next(self._numbers),
            )
            return await apply_behavior(call, answer, error)
        except ConnectionError:
            # The client went away mid-write; aiohttp's own write of this dummy fails quietly.
            return web.Response()
        finally:
            if record is not None:
                record.finish()
            if task is not None:
                self.active.discard(task)
