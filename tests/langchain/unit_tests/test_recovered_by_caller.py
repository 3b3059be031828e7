"""invoke/ainvoke recover a stream broken after content themselves (they ask again), so the stream
they open tells the router so (``recovered_by_caller``): its idle limit may then be learned. A
caller's own ``stream``/``astream`` does not."""

from __future__ import annotations

from typing import Any

from llm_resilience_plugin.langchain._requests import ChatRequest, run_config


def _request() -> ChatRequest:
    none: Any = None  # the router and the sink are not used by params_for
    return ChatRequest(none, "m", "primary", [], {"temperature": 0}, None, none)


def test_a_stream_opened_by_invoke_says_the_caller_recovers_it() -> None:
    req = _request()
    with run_config(None, aggregating=True):
        assert req.params_for(stream=True)["recovered_by_caller"] is True
        assert "recovered_by_caller" not in req.params_for(stream=False)  # nothing to recover


def test_a_callers_own_stream_does_not() -> None:
    req = _request()
    with run_config(None):
        assert "recovered_by_caller" not in req.params_for(stream=True)
    assert "recovered_by_caller" not in req.params_for(stream=True)  # outside any run
