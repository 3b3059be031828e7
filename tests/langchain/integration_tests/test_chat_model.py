"""ResilientChatModel over real HTTP against the simulator: construction, metadata, resilience
paths (retries, fallbacks, breakers, deadlines, streams) and their LangChain visibility."""

from __future__ import annotations

import json
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import tenacity
from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
from langchain_core.callbacks.usage import get_usage_metadata_callback
from langchain_core.load import dumpd, load
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.rate_limiters import BaseRateLimiter
from pydantic import BaseModel, Field

from llm_resilience_plugin import (
    AllRoutesFailedError,
    ConfigError,
    DeadlineExceededError,
    ResilientRouter,
    StreamInterruptedError,
    get_report,
)
from llm_resilience_plugin.errors import UnknownModelGroupError
from llm_resilience_plugin.langchain import ResilientChatModel
from llm_resilience_plugin.testing import FakeClock
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator
from tests.conftest import FAST_POLICY, deployment

PRICES = {"primary": (1e-6, 2e-6), "backup": (3e-6, 5e-6)}
SECRET = "sk-sim-secret"


def priced(sim: ProviderSimulator, group: str, dep_id: str) -> dict[str, Any]:
    inp, out = PRICES[group]
    return deployment(
        sim, group, dep_id, model=f"openai/{group}-model",
        input_cost_per_token=inp, output_cost_per_token=out,
    )  # fmt: skip


RouterMaker = Callable[..., ResilientRouter]


@pytest.fixture
def lc_router(sim: ProviderSimulator) -> Iterator[RouterMaker]:
    made: list[ResilientRouter] = []

    def make(
        groups: dict[str, list[str]] | None = None,
        *,
        policy: dict[str, Any] | None = None,
        fallbacks: Any = (("primary", ["backup"]),),
    ) -> ResilientRouter:
        groups = groups or {"primary": ["p1"], "backup": ["b1"]}
        model_list = [priced(sim, g, d) for g, deps in groups.items() for d in deps]
        router = ResilientRouter(
            model_list=model_list,
            policy={**FAST_POLICY, **(policy or {})},
            fallbacks=[{src: dst} for src, dst in fallbacks] if fallbacks else None,
            clock=FakeClock(),
            seed=11,
        )
        made.append(router)
        return router

    yield make
    for r in made:
        r.close()


class Recorder(BaseCallbackHandler):
    """Records on_retry, custom events and the runs they belong to (thread-safe enough)."""

    def __init__(self) -> None:
        self.retries: list[tuple[int, UUID, str]] = []  # (attempt_number, run, thread)
        self.custom: list[tuple[str, dict[str, Any], UUID]] = []
        self.llm_runs: list[UUID] = []
        self.lock = threading.Lock()

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: UUID, **kw: Any) -> None:
        self.llm_runs.append(run_id)

    def on_retry(self, retry_state: tenacity.RetryCallState, *, run_id: UUID, **kw: Any) -> None:
        with self.lock:
            # tenacity reuses one RetryCallState per call: read it now
            self.retries.append((retry_state.attempt_number, run_id, threading.current_thread().name))

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kw: Any) -> None:
        with self.lock:
            self.custom.append((name, data, run_id))

    def names(self) -> list[str]:
        return [n for n, _, _ in self.custom]


class AsyncRecorder(AsyncCallbackHandler):
    def __init__(self) -> None:
        self.retries: list[UUID] = []
        self.custom: list[tuple[str, UUID]] = []

    async def on_retry(self, retry_state: tenacity.RetryCallState, *, run_id: UUID, **kw: Any) -> None:
        self.retries.append(run_id)

    async def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kw: Any) -> None:
        self.custom.append((name, run_id))


# -- construction --------------------------------------------------------------------------------


