"""A stream invoke/ainvoke open is one LangChain aggregates: it asks the engine to recover a break
after content by answering again whole (``recover_streams="answer"``), inside the same call. It no
longer claims to recover the stream itself (``recovered_by_caller``): only a recovery that will
happen may let the stream's idle limit be learned. Only the invoking model's own request is
aggregated - not a caller's own ``stream``/``astream``, nor a model called from a callback."""

from __future__ import annotations

from typing import Any

from llm_resilience_plugin.langchain._requests import ChatRequest, claim_aggregation, run_config


def _request(aggregated: bool, **params: Any) -> ChatRequest:
    none: Any = None  # the router and the sink are not used by params_for
    return ChatRequest(
        none, "m", "primary", [], {"temperature": 0, **params}, None, none, aggregated=aggregated
    )


def test_a_stream_opened_by_invoke_asks_the_engine_to_answer_again() -> None:
    req = _request(True)
    sent = req.params_for(stream=True)
    assert sent["recover_streams"] == "answer"
    assert "recovered_by_caller" not in sent  # the engine recovers it, within its cap
    assert "recover_streams" not in req.params_for(stream=False)  # nothing to recover


def test_the_callers_own_choice_is_kept_in_the_form_an_aggregated_stream_takes() -> None:
    assert _request(True, recover_streams=False).params_for(stream=True)["recover_streams"] is False
    assert _request(True, recover_streams=True).params_for(stream=True)["recover_streams"] == "answer"


def test_a_callers_own_stream_does_not() -> None:
    assert "recover_streams" not in _request(False).params_for(stream=True)


def test_only_the_invoking_models_first_request_is_aggregated() -> None:
    model, other = object(), object()
    assert not claim_aggregation(model)  # outside any invoke
    with run_config(None, aggregating=model):
        assert not claim_aggregation(other)  # another model called from a callback
        assert claim_aggregation(model)
        assert not claim_aggregation(model)  # once: a later request of the run is not
    with run_config(None):
        assert not claim_aggregation(model)  # stream()/astream()
