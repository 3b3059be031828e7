"""ResilientChatModel's LangChain surface against the simulator: what dumps and reprs show, LLM
cache keys, router state shared by configured copies, sync callbacks kept off the router's loop,
the provider named in metadata, a clean interpreter exit, and no echoed key in what a caller sees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import tenacity
from langchain_core.caches import InMemoryCache
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.globals import set_llm_cache
from langchain_core.load import dumpd
from langchain_core.messages import AIMessageChunk
from langchain_core.runnables import ConfigurableField

from llm_resilience_plugin import AllRoutesFailedError, ResilientRouter
from llm_resilience_plugin.events import DeploymentInfo
from llm_resilience_plugin.langchain import ResilientChatModel
from llm_resilience_plugin.langchain._requests import provider_of
from llm_resilience_plugin.testing import FakeClock
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator
from tests.conftest import FAST_POLICY, deployment

# Not key-shaped (no "sk-" prefix): only knowing it is a credential can mask it.
LITERAL_KEY = "literal-credential-0123456789"
URL_SECRET = "url-pass-9876"
LOOP_THREAD = "llm-resilience-sync"


def model_list(sim: ProviderSimulator, key: str = LITERAL_KEY) -> list[dict[str, Any]]:
    return [
        deployment(sim, "primary", "p1", api_key=key),
        deployment(sim, "backup", "b1", api_key=key),
    ]


def own_model(sim: ProviderSimulator, **kwargs: Any) -> ResilientChatModel:
    """A model that builds its own router (literal keys: it serializes as "not implemented")."""
    kwargs.setdefault("model", "primary")
    kwargs.setdefault("policy", FAST_POLICY)
    return ResilientChatModel(model_list=model_list(sim), **kwargs)


def loop_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == LOOP_THREAD)


@pytest.fixture
def router(sim: ProviderSimulator) -> Iterator[ResilientRouter]:
    r = ResilientRouter(
        model_list=model_list(sim),
        policy=FAST_POLICY,
        fallbacks=[{"primary": ["backup"]}],
        clock=FakeClock(),
        seed=5,
    )
    yield r
    r.close()


# -- 1. dumps, reprs and "not implemented" serializations hold no credential -----------------------


def test_dumps_and_reprs_mask_credentials_and_the_model_still_works(sim: ProviderSimulator) -> None:
    creds = [
        {
            "model_name": "primary",
            "litellm_params": {
                "model": "openai/gpt-4o-mini",
                "api_base": f"https://user:{URL_SECRET}@llm.example/v1",
                "api_key": LITERAL_KEY,
            },
        }
    ]
    llm = ResilientChatModel(
        model_list=creds,
        model="primary",
        api_key="top-level-credential-42",
        router_settings={"routing_strategy": "simple-shuffle"},
        model_kwargs={"extra_headers": {"Authorization": "Bearer abc.def.ghi-jkl"}},
    )
    shown = {
        "model_dump": json.dumps(llm.model_dump(), default=str),
        "model_dump_json": llm.model_dump_json(),
        "model_dump(mode=json)": json.dumps(llm.model_dump(mode="json")),
        "repr": repr(llm),
        "str": str(llm),
        "dumpd": json.dumps(dumpd(llm)),
    }
    for name, text in shown.items():
        for secret in (LITERAL_KEY, URL_SECRET, "top-level-credential-42", "abc.def.ghi-jkl"):
            assert secret not in text, f"{name} shows {secret}"
    dumped = llm.model_dump()
    assert dumped["model_list"][0]["litellm_params"]["api_base"] == "https://***@llm.example/v1"
    assert dumped["model_list"][0]["litellm_params"]["model"] == "openai/gpt-4o-mini"
    assert "model_kwargs={'extra_headers'" in repr(llm)  # still shown, masked
    # the values themselves are intact: a model with a literal key still calls with it
    working = own_model(sim)
    assert LITERAL_KEY not in repr(working) + working.model_dump_json()
    assert working.invoke("hi").content.startswith("Hello from p1")
    assert working.model_list is not None
    assert working.model_list[0]["litellm_params"]["api_key"] == LITERAL_KEY
    working.close()


def test_environment_references_still_show_and_serialize() -> None:
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
    llm = ResilientChatModel(config=cfg, model="primary")
    assert llm.model_dump()["config"] == cfg  # a reference is not a secret
    assert dumpd(llm)["kwargs"]["config"] == cfg
    from_list = ResilientChatModel(model_list=cfg["model_list"], model="primary")
    assert from_list.model_dump()["model_list"] == cfg["model_list"]


# -- 2. LLM cache keys -------------------------------------------------------------------------------


@pytest.fixture
def llm_cache() -> Iterator[InMemoryCache]:
    cache = InMemoryCache()
    set_llm_cache(cache)
    yield cache
    set_llm_cache(None)


def test_cache_keys_tell_groups_and_parameters_apart(
    sim: ProviderSimulator, router: ResilientRouter, llm_cache: InMemoryCache
) -> None:
    primary, backup = own_model(sim), own_model(sim, model="backup")
    assert dumpd(primary)["type"] == "not_implemented"  # the case where LangChain's key collides
    assert primary.invoke("hi").content.startswith("Hello from p1")
    assert backup.invoke("hi").content.startswith("Hello from b1")
    assert sim.count() == 2
    assert primary.invoke("hi").content.startswith("Hello from p1")  # the same model: cached
    assert sim.count() == 2
    own_model(sim, temperature=0.7).invoke("hi")
    own_model(sim, max_tokens=7).invoke("hi")
    primary.bind(top_p=0.5).invoke("hi")
    primary.invoke("hi", stop=["zz"])
    assert sim.count() == 6  # every parameter that shapes the answer is in the key
    assert [r.body.get("temperature") for r in sim.requests()][2] == 0.7
    # router= models (also "not implemented"): their groups apart too
    llm_cache.clear()
    on_router = ResilientChatModel(router=router, model="backup")
    assert on_router.invoke("hi").content.startswith("Hello from b1")
    on_primary = ResilientChatModel(router=router, model="primary")
    assert on_primary.invoke("hi").content.startswith("Hello from p1")
    on_router.invoke("hi")
    assert sim.count() == 8
    key = primary._get_llm_string(stop=None, tools=[{"type": "function", "function": {"name": "f"}}])
    assert LITERAL_KEY not in key and '"f"' in key and "primary" in key
    primary.close()
    backup.close()


# -- 3. configured copies share the router's state ---------------------------------------------------


def test_configurable_copies_share_breakers_and_budgets(sim: ProviderSimulator) -> None:
    clock = FakeClock()
    base = own_model(
        sim,
        fallbacks=[{"primary": ["backup"]}],
        policy={**FAST_POLICY, "breaker": {"fail_max": 2, "reset_timeout": 30}},
        router_options={"clock": clock, "seed": 3},
    )
    llm = base.configurable_fields(temperature=ConfigurableField(id="t"))
    sim.set_default("p1", Fault.server_error(500))
    first = llm.invoke("hi", config={"configurable": {"t": 0.1}})
    assert first.response_metadata["model_id"] == "b1"
    tried = sim.count("p1")
    assert tried >= 2
    for t in (0.2, 0.3, 0.4):  # each call builds a new model instance with its temperature
        msg = llm.invoke("hi", config={"configurable": {"t": t}})
        assert msg.response_metadata["model_id"] == "b1"
    assert sim.count("p1") == tried  # the breaker opened through the first copy is open for the next
    assert [r.body.get("temperature") for r in sim.requests("b1")] == [0.1, 0.2, 0.3, 0.4]
    assert base.get_router().breakers()["p1"]["state"] == "open"
    base.close()


def test_one_router_per_configuration_closed_with_its_last_model(sim: ProviderSimulator) -> None:
    before = loop_threads()
    a, b = own_model(sim), own_model(sim, model="backup", temperature=0.2)
    assert a.get_router() is b.get_router()
    other = own_model(sim, policy={**FAST_POLICY, "deadline": 9})
    assert other.get_router() is not a.get_router()
    a.invoke("hi")
    other.invoke("hi")
    assert loop_threads() == before + 2
    a.close()
    assert b.invoke("hi").content.startswith("Hello from b1")  # still open for b
    b.close()
    other.close()
    assert loop_threads() == before
    del other
    again = own_model(sim)  # a new model after the last one closed gets a fresh router
    assert again.invoke("hi").content.startswith("Hello from p1")
    again.close()
    assert loop_threads() == before


# -- 4. sync callbacks never run on the router's loop -------------------------------------------------


class Slow(BaseCallbackHandler):
    """Sleeps in ``on_retry`` or in the retry's custom event, noting the threads it ran on."""

    def __init__(self, where: str, seconds: float) -> None:
        self.where = where
        self.seconds = seconds
        self.threads: list[str] = []
        self.lock = threading.Lock()

    def _slow(self) -> None:
        with self.lock:
            self.threads.append(threading.current_thread().name)
        time.sleep(self.seconds)

    def on_retry(self, retry_state: tenacity.RetryCallState, *, run_id: UUID, **kw: Any) -> None:
        if self.where == "on_retry":
            self._slow()

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kw: Any) -> None:
        if self.where == "custom_event" and name == "llm_resilience.retry":
            self._slow()


