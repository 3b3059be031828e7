"""Faults scriptable over HTTP, for a standalone simulator (``llm-resilience simulator``).

``POST /_faults/<deployment>`` with a fault mapping (``{"kind": "rate_limit", "retry_after": 1}``,
the form of scenario files) makes it the deployment's default; ``{"script": [fault, ...]}``
queues faults, one per request; ``{"outage": seconds, "fault": {...}}`` opens an outage window.
``DELETE /_faults/<deployment>`` clears them (healthy again); ``DELETE /_faults`` resets everything.
A bad body gets a 400 naming the field.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from llm_resilience_plugin.testing._fault_spec import behavior_from_data
from llm_resilience_plugin.testing._state import SimulatorState, check_deployment

__all__ = ["add_fault_routes"]


def _apply(state: SimulatorState, deployment: str, body: Any) -> str:
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object: a fault, {script: [...]} or {outage, fault}")
    if "script" in body:
        script = body["script"]
        if set(body) != {"script"} or not isinstance(script, list):
            raise ValueError('script: expected {"script": [fault, ...]} and nothing else')
        state.script(deployment, *(behavior_from_data(f) for f in script))
        return f"queued {len(script)} fault(s)"
    if "outage" in body:
        seconds = body["outage"]
        if (
            set(body) - {"outage", "fault"}
            or isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
        ):
            raise ValueError('outage: expected {"outage": seconds, "fault": {...}}')
        fault = behavior_from_data(body["fault"]) if "fault" in body else None
        state.outage(deployment, float(seconds), fault)
        return f"outage for {seconds:g} s"
    state.set_default(deployment, behavior_from_data(body))
    return f"default {body.get('kind')}"


def add_fault_routes(app: web.Application, state: SimulatorState) -> None:
    """Register ``POST``/``DELETE /_faults/{deployment}`` and ``DELETE /_faults`` on ``app``."""

    async def post(request: web.Request) -> web.Response:
        try:
            deployment = check_deployment(request.match_info["deployment"])
            try:
                body = json.loads(await request.read())
            except ValueError:
                raise ValueError("the body is not JSON") from None
            done = _apply(state, deployment, body)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"deployment": deployment, "applied": done})

    async def delete(request: web.Request) -> web.Response:
        deployment = request.match_info.get("deployment")
        if deployment is None:
            state.reset()
            return web.json_response({"reset": True})
        state.clear(deployment)
        return web.json_response({"deployment": deployment, "applied": "healthy"})

    app.router.add_post("/_faults/{deployment}", post)
    app.router.add_delete("/_faults/{deployment}", delete)
    app.router.add_delete("/_faults", delete)