def test_construction_from_router_config_path_mapping_and_model_list(
    sim: ProviderSimulator, lc_router: RouterMaker, tmp_path: Path
) -> None:
    router = lc_router()
    assert ResilientChatModel(router=router, model="primary").get_router() is router
    assert ResilientChatModel.from_router(router, model="backup").model == "backup"

    cfg = {"model_list": [priced(sim, "primary", "p1")], "resilience": {"deadline": 5}}
    path = tmp_path / "router.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    from_path = ResilientChatModel.from_config(path, model="primary")
    from_mapping = ResilientChatModel.from_config(cfg, model="primary")
    from_list = ResilientChatModel(model_list=cfg["model_list"], model="primary", policy={"deadline": 5})
    for llm in (from_path, from_mapping, from_list):
        assert llm.get_router().effective_policy("primary").deadline == 5
        assert llm.invoke("hi").content.startswith("Hello from p1")
        llm.close()


@pytest.mark.parametrize("source", ["router", "config", "model_list"])
def test_unknown_model_group_fails_at_construction(
    sim: ProviderSimulator, lc_router: RouterMaker, source: str
) -> None:
    kwargs: dict[str, Any] = {
        "router": {"router": lc_router()},
        "config": {"config": {"model_list": [priced(sim, "primary", "p1")]}},
        "model_list": {"model_list": [priced(sim, "primary", "p1")]},
    }[source]
    with pytest.raises(UnknownModelGroupError) as ei:
        ResilientChatModel(model="nope", **kwargs)
    assert "nope" in str(ei.value) and "primary" in str(ei.value)
    assert sim.count() == 0


def test_construction_errors_are_clear(lc_router: RouterMaker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLM_RESILIENCE_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="LLM_RESILIENCE_CONFIG"):
        ResilientChatModel(model="primary")
    router = lc_router()
    with pytest.raises(ConfigError, match="one of router, model_list or config"):
        ResilientChatModel(router=router, config="x.yaml", model="primary")
    with pytest.raises(ConfigError, match="api_key"):
        ResilientChatModel(router=router, model="primary", api_key="sk-x")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ResilientChatModel(router=router, model="primary", max_retries=3)
    assert any("max_retries" in str(w.message) for w in caught)
    with pytest.raises(ConfigError, match="not found"):
        ResilientChatModel(config="/nonexistent/router.yaml", model="primary")


