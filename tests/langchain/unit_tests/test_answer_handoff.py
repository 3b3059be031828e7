"""invoke hands the answer of a broken stream's call to the next run of the same request only:
once, on the router that answered it, and never outside the ``handed_over`` block; a model
called meanwhile (from a callback) with another request is sent as usual."""

from __future__ import annotations

from llm_resilience_plugin.errors import ErrorClass
from llm_resilience_plugin.events import CallReport, StreamRestart
from llm_resilience_plugin.langchain._recovery import AnsweredAgain, handed_over, take_answer

REQUEST = ("primary", [{"role": "user", "content": "hi"}], {"temperature": 0})


def _answered(group: str = "primary") -> AnsweredAgain:
    marker = StreamRestart("c1", group, "Once upon", ErrorClass.CONNECTION, "answer", response="the answer")
    return AnsweredAgain(marker, CallReport("c1", group, True, 0.0), REQUEST)


def test_the_answer_goes_once_to_the_same_request_on_the_same_router() -> None:
    router, other = object(), object()
    exc = _answered()
    assert isinstance(exc, Exception) and exc.partial_text == "Once upon"
    with handed_over(exc, router):
        assert take_answer(other, REQUEST) is None  # another router called meanwhile
        assert take_answer(router, ("backup", *REQUEST[1:])) is None  # another group
        judge = ("primary", [{"role": "user", "content": "grade this"}], {"temperature": 0})
        assert take_answer(router, judge) is None  # another request to the same group
        assert take_answer(router, REQUEST) == "the answer"
        assert take_answer(router, REQUEST) is None  # once
    with handed_over(exc, router):
        pass
    assert take_answer(router, REQUEST) is None  # not outside the block


def test_the_answering_run_never_reuses_the_callers_run_id() -> None:
    from uuid import uuid4

    from llm_resilience_plugin.langchain._recovery import new_run

    rid = uuid4()
    config = {"run_id": rid, "tags": ["t"], "metadata": {"tenant": "acme"}}
    assert new_run(config) == {"tags": ["t"], "metadata": {"tenant": "acme"}}
    assert config["run_id"] == rid  # the caller's own config is left alone
    assert new_run(None) is None and new_run({"tags": []}) == {"tags": []}
