"""Embeddings, text completions, image generations and the Responses API through the same engine,
over real HTTP to the simulator: Retry-After, costs settled, streams, batches, and the checks made
before any request (modes, dimensions, payloads). (What every operation does alike - LiteLLM's
type, an outage and its fallback, a silent provider, a budget refusal: test_operations_shared.py.)"""

from __future__ import annotations

import litellm
import pytest

from llm_resilience_plugin import ConfigError, get_report
from llm_resilience_plugin.cost import Budget, CostGuard
from llm_resilience_plugin.errors import ErrorClass
from llm_resilience_plugin.events import hidden_params_of
from llm_resilience_plugin.testing import FakeClock, Fault, embedding_vector

from ..conftest import requires_capability
from ._operations import (
    ENDPOINTS,
    call_for,
)

OPERATIONS = ENDPOINTS


@pytest.mark.parametrize(
    "operation",
    [
        pytest.param(op, marks=requires_capability("image_sdk_retries_off"))
        if op == "image_generation"
        else op
        for op in OPERATIONS
    ],
)
async def test_429_with_retry_after_is_retried_after_the_gap(build, sim, operation):
    clock = FakeClock()
    router = build(operation, {"g": ["a"]}, clock=clock)
    sim.script("a", Fault.rate_limit(retry_after=2))
    resp = await call_for(router, operation)("g")
    rep = get_report(resp)
    assert sim.count("a") == 2  # exactly one retry: no SDK or Router retry underneath
    assert rep is not None and rep.outcome == "success"
    assert rep.attempts[0].error_class is ErrorClass.RATE_LIMIT
    assert rep.attempts[1].wait_before_s >= 1.9  # the Retry-After gap (less the time already past)


async def test_cost_guard_settles_embeddings_and_images_from_what_was_served(build, sim):
    guard = CostGuard([Budget.daily(10)])
    router = build("embedding", {"g": ["a"]}, guards=[guard])
    resp = await router.aembedding(model="g", input=["one two three"])
    (entry,) = guard.ledger.entries()
    assert entry.cost == pytest.approx(hidden_params_of(resp)["response_cost"]) and entry.cost > 0
    guard2 = CostGuard([Budget.daily(10)])
    images = build("image_generation", {"g": ["i"]}, guards=[guard2])
    await images.aimage_generation(model="g", prompt="a red cube", n=3)
    (entry,) = guard2.ledger.entries()
    assert entry.cost == pytest.approx(3 * 0.04)


@pytest.mark.parametrize("operation", ["text_completion", "responses"])
async def test_streams_relay_every_chunk_and_report_usage(build, sim, operation):
    router = build(operation, {"g": ["a"]})
    stream = await call_for(router, operation)("g", stream=True)
    chunks = [c async for c in stream]
    assert len(chunks) > 3
    assert stream.partial_text.startswith("Hello from a")
    rep = get_report(stream)
    assert rep is not None and rep.outcome == "success" and rep.usage and rep.usage["completion_tokens"] > 0


@pytest.mark.parametrize("operation", ["text_completion", "responses"])
async def test_stream_failing_before_the_first_chunk_is_retried(build, sim, operation):
    router = build(operation, {"g": ["a"]})
    sim.script("a", Fault.server_error(503))
    stream = await call_for(router, operation)("g", stream=True)
    _ = [c async for c in stream]
    assert sim.count("a") == 2 and stream.report.outcome == "success"


def test_blocking_twins(build, sim):
    emb = build("embedding", {"g": ["a"]})
    assert len(emb.embedding("g", ["x", "y"]).data) == 2
    txt = build("text_completion", {"t": ["b"]})
    assert txt.text_completion("t", "hello").choices[0].text.startswith("Hello from b")
    assert any(c.choices and c.choices[0].text for c in txt.text_completion("t", "hello", stream=True))
    assert len(build("image_generation", {"i": ["c"]}).image_generation("i", "cube", n=2).data) == 2
    assert build("responses", {"r": ["d"]}).responses("r", "hello").output_text.startswith("Hello from d")


# -- embeddings done right -------------------------------------------------------------------------


async def test_embeddings_are_the_simulators_vectors_in_order(build, sim):
    sim.set_embedding_dimension("a", 8)
    router = build("embedding", {"g": ["a"]})
    resp = await router.aembedding(model="g", input=["x", "y", "z"])
    assert [d["embedding"] for d in resp.data] == [embedding_vector("a", t, 8) for t in "xyz"]


async def test_a_batch_over_the_limit_is_split_and_joined_in_order(build, sim):
    router = build(
        "embedding",
        {"g": ["a"]},
        info={"a": {"max_embedding_batch_size": 2}},
        policy={"embedding_batch_concurrency": 1},  # the requests' order is the batches' order
    )
    texts = [f"text {i}" for i in range(5)]
    resp = await router.aembedding(model="g", input=texts)
    assert [len(r.body["input"]) for r in sim.requests("a")] == [2, 2, 1]
    assert [d["index"] for d in resp.data] == list(range(5))
    assert [d["embedding"] for d in resp.data] == [embedding_vector("a", t, 16) for t in texts]
    rep = get_report(resp)
    assert (
        rep is not None
        and rep.upstream_requests == 3
        and rep.usage["prompt_tokens"] == resp.usage.prompt_tokens
    )