def test_config_path_from_environment(
    sim: ProviderSimulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(json.dumps({"model_list": [priced(sim, "primary", "p1")]}))
    monkeypatch.setenv("LLM_RESILIENCE_CONFIG", str(path))
    llm = ResilientChatModel(model="primary")
    assert llm.config == str(path)
    assert llm.invoke("hi").response_metadata["model_id"] == "p1"
    llm.close()


def test_max_retries_and_api_key_shape_a_built_router(sim: ProviderSimulator) -> None:
    dep = priced(sim, "primary", "p1")
    del dep["litellm_params"]["api_key"]
    llm = ResilientChatModel(model_list=[dep], model="primary", max_retries=0, api_key="sk-filled")
    router = llm.get_router()
    classes = router.effective_policy("primary").classes
    assert classes["rate_limit"].max_retries == 0 and classes["timeout"].max_retries == 0
    assert classes["bad_request"].action == "fail"
    assert router.spec.model_list[0]["litellm_params"]["api_key"] == "sk-filled"
    sim.script("p1", Fault.rate_limit())
    with pytest.raises(AllRoutesFailedError):
        llm.invoke("hi")
    assert sim.count("p1") == 1  # max_retries=0: one attempt
    assert sim.requests("p1")[0].headers["authorization"] == "***"
    llm.close()


def test_serialization_round_trip_and_refusal_with_literal_keys(lc_router: RouterMaker) -> None:
    cfg = {
        "model_list": [
            {
                "model_name": "primary",
                "litellm_params": {
                    "model": "openai/primary-model",
                    "api_base": "http://127.0.0.1:9/v1",
                    "api_key": "os.environ/SIM_KEY",
                },
            }
        ]
    }
    llm = ResilientChatModel(config=cfg, model="primary", temperature=0.3, api_key="sk-x")
    data = dumpd(llm)
    assert data["type"] == "constructor"
    assert "sk-x" not in json.dumps(data)
    again = load(data, valid_namespaces=["llm_resilience_plugin"], allowed_objects=[ResilientChatModel])
    assert isinstance(again, ResilientChatModel) and again.asdict() == llm.asdict()
    literal = {
        "model_list": [{**cfg["model_list"][0], "litellm_params": {"model": "openai/x", "api_key": SECRET}}]
    }
    assert dumpd(ResilientChatModel(config=literal, model="primary"))["type"] == "not_implemented"
    assert dumpd(ResilientChatModel(router=lc_router(), model="primary"))["type"] == "not_implemented"


def test_identifying_and_ls_params_hold_no_secrets(lc_router: RouterMaker, sim: ProviderSimulator) -> None:
    llm = ResilientChatModel(model_list=[priced(sim, "primary", "p1")], model="primary", temperature=0.5,
                             max_tokens=20, stop=["x"])  # fmt: skip
    described = llm.asdict()  # LangChain's public view: _identifying_params plus _type (_llm_type)
    assert SECRET not in json.dumps(described) + repr(llm)
    ls = llm._get_ls_params()
    assert ls["ls_provider"] == "litellm" and ls["ls_model_name"] == "primary"
    assert ls["ls_temperature"] == 0.5 and ls["ls_max_tokens"] == 20 and ls["ls_stop"] == ["x"]
    assert llm._get_ls_params(model="backup")["ls_model_name"] == "backup"
    assert described["_type"] == "llm-resilience-chat"
    assert llm.get_num_tokens_from_messages([HumanMessage("hello there friend")]) > 0
    llm.close()


# -- invoke: metadata ----------------------------------------------------------------------------


def test_invoke_reports_usage_cost_model_and_report(sim: ProviderSimulator, lc_router: RouterMaker) -> None:
    llm = ResilientChatModel(router=lc_router(), model="primary", temperature=0.1, max_tokens=50,
                             stop=["zzz"], model_kwargs={"seed": 3})  # fmt: skip
    msg = llm.invoke("Hello there")
    assert isinstance(msg, AIMessage)
    usage = msg.usage_metadata
    assert usage is not None and all(isinstance(usage[k], int) for k in ("input_tokens", "output_tokens"))
    md = msg.response_metadata
    assert md["model_name"] == "primary-model" and md["model_id"] == "p1" and md["model_group"] == "primary"
    assert md["finish_reason"] == "stop"
    inp, out = PRICES["primary"]
    assert md["response_cost"] == pytest.approx(usage["input_tokens"] * inp + usage["output_tokens"] * out)
    assert md["resilience"]["attempts"][0]["outcome"] == "success"
    text = json.dumps(md)  # JSON-safe, no secrets
    assert SECRET not in text
    body = sim.requests("p1")[0].body
    assert body["temperature"] == 0.1 and body["max_tokens"] == 50 and body["stop"] == ["zzz"]
    assert body["seed"] == 3


def test_fallback_reports_the_model_that_answered_and_its_cost(
    sim: ProviderSimulator, lc_router: RouterMaker
) -> None:
    llm = ResilientChatModel(router=lc_router(), model="primary")
    sim.outage("p1", 60)
    msg = llm.invoke("Hello there")
    md = msg.response_metadata
    assert md["model_name"] == "backup-model" and md["model_id"] == "b1" and md["model_group"] == "backup"
    usage = msg.usage_metadata
    assert usage is not None
    inp, out = PRICES["backup"]
    assert md["response_cost"] == pytest.approx(usage["input_tokens"] * inp + usage["output_tokens"] * out)
    assert md["resilience"]["fallback_level"] == 1
    with get_usage_metadata_callback() as cb:
        llm.invoke("again")
    assert list(cb.usage_metadata) == ["backup-model"]


def test_per_call_model_selects_another_group(sim: ProviderSimulator, lc_router: RouterMaker) -> None:
    llm = ResilientChatModel(router=lc_router(), model="primary")
    msg = llm.invoke("hi", model="backup")
    assert msg.response_metadata["model_name"] == "backup-model"
    assert sim.count("p1") == 0
    with pytest.raises(UnknownModelGroupError):
        llm.invoke("hi", model="nope")


def test_timeout_is_the_call_deadline(sim: ProviderSimulator, lc_router: RouterMaker) -> None:
    llm = ResilientChatModel(router=lc_router(fallbacks=None), model="primary", timeout=0.3)
    sim.set_default("p1", Fault.silence(max_hold=5))
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceededError) as ei:
        llm.invoke("hi")
    assert time.monotonic() - t0 < 1.5
    report = get_report(ei.value)
    assert report is not None and report.outcome == "failure"


