"""The simulator's HTTP endpoints: chat completions (scripted), model lists and health.

:class:`Endpoints` reads a chat request, asks the shared :class:`SimulatorState` which behaviour
applies, and hands the exchange to a writer; it also tracks in-flight handlers so the server can
cancel them on stop.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

from aiohttp import web

from llm_resilience_plugin.testing._messages import JSONDict, estimate_prompt_tokens
from llm_resilience_plugin.testing._replies import build_reply
from llm_resilience_plugin.testing._state import MutableRecord, SimulatorState
from llm_resilience_plugin.testing._writers import (
    Call,
    abort,
    send_behavior_error,
    send_completion,
    send_error,
    send_stream,
)

__all__ = ["Endpoints"]

_REDACTED_HEADERS = frozenset({"authorization", "api-key", "x-api-key", "proxy-authorization"})


class Endpoints:
    """aiohttp handlers over one :class:`SimulatorState`; ``active`` holds the running chat tasks."""

    def __init__(self, state: SimulatorState) -> None:
        self._state = state
        self._numbers = itertools.count(1)
        self.active: set[asyncio.Task[Any]] = set()

    def add_routes(self, app: web.Application) -> None:
        """Register every endpoint the module docs list on ``app``."""
        app.router.add_post("/v1/chat/completions", self.handle_chat)
        app.router.add_post("/chat/completions", self.handle_chat)
        app.router.add_get("/health", self.handle_health)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_post("/{deployment}/v1/chat/completions", self.handle_chat)
        app.router.add_post("/{deployment}/chat/completions", self.handle_chat)
        app.router.add_get("/{deployment}/v1/models", self.handle_models)

    async def handle_health(self, request: web.Request) -> web.Response:
        """``GET /health``: always ``{"status": "ok"}``."""
        return web.json_response({"status": "ok"})

    async def handle_models(self, request: web.Request) -> web.Response:
        """``GET [/{deployment}]/v1/models``: the deployment, or every scripted one (else ``sim``)."""
        deployment = request.match_info.get("deployment")
        if deployment:
            names = [deployment]
        else:
            names = self._state.deployments() or ["sim"]
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "simulator"} for n in names]
        return web.json_response({"object": "list", "data": data})

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        """``POST .../chat/completions``: log the request and apply its scripted behaviour."""
        started = time.monotonic()
        task = asyncio.current_task()
        if task is not None:
            self.active.add(task)
        record: MutableRecord | None = None
        try:
            raw = await request.read()
            headers = {
                k.lower(): ("***" if k.lower() in _REDACTED_HEADERS else v)
                for k, v in request.headers.items()
            }
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = None
            body: JSONDict = parsed if isinstance(parsed, dict) else {}
            model = body.get("model")
            model = model if isinstance(model, str) else ""
            deployment = request.match_info.get("deployment") or model or "default"
            stream = body.get("stream") is True
            messages = body.get("messages")
            if not isinstance(parsed, dict) or not isinstance(messages, list):
                record = MutableRecord(deployment, model, stream, started, "bad_request", body, headers)
                self._state.log(record)
                return await send_error(
                    request, record, deployment, 400,
                    {
                        "message": "Request body must be a JSON object with a 'messages' list.",
                        "type": "invalid_request_error",
                        "param": "messages",
                        "code": None,
                    },
                    None,
                )  # fmt: skip
            prompt_tokens = estimate_prompt_tokens(messages)
            behavior, record = self._state.admit(
                deployment, model, stream, started, body, headers, prompt_tokens
            )
            call = Call(
                request=request,
                record=record,
                behavior=behavior,
                body=body,
                deployment=deployment,
                model=model,
                stream=stream,
                prompt_tokens=prompt_tokens,
                number=next(self._numbers),
            )
            return await self._apply(call)
        except ConnectionError:
            # The client went away mid-write; aiohttp's own write of this dummy fails quietly.
            return web.Response()
        finally:
            if record is not None:
                record.finish()
            if task is not None:
                self.active.discard(task)

    async def _apply(self, call: Call) -> web.StreamResponse:
        behavior = call.behavior
        kind = behavior.kind
        if kind == "http_error":
            return await send_behavior_error(call)
        if kind == "reset" or (kind == "stream_cut" and not call.stream):
            call.record.finish()
            abort(call.request, rst=True)
            return web.Response()
        if kind == "silence" or (kind == "stream_stall" and not call.stream):
            await asyncio.sleep(behavior.seconds)
            call.record.finish()
            abort(call.request, rst=True)
            return web.Response()
        reply = build_reply(call.body, call.deployment, behavior.text)
        if call.stream:
            return await send_stream(call, reply)
        return await send_completion(call, reply)
