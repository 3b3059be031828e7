"""Transcription, speech, moderation and rerank on the engine, over real HTTP to the simulator:
LiteLLM's response types, a 500 retried, a 400 not, fallback to another group, breakers
counting, cost settled, the blocking twins, and the checks made before any request."""

from __future__ import annotations

import io
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import litellm
import pytest
from litellm.types.llms.openai import HttpxBinaryResponseContent, OpenAIModerationResponse
from litellm.types.rerank import RerankResponse

from llm_resilience_plugin import BudgetExceededError, ConfigError, ResilientRouter, get_report
from llm_resilience_plugin.cost import Budget, CostGuard
from llm_resilience_plugin.errors import ErrorClass
from llm_resilience_plugin.testing import Clock, FakeClock, Fault, ProviderSimulator
from llm_resilience_plugin.testing._audio import speech_bytes

from ..conftest import FAST_POLICY, _merge

# operation -> (LiteLLM model, model_info.mode)
MODELS: dict[str, tuple[str, str]] = {
    "transcription": ("openai/whisper-1", "audio_transcription"),
    "speech": ("openai/tts-1", "audio_speech"),
    "moderation": ("openai/omni-moderation-latest", "moderation"),
    "rerank": ("cohere/rerank-english-v3.0", "rerank"),
}
TYPES = {
    "transcription": litellm.TranscriptionResponse,
    "speech": HttpxBinaryResponseContent,
    "moderation": OpenAIModerationResponse,
    "rerank": RerankResponse,
}
OPERATIONS = list(MODELS)
AUDIO = b"\xff\xfb" + b"x" * 4000

Call = Callable[..., Awaitable[Any]]


def call_for(router: ResilientRouter, operation: str) -> Call:
    """``call(group, **kw)`` for one operation, with a small payload."""
    if operation == "transcription":
        return lambda g, **kw: router.atranscription(model=g, file=("hello.mp3", AUDIO), **kw)
    if operation == "speech":
        return lambda g, **kw: router.aspeech(model=g, input="Hello there", voice="alloy", **kw)
    if operation == "moderation":
        return lambda g, **kw: router.amoderation(input="a kind sentence", model=g, **kw)
    return lambda g, **kw: router.arerank(
        model=g, query="red cube", documents=["a blue ball", "a red cube"], **kw
    )


def _entry(sim: ProviderSimulator, operation: str, group: str, dep: str) -> dict[str, Any]:
    model, mode = MODELS[operation]
    # Cohere's rerank posts to <api_base>/v2/rerank: the deployment's path without /v1
    base = sim.anthropic_base(dep) if operation == "rerank" else sim.api_base(dep)
    return {
        "model_name": group,
        "litellm_params": {"model": model, "api_base": base, "api_key": "sk-sim-secret"},
        "model_info": {"id": dep, "mode": mode},
    }


@pytest.fixture
def build(sim: ProviderSimulator) -> Iterator[Callable[..., ResilientRouter]]:
    made: list[ResilientRouter] = []

    def make(
        operation: str,
        groups: dict[str, list[str]],
        *,
        policy: dict[str, Any] | None = None,
        clock: Any = None,
        **kwargs: Any,
    ) -> ResilientRouter:
        model_list = [_entry(sim, operation, g, d) for g, deps in groups.items() for d in deps]
        router = ResilientRouter(
            model_list, policy=_merge(FAST_POLICY, policy or {}), clock=clock or FakeClock(), seed=7, **kwargs
        )
        made.append(router)
        return router

    yield make
    for r in made:
        r.close()


# LiteLLM 1.110's amoderation builds its OpenAI client with the SDK's default two retries and takes
# neither max_retries nor a client through the Router: a 500 is retried inside one attempt.
SDK_RETRIES = {"moderation": 1}


@pytest.mark.parametrize("operation", OPERATIONS)
async def test_healthy_call_is_one_request_with_litellms_type_and_a_report(build, sim, operation):
    router = build(operation, {"g": ["a"]})
    resp = await call_for(router, operation)("g")
    assert isinstance(resp, TYPES[operation])
    assert sim.count("a") == 1
    rep = get_report(resp)
    assert rep is not None and rep.outcome == "success" and rep.deployment_id == "a"
    assert rep.operation == operation and rep.upstream_requests == 1
    assert "sk-sim-secret" not in repr(rep)


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


@pytest.mark.parametrize("operation", OPERATIONS)
async def test_an_outage_trips_the_breaker_and_falls_back_to_another_group(build, sim, operation):
    router = build(
        operation,
        {"g": ["a"], "backup": ["b"]},
        fallbacks=[{"g": ["backup"]}],
        policy={"breaker": {"fail_max": 2}},
    )
    sim.outage("a", 60)
    call = call_for(router, operation)
    served = [get_report(await call("g")).served_group for _ in range(4)]  # type: ignore[union-attr]
    assert served == ["backup"] * 4
    assert router.breakers()["a"]["state"] == "open"
    sent = sim.count("a")
    await call("g")
    assert sim.count("a") == sent  # an open breaker sends nothing


@pytest.mark.parametrize("operation", ["speech", "transcription", "rerank"])
async def test_the_cost_guard_reserves_per_unit_and_settles_the_reported_cost(build, sim, operation):
    guard = CostGuard([Budget.daily(10)])
    router = build(operation, {"g": ["a"]}, guards=[guard])
    resp = await call_for(router, operation)("g")
    (entry,) = guard.ledger.entries()
    reported = resp._hidden_params["response_cost"]
    assert reported > 0 and entry.cost == pytest.approx(reported)


@pytest.mark.parametrize("operation", OPERATIONS)
async def test_a_budget_too_small_refuses_before_any_request(build, sim, operation):
    guard = CostGuard([Budget.per_request(1e-9)])
    router = build(operation, {"g": ["a"]}, guards=[guard])
    if operation == "moderation":  # free: nothing to refuse
        await call_for(router, operation)("g")
        assert sim.count() == 1
        return
    with pytest.raises(BudgetExceededError):
        await call_for(router, operation)("g")
    assert sim.count() == 0


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


@pytest.mark.parametrize("operation", OPERATIONS)
async def test_a_silent_provider_is_bounded_by_the_attempt_timeout(build, sim, operation):
    router = build(
        operation,
        {"g": ["a"], "backup": ["b"]},
        fallbacks=[{"g": ["backup"]}],
        policy={"deadline": 5, "attempt_timeout": 1},
        clock=Clock(),
    )
    sim.set_default("a", Fault.silence(max_hold=10))
    t0 = time.monotonic()
    resp = await call_for(router, operation)("g")
    assert time.monotonic() - t0 < 3
    rep = get_report(resp)
    assert rep is not None and rep.served_group == "backup"
    assert rep.attempts[0].error_class is ErrorClass.TIMEOUT


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
