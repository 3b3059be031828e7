"""A bring-your-own-key ``api_key`` given through LangChain (``model_kwargs``, ``.bind``) and
echoed by a failing provider never reaches ``response_metadata``, ``astream_events``, tracer runs
or the plugin's custom events: the call's key is scrubbed while it runs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tracers.base import BaseTracer
from langchain_core.tracers.schemas import Run

from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin.langchain import ResilientChatModel
from llm_resilience_plugin.testing import FakeClock, Fault, ProviderSimulator
from tests.conftest import FAST_POLICY, deployment

CALL_KEY = "byok-0f1e2d3c4b5a69788796a5b4"


class Runs(BaseTracer):
    """Keeps every finished run, as a tracer exporting them would see it."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[Run] = []

    def _persist_run(self, run: Run) -> None:
        self.runs.append(run)

    def _end_trace(self, run: Run) -> None:
        self.runs.append(run)
        super()._end_trace(run)


class CustomEvents(BaseCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.events.append((name, data))


@pytest.mark.parametrize("how", ["model_kwargs", "bind"])
async def test_a_per_call_key_never_reaches_langchain_surfaces(sim: ProviderSimulator, how: str) -> None:
    router = ResilientRouter(
        model_list=[deployment(sim, "primary", "a"), deployment(sim, "backup", "b")],
        policy=FAST_POLICY,
        fallbacks=[{"primary": ["backup"]}],
        clock=FakeClock(),
    )
    sim.set_default("a", Fault.http_error(500, message=f"Incorrect API key provided: {CALL_KEY}"))
    try:
        if how == "model_kwargs":
            model: Any = ResilientChatModel(
                router=router, model="primary", model_kwargs={"api_key": CALL_KEY}
            )
        else:
            model = ResilientChatModel(router=router, model="primary").bind(api_key=CALL_KEY)
        tracer, custom = Runs(), CustomEvents()
        msg = await model.ainvoke("hi", config={"callbacks": [tracer, custom]})
        assert msg.response_metadata["model_group"] == "backup"  # the echoing attempt failed over
        events = [e async for e in model.astream_events("hi", version="v2")]
        assert custom.events and tracer.runs
        surfaces = {
            "response_metadata": json.dumps(msg.response_metadata, default=str),
            "astream_events": json.dumps(events, default=str),
            "tracer runs": json.dumps([r.model_dump() for r in tracer.runs], default=str),
            "custom events": json.dumps(custom.events, default=str),
        }
        assert "Incorrect API key provided" in surfaces["response_metadata"]  # the echo is there...
        for name, text in surfaces.items():
            assert CALL_KEY not in text, name  # ...without the key
    finally:
        router.close()
