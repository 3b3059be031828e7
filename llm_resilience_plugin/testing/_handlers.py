"""The simulator's HTTP endpoints: chat completions (scripted), model lists and health.

:class:`Endpoints` admits a chat request through the shared intake (:mod:`._intake`: read, log,
pick the behaviour) and hands a success to the chat writers; it also tracks in-flight handlers so
the server can cancel them on stop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from llm_resilience_plugin.testing._intake import Admissions, Intake, Rejection
from llm_resilience_plugin.testing._messages import estimate_prompt_tokens
from llm_resilience_plugin.testing._replies import build_reply
from llm_resilience_plugin.testing._state import SimulatorState
from llm_resilience_plugin.testing._writers import Call, send_completion, send_stream

__all__ = ["Endpoints"]


class Endpoints:
    """aiohttp handlers over one :class:`SimulatorState`; ``active`` holds the running chat tasks."""

    def __init__(self, state: SimulatorState) -> None:
        self._state = state
        self.active: set[asyncio.Task[Any]] = set()
        self._admissions = Admissions(state, self.active)

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
        return await self._admissions.serve(
            request,
            check=_check_chat,
            tokens_of=lambda body: estimate_prompt_tokens(body["messages"]),
            answer=_answer_chat,
        )


def _check_chat(intake: Intake) -> Rejection | None:
    """A chat body must be a JSON object with a ``messages`` list."""
    if isinstance(intake.parsed, dict) and isinstance(intake.body.get("messages"), list):
        return None
    error = {
        "message": "Request body must be a JSON object with a 'messages' list.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": None,
    }
    return Rejection(400, {"error": error})


async def _answer_chat(call: Call) -> web.StreamResponse:
    reply = build_reply(call.body, call.deployment, call.behavior.text)
    if call.stream:
        return await send_stream(call, reply)
    return await send_completion(call, reply)