@pytest.mark.parametrize("where", ["on_retry", "custom_event"])
def test_a_slow_sync_callback_holds_up_only_its_own_call(
    sim: ProviderSimulator, router: ResilientRouter, where: str
) -> None:
    llm = ResilientChatModel(router=router, model="primary")
    llm.invoke("warm up")  # the loop thread and the HTTP client exist before timing
    calls = 4
    sim.script("p1", *[Fault.rate_limit() for _ in range(calls)])  # one retry per call
    handler = Slow(where, 0.5)
    start = threading.Barrier(calls)
    answers: list[str] = []

    def call() -> None:
        start.wait()
        answers.append(str(llm.invoke("hi", config={"callbacks": [handler]}).content))

    threads = [threading.Thread(target=call) for _ in range(calls)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    elapsed = time.monotonic() - t0
    assert len(answers) == calls and all(a.startswith("Hello from p1") for a in answers)
    assert len(handler.threads) == calls and LOOP_THREAD not in handler.threads
    assert elapsed < 1.4, f"{calls} calls with a 0.5 s callback each took {elapsed:.2f}s (serialized?)"


def test_sync_stream_events_arrive_in_order_on_the_calling_thread(
    sim: ProviderSimulator, router: ResilientRouter
) -> None:
    seen: list[tuple[str, str]] = []

    class Rec(BaseCallbackHandler):
        def on_retry(self, retry_state: tenacity.RetryCallState, **kw: Any) -> None:
            seen.append(("on_retry", threading.current_thread().name))

        def on_custom_event(self, name: str, data: Any, **kw: Any) -> None:
            seen.append((name, threading.current_thread().name))

    llm = ResilientChatModel(router=router, model="primary")
    sim.script("p1", Fault.rate_limit())
    chunks = list(llm.stream("hi", config={"callbacks": [Rec()]}))
    assert "".join(str(c.content) for c in chunks).startswith("Hello from p1")
    assert [n for n, _ in seen] == [
        "llm_resilience.attempt", "llm_resilience.retry", "on_retry", "llm_resilience.paced",
        "llm_resilience.attempt",
    ]  # fmt: skip
    assert all(t != LOOP_THREAD for _, t in seen)
    assert seen[-1][1] == threading.current_thread().name


# -- 5. the provider that answered ---------------------------------------------------------------------


def test_model_provider_names_the_provider_that_answered(
    sim: ProviderSimulator, router: ResilientRouter
) -> None:
    llm = ResilientChatModel(router=router, model="primary")
    assert llm.invoke("hi").response_metadata["model_provider"] == "openai"
    chunks = list(llm.stream("hi"))
    full = chunks[0]
    for c in chunks[1:]:
        full = full + c
    assert isinstance(full, AIMessageChunk) and full.response_metadata["model_provider"] == "openai"

    def info(model: str, **params: Any) -> DeploymentInfo:
        return DeploymentInfo(id="d", model_group="g", model=model, api_base=None, params=params)

    assert provider_of(info("anthropic/claude-3-5-sonnet-20240620")) == "anthropic"
    assert provider_of(info("azure/my-deployment")) == "azure"
    assert provider_of(info("gpt-4o-mini")) == "openai"
    assert provider_of(info("my-model", custom_llm_provider="ollama")) == "ollama"
    assert provider_of(None) == "litellm"


# -- 6. a clean exit ---------------------------------------------------------------------------------

EXIT_SCRIPT = """
import asyncio, gc, sys
import llm_resilience_plugin
from llm_resilience_plugin.testing._simulator import ProviderSimulator
from llm_resilience_plugin.langchain import ResilientChatModel

sim = ProviderSimulator().__enter__()
deps = [{{"model_name": "a", "litellm_params": {{"model": "openai/gpt-4o-mini",
        "api_base": sim.api_base("a1"), "api_key": "sk-sim-secret"}}, "model_info": {{"id": "a1"}}}}]
llm = ResilientChatModel(model_list=deps, model="a")
{calls}
{extra}
print("done", file=sys.stderr)
"""


ASYNC_THEN_SYNC = "asyncio.run(llm.ainvoke('hi'))\nllm.invoke('hi')"


def run_exit_script(extra: str, calls: str = ASYNC_THEN_SYNC) -> str:
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "PYTHONWARNINGS": "default"}
    proc = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT.format(calls=calls, extra=textwrap.dedent(extra))],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=Path(__file__).parents[3],
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done" in proc.stderr
    return proc.stderr