async def test_a_failed_batch_is_retried_whole_and_a_lost_one_fails_the_call(build, sim):
    # batches one at a time, so the scripted faults meet them in input order (the concurrent
    # case: tests/integration/test_embedding_batches.py)
    router = build(
        "embedding",
        {"g": ["a"]},
        info={"a": {"max_embedding_batch_size": 2}},
        policy={"embedding_batch_concurrency": 1},
    )
    sim.script("a", Fault.ok(), Fault.server_error(500))  # the second batch fails once
    resp = await router.aembedding(model="g", input=["1", "2", "3", "4"])
    bodies = [r.body["input"] for r in sim.requests("a")]
    assert bodies == [["1", "2"], ["3", "4"], ["3", "4"]]
    assert len(resp.data) == 4
    sim.reset()
    sim.script("a", Fault.ok())
    sim.set_default("a", Fault.server_error(500))
    with pytest.raises(Exception) as ei:
        await router.aembedding(model="g", input=["1", "2", "3", "4"])
    assert not isinstance(ei.value, ConfigError)  # no partly filled answer: the call fails


async def test_fallback_to_another_dimension_is_refused_before_any_request(build, sim):
    router = build(
        "embedding",
        {"g": ["a"], "other": ["b"]},
        fallbacks=[{"g": ["other"]}],
        info={"a": {"output_vector_size": 1536}, "b": {"output_vector_size": 1024}},
    )
    with pytest.raises(ConfigError) as ei:
        await router.aembedding(model="g", input="x")
    assert "output_vector_size" in str(ei.value) and "vectors_compatible" in str(ei.value)
    assert sim.count() == 0
    sim.outage("a", 60)
    resp = await router.aembedding(model="g", input="x", vectors_compatible=True)
    assert get_report(resp).served_group == "other"  # type: ignore[union-attr]


async def test_mode_that_cannot_serve_the_call_is_a_config_error(build, sim):
    router = build("embedding", {"g": ["a"]})
    with pytest.raises(ConfigError) as ei:
        await router.aresponses(model="g", input="hi")
    assert "model_info.mode" in str(ei.value) and "'embedding'" in str(ei.value)
    with pytest.raises(ConfigError):
        await router.aembedding(model="g", input=["ok", ""])
    with pytest.raises(ConfigError):
        await router.aembedding(model="g", input="x", scenario="s")
    assert sim.count() == 0


async def test_idempotency_store_replays_an_embedding_with_its_type(build, sim):
    router = build("embedding", {"g": ["a"]}, idempotency_store="memory")
    first = await router.aembedding(model="g", input="same")
    again = await router.aembedding(model="g", input="same")
    assert sim.count("a") == 1
    assert isinstance(again, litellm.EmbeddingResponse) and get_report(again).replayed  # type: ignore[union-attr]
    assert again.data[0]["embedding"] == first.data[0]["embedding"]


@pytest.mark.parametrize("operation", ["text_completion", "responses"])
async def test_a_stream_cut_after_content_is_interrupted_or_restarted_elsewhere(build, sim, operation):
    from llm_resilience_plugin.errors import StreamInterruptedError
    from llm_resilience_plugin.events import StreamRestart

    router = build(operation, {"g": ["a"], "backup": ["b"]}, fallbacks=[{"g": ["backup"]}])
    call = call_for(router, operation)
    sim.script("a", Fault.stream_cut(after_chunks=3))
    stream = await call("g", stream=True, recover_streams=False)
    with pytest.raises(StreamInterruptedError) as ei:
        _ = [c async for c in stream]
    assert ei.value.partial_text.startswith("Hello from")
    sim.script("a", Fault.stream_cut(after_chunks=3))
    stream = await call("g", stream=True, recover_streams=True)
    items = [c async for c in stream]
    markers = [c for c in items if isinstance(c, StreamRestart)]
    assert len(markers) == 1 and markers[0].discarded_text.startswith("Hello from a")
    assert stream.report.outcome == "success" and stream.report.stream_restarts == 1
    assert stream.report.served_group == "backup" or get_report(stream).deployment_id == "b"  # type: ignore[union-attr]


async def test_a_degradation_level_never_adds_max_tokens_to_an_embedding(build, sim):
    router = build(
        "embedding",
        {"g": ["a"], "backup": ["b"]},
        fallbacks=[{"g": ["backup"]}],
        policy={"degradation": {"levels": {1: {"max_tokens": 10}}}},
    )
    sim.outage("a", 60)
    resp = await router.aembedding(model="g", input="x")
    assert get_report(resp).served_group == "backup"  # type: ignore[union-attr]
    (record,) = sim.requests("b")
    assert "max_tokens" not in record.body