def test_streaming_flag_and_rate_limiter(sim: ProviderSimulator, lc_router: RouterMaker) -> None:
    class CountingLimiter(BaseRateLimiter):
        calls = 0

        def acquire(self, *, blocking: bool = True) -> bool:
            type(self).calls += 1
            return True

        async def aacquire(self, *, blocking: bool = True) -> bool:
            type(self).calls += 1
            return True

    llm = ResilientChatModel(
        router=lc_router(), model="primary", streaming=True, rate_limiter=CountingLimiter()
    )
    msg = llm.invoke("hi")
    assert msg.content and sim.requests("p1")[0].stream is True
    assert msg.usage_metadata is not None and msg.response_metadata["model_id"] == "p1"
    assert CountingLimiter.calls == 1
    off = ResilientChatModel(router=lc_router(), model="primary", disable_streaming=True)
    streamed = list(off.stream("hi"))
    assert len(streamed) >= 1 and streamed[0].content
    assert sim.requests()[-1].stream is False


# -- retries and events --------------------------------------------------------------------------


def test_sync_invoke_fires_on_retry_and_custom_events_on_the_llm_run(
    sim: ProviderSimulator, lc_router: RouterMaker
) -> None:
    llm = ResilientChatModel(router=lc_router(), model="primary")
    sim.script("p1", Fault.rate_limit(), Fault.server_error(503))
    rec = Recorder()
    msg = llm.invoke("hi", config={"callbacks": [rec]})
    assert msg.response_metadata["model_id"] == "p1"
    (run_id,) = rec.llm_runs
    assert [n for n, _, _ in rec.retries] == [1, 2]
    assert all(r == run_id for _, r, _ in rec.retries)
    # documented: sync callbacks never run on the router's private loop thread (shared by all
    # sync calls); on_retry runs on a worker thread while the retry waits
    assert all(t != "llm-resilience-sync" for _, _, t in rec.retries)
    assert rec.names() == [  # after the 429 each attempt first waits its turn at the deployment
        "llm_resilience.attempt", "llm_resilience.retry", "llm_resilience.paced", "llm_resilience.attempt",
        "llm_resilience.retry", "llm_resilience.paced", "llm_resilience.attempt",
    ]  # fmt: skip
    assert all(r == run_id for _, _, r in rec.custom)
    first = rec.custom[0][1]
    assert first["error_class"] == "rate_limit" and first["status"] == 429 and first["deployment_id"] == "p1"
    assert msg.response_metadata["resilience"]["upstream_requests"] == 3


async def test_ainvoke_fires_on_retry_and_events_for_sync_and_async_handlers(
    sim: ProviderSimulator, lc_router: RouterMaker
) -> None:
    llm = ResilientChatModel(router=lc_router(), model="primary")
    sim.script("p1", Fault.rate_limit())
    rec, arec = Recorder(), AsyncRecorder()
    msg = await llm.ainvoke("hi", config={"callbacks": [rec, arec]})
    assert msg.content
    (run_id,) = rec.llm_runs
    assert [r for _, r, _ in rec.retries] == [run_id] and arec.retries == [run_id]
    assert rec.names() == [
        "llm_resilience.attempt", "llm_resilience.retry", "llm_resilience.paced", "llm_resilience.attempt",
    ]  # fmt: skip
    assert [n for n, _ in arec.custom] == rec.names()


