"""Transcription, speech, moderation and rerank on the engine, over real HTTP to the simulator:
each provider's answer, a 500 retried, a 400 not, cost settled, the blocking twins, idempotent
replays, and the checks made before any request. (What every operation does alike - LiteLLM's
type, an outage and its fallback, a silent provider, a budget refusal: test_operations_shared.py.)"""

from __future__ import annotations

import io

import pytest

from llm_resilience_plugin import ConfigError, get_report
from llm_resilience_plugin.cost import Budget, CostGuard
from llm_resilience_plugin.errors import ErrorClass
from llm_resilience_plugin.testing import Fault
from llm_resilience_plugin.testing._audio import speech_bytes

from ._operations import (
    AUDIO,
    AUDIO_OPERATIONS,
    SDK_RETRIES,
    call_for,
)

OPERATIONS = AUDIO_OPERATIONS


async def test_each_answer_is_the_providers(build, sim):
    speech = await call_for(build("speech", {"s": ["a"]}), "speech")("s")
    assert speech.content == speech_bytes("a", "Hello there")
    assert not hasattr(speech, "choices")
    text = await call_for(build("transcription", {"t": ["b"]}), "transcription")("t")
    assert "hello.mp3" in text.text and str(len(AUDIO)) in text.text
    ranked = await call_for(build("rerank", {"r": ["c"]}), "rerank")("r")
    assert [r["index"] for r in ranked.results] == [1, 0]
    mod = await build("moderation", {"m": ["d"]}).amoderation(input=["fine", "FLAG this"], model="m")
    assert [r.flagged for r in mod.results] == [False, True]


@pytest.mark.parametrize("operation", OPERATIONS)
async def test_a_500_is_retried_and_then_served(build, sim, operation):
    router = build(operation, {"g": ["a"]})
    sim.script("a", Fault.server_error(500))
    resp = await call_for(router, operation)("g")
    rep = get_report(resp)
    assert rep is not None and rep.outcome == "success"
    if operation in SDK_RETRIES:  # retried by the SDK inside LiteLLM's attempt (see above)
        assert sim.count("a") == 2 and rep.upstream_requests == 1
        return
    assert sim.count("a") == 2  # exactly one retry: no SDK or Router retry underneath
    assert [a.error_class for a in rep.attempts] == [ErrorClass.SERVER, None]


@pytest.mark.parametrize("operation", OPERATIONS)
async def test_a_400_is_not_retried(build, sim, operation):
    router = build(operation, {"g": ["a", "b"]})
    sim.set_default("a", Fault.http_error(400, message="bad audio"))
    sim.set_default("b", Fault.http_error(400, message="bad audio"))
    with pytest.raises(Exception) as err:
        await call_for(router, operation)("g")
    assert sim.count() == 1  # neither retried nor sent to the group's other deployment
    rep = get_report(err.value)
    assert rep is not None and rep.outcome == "failure" and rep.error_class is ErrorClass.BAD_REQUEST
    assert router.breakers()[sim.requests()[0].deployment]["fail_counter"] == 0  # the caller's error


@pytest.mark.parametrize("operation", ["speech", "transcription", "rerank"])
async def test_the_cost_guard_reserves_per_unit_and_settles_the_reported_cost(build, sim, operation):
    guard = CostGuard([Budget.daily(10)])
    router = build(operation, {"g": ["a"]}, guards=[guard])
    resp = await call_for(router, operation)("g")
    (entry,) = guard.ledger.entries()
    reported = resp._hidden_params["response_cost"]
    assert reported > 0 and entry.cost == pytest.approx(reported)


def test_blocking_twins(build, sim):
    assert "hello.mp3" in build("transcription", {"t": ["a"]}).transcription("t", ("hello.mp3", AUDIO)).text
    assert build("speech", {"s": ["b"]}).speech("s", "hi", "alloy").content == speech_bytes("b", "hi")
    assert build("moderation", {"m": ["c"]}).moderation("fine", "m").results[0].flagged is False
    ranked = build("rerank", {"r": ["d"]}).rerank("r", "red", ["red", "blue"], top_n=1)
    assert [r["index"] for r in ranked.results] == [0]
    assert sim.count() == 4


async def test_a_file_object_is_read_once_so_a_retry_uploads_the_same_bytes(build, sim):
    router = build("transcription", {"g": ["a"]})
    sim.script("a", Fault.server_error(503))
    f = io.BytesIO(AUDIO)
    f.name = "/tmp/clip.wav"
    resp = await router.atranscription(model="g", file=f)
    assert get_report(resp).upstream_requests == 2  # type: ignore[union-attr]
    assert [r.body["file"] for r in sim.requests("a")] == [{"filename": "clip.wav", "bytes": len(AUDIO)}] * 2


@pytest.mark.parametrize(
    ("operation", "call", "field"),
    [
        ("transcription", lambda r: r.atranscription(model="g"), "file"),
        ("transcription", lambda r: r.atranscription(model="g", file=b""), "file"),
        ("transcription", lambda r: r.atranscription(model="g", file="clip.mp3"), "file"),
        ("transcription", lambda r: r.atranscription(model="g", file=io.BytesIO(b"")), "file"),
        ("speech", lambda r: r.aspeech(model="g", input="", voice="alloy"), "input"),
        ("speech", lambda r: r.aspeech(model="g", input="hi"), "voice"),
        ("moderation", lambda r: r.amoderation(input=[], model="g"), "input"),
        ("moderation", lambda r: r.amoderation(input="hi"), "model"),
        ("rerank", lambda r: r.arerank(model="g", query="q", documents=[]), "documents"),
        ("rerank", lambda r: r.arerank(model="g", query="q", documents="a doc"), "documents"),
        ("rerank", lambda r: r.arerank(model="g", query="", documents=["a"]), "query"),
        ("rerank", lambda r: r.arerank(model="g", query="q", documents=["a"], top_n=0), "top_n"),
        ("rerank", lambda r: r.arerank(model="g", query="q", documents=["a"], stream=True), "stream"),
    ],
)
async def test_a_callers_mistake_is_a_config_error_before_any_request(build, sim, operation, call, field):
    router = build(operation, {"g": ["a"]})
    with pytest.raises(ConfigError) as err:
        await call(router)
    assert err.value.field == field
    assert sim.count() == 0


async def test_a_group_whose_mode_cannot_serve_the_operation_is_refused(build, sim):
    router = build("speech", {"g": ["a"]})
    with pytest.raises(ConfigError) as err:
        await router.atranscription(model="g", file=("a.mp3", AUDIO))
    assert err.value.field == "model_info.mode"
    assert sim.count() == 0


@pytest.mark.parametrize("operation", ["transcription", "moderation", "rerank"])
async def test_the_idempotency_store_replays_with_litellms_type(build, sim, operation):
    router = build(operation, {"g": ["a"]}, idempotency_store="memory")
    first = await call_for(router, operation)("g")
    again = await call_for(router, operation)("g")
    assert sim.count("a") == 1
    assert type(again) is type(first) and get_report(again).replayed  # type: ignore[union-attr]
    assert again.model_dump(exclude={"id"}) == first.model_dump(exclude={"id"})


async def test_speech_is_not_kept_by_the_idempotency_store(build, sim):
    router = build("speech", {"g": ["a"]}, idempotency_store="memory")
    for _ in range(2):
        assert (await call_for(router, "speech")("g")).content == speech_bytes("a", "Hello there")
    assert sim.count("a") == 2  # audio bytes have no JSON to replay: each call sends
