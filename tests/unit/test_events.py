"""Records and the readers of LiteLLM's response fields the router uses on every call."""

from __future__ import annotations

from types import SimpleNamespace

import litellm

from llm_resilience_plugin.events import AttemptRecord, CallReport, hidden_params_of, usage_of


def _response() -> litellm.ModelResponse:
    resp = litellm.ModelResponse(
        id="r1",
        model="gpt-4o-mini",
        choices=[{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    )
    resp._hidden_params = {"model_id": "a", "response_cost": 0.25}
    return resp


def test_hidden_params_is_litellms_own_dict() -> None:
    resp = _response()
    hidden = hidden_params_of(resp)
    assert hidden is resp._hidden_params  # writes (the report) land where get_report reads them
    assert hidden_params_of(SimpleNamespace(_hidden_params={"x": 1})) == {"x": 1}  # not pydantic
    assert hidden_params_of(SimpleNamespace(_hidden_params="nope")) is None
    assert hidden_params_of(object()) is None


def test_usage_reads_litellm_responses_and_plain_objects() -> None:
    expected = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert usage_of(_response()) == expected
    usage = SimpleNamespace(prompt_tokens=3, completion_tokens=2, total_tokens=5)
    assert usage_of(SimpleNamespace(usage=usage)) == expected
    assert usage_of(object()) is None


def test_deferred_attempts_are_built_in_order_on_first_read() -> None:
    report = CallReport("c1", "primary", False, 0.0)

    def values(n: int, outcome: str) -> tuple[object, ...]:
        return ("c1", n, "primary", "a", 0, outcome, None, None, None, 1.0, 0.1, 0.0, "closed", None, False)

    report.defer_attempt(values(1, "failure"))
    report.defer_attempt(values(2, "success"))  # builds the first one
    report.attempts.append(AttemptRecord(*values(3, "success")))  # direct appends keep the order
    assert [(a.attempt, a.outcome) for a in report.attempts] == [
        (1, "failure"),
        (2, "success"),
        (3, "success"),
    ]
    assert report.upstream_requests == 3
    assert report.to_dict()["attempts"][0]["outcome"] == "failure"