def test_fallback_and_breaker_events(sim: ProviderSimulator, lc_router: RouterMaker) -> None:
    router = lc_router(policy={"breaker": {"fail_max": 2, "reset_timeout": 30}})
    llm = ResilientChatModel(router=router, model="primary")
    sim.set_default("p1", Fault.server_error(500))
    rec = Recorder()
    msg = llm.invoke("hi", config={"callbacks": [rec]})
    assert msg.response_metadata["model_id"] == "b1"
    names = rec.names()
    assert "llm_resilience.fallback" in names and "llm_resilience.breaker" in names
    fb = next(d for n, d, _ in rec.custom if n == "llm_resilience.fallback")
    assert fb["from_group"] == "primary" and fb["to_group"] == "backup"
    br = next(d for n, d, _ in rec.custom if n == "llm_resilience.breaker")
    assert br["deployment_id"] == "p1" and br["new_state"] == "open"
    # the breaker transition is attributed to this call only
    other = Recorder()
    llm.invoke("again", config={"callbacks": [other]})
    assert "llm_resilience.breaker" not in other.names()


async def test_astream_events_show_resilience_events_on_the_model_run(
    sim: ProviderSimulator, lc_router: RouterMaker
) -> None:
    llm = ResilientChatModel(router=lc_router(), model="primary")
    chain = ChatPromptTemplate.from_messages([("human", "{q}")]) | llm
    sim.script("p1", Fault.rate_limit(), Fault.reset())
    events = [e async for e in chain.astream_events({"q": "hi"}, version="v2")]
    model_run = next(e["run_id"] for e in events if e["event"] == "on_chat_model_start")
    custom = [e for e in events if e["event"] == "on_custom_event"]
    assert [e["name"] for e in custom] == [
        "llm_resilience.attempt", "llm_resilience.retry", "llm_resilience.paced", "llm_resilience.attempt",
        "llm_resilience.retry", "llm_resilience.paced", "llm_resilience.attempt",
    ]  # fmt: skip
    assert all(e["run_id"] == model_run for e in custom)
    end = next(e for e in events if e["event"] == "on_chat_model_end")
    assert end["data"]["output"].response_metadata["model_id"] == "p1"
    assert sum(1 for e in events if e["event"] == "on_chat_model_stream") >= 2


def test_stream_fires_on_retry_even_though_core_passes_no_run_manager(
    sim: ProviderSimulator, lc_router: RouterMaker
) -> None:
    # langchain-core 1.8 calls _stream without run_manager on stream()/astream(); the model
    # finds the run's manager itself. If this fails after a core upgrade, see find_run_manager.
    llm = ResilientChatModel(router=lc_router(), model="primary")
    sim.script("p1", Fault.rate_limit())
    rec = Recorder()
    chunks = list(llm.stream("hi", config={"callbacks": [rec]}))
    assert len(rec.retries) == 1 and rec.retries[0][1] == rec.llm_runs[0]
    assert "llm_resilience.retry" in rec.names()
    assert "".join(str(c.content) for c in chunks).startswith("Hello from p1")


# -- streams -------------------------------------------------------------------------------------


def _collect(chunks: list[AIMessageChunk]) -> AIMessageChunk:
    full = chunks[0]
    for c in chunks[1:]:
        full = full + c
    return full


def test_stream_usage_and_metadata_appear_once(sim: ProviderSimulator, lc_router: RouterMaker) -> None:
    llm = ResilientChatModel(router=lc_router(), model="primary")
    sim.outage("p1", 60)  # served by the fallback group
    chunks = list(llm.stream("Write me two haikus"))
    assert sum(1 for c in chunks if c.usage_metadata) == 1
    assert sum(1 for c in chunks if c.response_metadata.get("model_name")) == 1
    assert chunks[-1].chunk_position == "last"
    full = _collect(chunks)
    assert full.usage_metadata is not None and full.usage_metadata["input_tokens"] > 0
    md = full.response_metadata
    assert md["model_name"] == "backup-model" and md["model_id"] == "b1"
    inp, out = PRICES["backup"]
    u = full.usage_metadata
    assert md["response_cost"] == pytest.approx(u["input_tokens"] * inp + u["output_tokens"] * out)
    assert md["resilience"]["fallback_level"] == 1 and md["finish_reason"] == "stop"
    assert md["resilience"]["response_cost"] == md["response_cost"]
    json.dumps(md)