@pytest.mark.parametrize(
    "extra",
    [
        "llm.close()",
        "gc.collect()\nllm.close()",
        "",  # never closed: the model's hold is released at exit
        "it = llm.stream('hi'); next(it)",  # a stream left open, collected at exit
        "it = llm.stream('hi'); next(it); llm.close()",
    ],
)
def test_no_pending_task_or_unawaited_coroutine_at_exit(extra: str) -> None:
    stderr = run_exit_script(extra)
    assert "Task was destroyed but it is pending" not in stderr
    assert "was never awaited" not in stderr


def test_no_pending_task_reported_when_collected_before_close() -> None:
    """LiteLLM's logging worker follows the latest call's loop: after a sync call then an async
    one it drops its task on the router's private loop; the loop holds its tasks until close()."""
    stderr = run_exit_script(
        "gc.collect()\nllm.close()", calls="llm.invoke('hi')\nasyncio.run(llm.ainvoke('hi'))"
    )
    assert "Task was destroyed but it is pending" not in stderr


# -- 7. a key the provider echoes reaches no caller ----------------------------------------------------


def test_an_echoed_key_is_in_no_metadata_message_chunk_or_error(sim: ProviderSimulator) -> None:
    router = ResilientRouter(
        model_list=model_list(sim),
        policy={**FAST_POLICY, "breaker": {"fail_max": 100}},  # p1 is tried by every call
        fallbacks=[{"primary": ["backup"]}],
        clock=FakeClock(),
    )
    echo = Fault.http_error(500, message=f"Incorrect API key provided: {LITERAL_KEY}")
    sim.set_default("p1", echo)
    llm = ResilientChatModel(router=router, model="primary")
    msg = llm.invoke("hi")
    assert msg.response_metadata["model_id"] == "b1"
    assert msg.response_metadata["resilience"]["attempts"][0]["deployment_id"] == "p1"
    assert LITERAL_KEY not in json.dumps(msg.model_dump(), default=str)
    chunks = list(llm.stream("hi"))
    assert chunks[-1].response_metadata["resilience"]["attempts"][0]["deployment_id"] == "p1"
    for c in chunks:
        assert LITERAL_KEY not in json.dumps(c.model_dump(), default=str)
    sim.set_default("b1", echo)
    only = ResilientChatModel(router=router, model="primary")
    for call in (lambda: only.invoke("hi"), lambda: list(only.stream("hi"))):
        with pytest.raises(AllRoutesFailedError) as ei:
            call()
        err: BaseException | None = ei.value
        while err is not None:
            assert LITERAL_KEY not in str(err) + repr(err) + json.dumps(vars(err), default=str)
            err = err.__cause__ or err.__context__
    router.close()
