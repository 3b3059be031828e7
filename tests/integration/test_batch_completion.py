"""LiteLLM's batch completions on the engine, over real HTTP to the simulator: each element one
resilient call (retried, failed over, reported), a final failure returned in place as LiteLLM
does, LiteLLM's shapes, and the checks made before any request."""

from __future__ import annotations

import litellm
import pytest

from llm_resilience_plugin import ConfigError, get_report
from llm_resilience_plugin.errors import ErrorClass
from llm_resilience_plugin.testing import Fault

from ..conftest import MSG

OTHER = [{"role": "user", "content": "And another question?"}]


async def test_one_conversation_to_each_model_is_one_resilient_call_per_model(sim, make_router):
    router = make_router({"g": ["a"], "h": ["b"]})
    sim.script("a", Fault.server_error(500))
    got = await router.abatch_completion(models=["g", "h"], messages=MSG)
    assert [type(r) for r in got] == [litellm.ModelResponse] * 2
    reports = [get_report(r) for r in got]
    assert [r.served_group for r in reports] == ["g", "h"]  # type: ignore[union-attr]
    assert [a.error_class for a in reports[0].attempts] == [ErrorClass.SERVER, None]  # type: ignore[union-attr]
    assert sim.count("a") == 2 and sim.count("b") == 1


async def test_an_element_that_finally_fails_is_its_exception_in_place(sim, make_router):
    router = make_router({"g": ["a"], "h": ["b"]})
    sim.set_default("b", Fault.http_error(400, message="nope"))
    good, bad = await router.abatch_completion(models=["g", "h"], messages=MSG)
    assert isinstance(good, litellm.ModelResponse)
    assert isinstance(bad, Exception)
    rep = get_report(bad)
    assert rep is not None and rep.outcome == "failure" and rep.error_class is ErrorClass.BAD_REQUEST
    assert sim.count("b") == 1  # a 400 is not retried


async def test_an_element_falls_back_like_any_call(sim, make_router):
    router = make_router({"g": ["a"], "h": ["b"], "backup": ["c"]}, fallbacks=[{"h": ["backup"]}])
    sim.outage("b", 60)
    got = await router.abatch_completion(models=["g", "h"], messages=MSG)
    assert [get_report(r).served_group for r in got] == ["g", "backup"]  # type: ignore[union-attr]


async def test_a_list_of_conversations_gives_a_list_per_conversation_of_one_answer_per_model(
    sim, make_router
):
    router = make_router({"g": ["a"], "h": ["b"]})
    got = await router.abatch_completion(models=["g", "h"], messages=[MSG, OTHER])
    assert len(got) == 2 and all(len(row) == 2 for row in got)
    assert [[get_report(r).served_group for r in row] for row in got] == [["g", "h"], ["g", "h"]]  # type: ignore[union-attr]
    sent = [r.body["messages"][-1]["content"] for r in sim.requests()]
    assert sorted(sent) == sorted([MSG[-1]["content"]] * 2 + [OTHER[-1]["content"]] * 2)


async def test_one_model_many_requests_answers_in_order_with_failures_in_place(sim, make_router):
    router = make_router({"g": ["a"]})
    sim.script("a", Fault.ok(), Fault.http_error(400, message="no"), Fault.ok())
    conversations = [[{"role": "user", "content": f"question {i}"}] for i in range(3)]
    got = await router.abatch_completion_one_model_multiple_requests(model="g", messages=conversations)
    assert len(got) == 3
    assert sum(isinstance(r, Exception) for r in got) == 1
    assert sum(isinstance(r, litellm.ModelResponse) for r in got) == 2
    for conv, r in zip(conversations, got, strict=True):
        if isinstance(r, litellm.ModelResponse):
            assert get_report(r).outcome == "success"  # type: ignore[union-attr]
            assert conv[0]["content"]


async def test_fastest_response_wins_and_the_rest_are_cancelled(sim, make_router):
    router = make_router({"g": ["a"], "h": ["b"]})
    sim.set_default("b", Fault.ok(latency=2))
    got = await router.abatch_completion_fastest_response(model="g, h", messages=MSG)
    assert isinstance(got, litellm.ModelResponse)
    assert got._hidden_params["fastest_response_batch_completion"] is True
    assert get_report(got).served_group == "g"  # type: ignore[union-attr]


async def test_fastest_response_raises_when_every_model_fails(sim, make_router):
    router = make_router({"g": ["a"], "h": ["b"]})
    for dep in ("a", "b"):
        sim.set_default(dep, Fault.http_error(400, message="no"))
    with pytest.raises(Exception, match="All tasks failed"):
        await router.abatch_completion_fastest_response(model="g,h", messages=MSG)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda r: r.abatch_completion(models=[], messages=MSG), "models"),
        (lambda r: r.abatch_completion(models=["g"], messages=[]), "messages"),
        (lambda r: r.abatch_completion(models=["g"], messages=[MSG[0], MSG]), "messages"),
        (lambda r: r.abatch_completion(models=["g"], messages=[{"role": "user", "content": 42}]), None),
        (lambda r: r.abatch_completion_one_model_multiple_requests(model="g", messages=MSG), "messages"),
        (lambda r: r.abatch_completion_fastest_response(model=["g"], messages=MSG), "model"),
    ],
)
async def test_a_callers_mistake_raises_before_any_request(sim, make_router, call, field):
    router = make_router({"g": ["a"]})
    with pytest.raises(ConfigError) as err:
        await call(router)
    if field is not None:
        assert err.value.field == field
    assert sim.count() == 0


async def test_an_unknown_group_raises_before_any_request(sim, make_router):
    router = make_router({"g": ["a"]})
    with pytest.raises(Exception, match="nope"):
        await router.abatch_completion(models=["g", "nope"], messages=MSG)
    assert sim.count() == 0


async def test_a_callers_idempotency_key_keys_each_element_apart(sim, make_router):
    router = make_router({"g": ["a"]}, idempotency_store="memory")
    conversations = [[{"role": "user", "content": f"question {i}"}] for i in range(2)]
    first = await router.abatch_completion_one_model_multiple_requests(
        model="g", messages=conversations, idempotency_key="job-7"
    )
    again = await router.abatch_completion_one_model_multiple_requests(
        model="g", messages=conversations, idempotency_key="job-7"
    )
    assert all(isinstance(r, litellm.ModelResponse) for r in first + again)
    assert sim.count("a") == 2  # each element sent once, then replayed
    assert [get_report(r).replayed for r in again] == [True, True]  # type: ignore[union-attr]