async def test_stream_failure_before_first_chunk_is_retried(
    sim: ProviderSimulator, lc_router: RouterMaker
) -> None:
    llm = ResilientChatModel(router=lc_router(), model="primary")
    sim.script("p1", Fault.stream_cut(after_chunks=0), Fault.server_error(502))
    text = "".join([str(c.content) async for c in llm.astream("hi")])
    assert text.startswith("Hello from p1")
    assert sim.count("p1") == 3 and sim.count("b1") == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_stream_failure_nothing_continues_raises_typed_error_with_replacement_never_spliced(
    sim: ProviderSimulator, lc_router: RouterMaker, mode: str
) -> None:
    llm = ResilientChatModel(router=lc_router(), model="primary")
    sim.script("p1", Fault.stream_cut(after_chunks=2))
    got: list[str] = []
    with pytest.raises(StreamInterruptedError) as ei:
        if mode == "sync":
            for c in llm.stream("tell me a long story"):
                got.append(str(c.content))
        else:
            async for c in llm.astream("tell me a long story"):
                got.append(str(c.content))
    assert "".join(got) == "Hello from " == ei.value.partial_text
    # no second model's words after the first one's: its answer comes whole, in the error
    assert ei.value.replacement.choices[0].message.content.startswith("Hello from b1")
    assert [r.stream for r in sim.requests("b1")] == [False]
    assert ei.value.report is not None and ei.value.report.outcome == "failure"


def test_abandoned_stream_releases_cleanly(sim: ProviderSimulator, lc_router: RouterMaker) -> None:
    router = lc_router()
    llm = ResilientChatModel(router=router, model="primary")
    sim.set_default("p1", Fault.ok(chunk_delay=0.01))
    it = llm.stream("count to ten please")
    next(it)
    it.close()
    assert router.breakers()["p1"]["state"] == "closed"
    assert llm.invoke("again").content


# -- tools and structured output ----------------------------------------------------------------


def test_bind_tools_tool_choice_forms(sim: ProviderSimulator, lc_router: RouterMaker) -> None:
    def get_weather(city: str) -> str:
        """Weather in a city."""
        return "sunny"

    def get_time(zone: str) -> str:
        """Time in a zone."""
        return "noon"

    llm = ResilientChatModel(router=lc_router(), model="primary")
    for choice, sent in [
        ("any", "required"), (True, "required"), ("auto", "auto"), ("none", "none"),
        ("get_time", {"type": "function", "function": {"name": "get_time"}}),
    ]:  # fmt: skip
        llm.bind_tools([get_weather, get_time], tool_choice=choice).invoke("What time is it in 'UTC'?")
        assert sim.requests("p1")[-1].body["tool_choice"] == sent
    msg = llm.bind_tools([get_weather, get_time], tool_choice="get_time").invoke("time in 'UTC'?")
    assert msg.tool_calls[0]["name"] == "get_time" and msg.tool_calls[0]["args"] == {"zone": "UTC"}
    with pytest.raises(ValueError, match="not a bound tool"):
        llm.bind_tools([get_weather], tool_choice="get_time")
    llm.bind_tools([get_weather]).invoke("hi")
    assert "tool_choice" not in sim.requests("p1")[-1].body


def test_streamed_tool_call_chunks_carry_an_index(sim: ProviderSimulator, lc_router: RouterMaker) -> None:
    def lookup(term: str, limit: int) -> str:
        """Look a term up."""
        return term

    llm = ResilientChatModel(router=lc_router(), model="primary").bind_tools([lookup], tool_choice="any")
    chunks = list(llm.stream("lookup 'resilience' limit 7"))
    tc_chunks = [tc for c in chunks for tc in c.tool_call_chunks]
    assert len(tc_chunks) > 1 and all(tc["index"] == 0 for tc in tc_chunks)
    full = _collect(chunks)
    assert full.tool_calls == [
        {
            "name": "lookup",
            "args": {"term": "resilience", "limit": 7},
            "id": tc_chunks[0]["id"],
            "type": "tool_call",
        }
    ]


class Person(BaseModel):
    """A person."""

    name: str = Field(description="full name")
    age: int


class City(BaseModel):
    """A city."""

    name: str
    country: str


class Options(BaseCallbackHandler):
    def __init__(self) -> None:
        self.options: list[Any] = []

    def on_chat_model_start(self, serialized: Any, messages: Any, *, options: Any = None, **kw: Any) -> None:
        self.options.append(options)


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_with_structured_output_methods(sim: ProviderSimulator, lc_router: RouterMaker, method: str) -> None:
    llm = ResilientChatModel(router=lc_router(), model="primary")
    seen = Options()
    cfg: Any = {"callbacks": [seen]}
    if method == "json_mode":  # the simulator's JSON mode fills the quoted keys with strings
        schema: type[BaseModel] = City
        city = llm.with_structured_output(City, method="json_mode").invoke("Give 'name' and 'country'", cfg)
        assert isinstance(city, City) and city.name == "example name"
    else:
        schema = Person
        extract = llm.with_structured_output(Person, method=method)  # type: ignore[arg-type]
        person = extract.invoke("Return 'Ada Lovelace', 36 years old", cfg)
        assert isinstance(person, Person) and person.age == 36
    (opts,) = seen.options
    assert opts["ls_structured_output_format"]["kwargs"]["method"] == method
    assert opts["ls_structured_output_format"]["schema"]["title"] == schema.__name__
    body = sim.requests("p1")[-1].body
    if method == "json_schema":
        assert body["response_format"]["type"] == "json_schema"
        assert body["response_format"]["json_schema"]["name"] == "Person"
    elif method == "function_calling":
        assert body["tool_choice"] == {"type": "function", "function": {"name": "Person"}}
    else:
        assert body["response_format"] == {"type": "json_object"}


def test_with_structured_output_include_raw_and_parsing_error(
    sim: ProviderSimulator, lc_router: RouterMaker
) -> None:
    llm = ResilientChatModel(router=lc_router(), model="primary")
    out = llm.with_structured_output(Person, include_raw=True).invoke("Ada is 36")
    assert isinstance(out, dict)
    assert isinstance(out["raw"], AIMessage) and isinstance(out["parsed"], Person)
    assert out["parsing_error"] is None
    sim.script("p1", Fault.ok(text="not json at all"))
    bad = llm.with_structured_output(Person, include_raw=True).invoke("Ada is 36")
    assert isinstance(bad, dict)
    assert bad["parsed"] is None and bad["parsing_error"] is not None


def test_messages_with_images_names_and_tool_history_reach_the_provider(
    sim: ProviderSimulator, lc_router: RouterMaker
) -> None:
    llm = ResilientChatModel(router=lc_router(), model="primary")
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    llm.invoke(
        [
            HumanMessage(
                [
                    {"type": "text", "text": "describe"},
                    {"type": "image", "base64": png, "mime_type": "image/png"},
                ],
                name="ada",
            ),
            AIMessage(
                [{"type": "thinking", "thinking": "hm", "signature": "s"}, {"type": "text", "text": "ok"}],
                tool_calls=[{"name": "f", "args": {"a": 1}, "id": "c1", "type": "tool_call"}],
            ),
        ]
    )
    sent = sim.requests("p1")[-1].body["messages"]
    assert sent[0]["name"] == "ada"
    assert sent[0]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,{png}"},
    }
    assert sent[1]["content"] == "ok"  # provider thinking blocks are not sent back
    assert sent[1]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
