"""Structured JSON logs: router events (every attempt of a retried-then-fallen-back call, retries,
fallbacks, breakers, calls), the LangChain StructuredLogCallbackHandler, and the JsonFormatter -
with no API key anywhere."""

from __future__ import annotations

import enum
import json
import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_litellm import ChatLiteLLM

from llm_resilience_plugin.cost._guard import Budget, CostGuard
from llm_resilience_plugin.events import hidden_params_of
from llm_resilience_plugin.langchain._callbacks import CostGuardCallbackHandler, StructuredLogCallbackHandler
from llm_resilience_plugin.observability._logs import (
    JsonFormatter,
    attach_router_logging,
    redact,
    register_secret,
)
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator
from tests.conftest import MSG, RouterFactory

SECRET = "sk-sim-secret"  # the api_key of every conftest deployment


class Capture(logging.Handler):
    """Formats every record with JsonFormatter, as a log pipeline would."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        out = [json.loads(line) for line in self.lines]
        return [r for r in out if name is None or r["event"] == name]


@pytest.fixture
def logs() -> Iterator[Capture]:
    cap = Capture()
    root = logging.getLogger("llm_resilience")
    old = root.level
    root.addHandler(cap)
    root.setLevel(logging.INFO)
    yield cap
    root.removeHandler(cap)
    root.setLevel(old)


# -- router events ------------------------------------------------------------------------------------


async def test_every_attempt_of_a_retried_then_fallen_back_call_is_logged(
    make_router: RouterFactory, sim: ProviderSimulator, logs: Capture
):
    guard = CostGuard([Budget.daily(1.0), Budget.scoped("tenant", 0.5)])
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        guards=[guard],
        policy={"breaker": {"fail_max": 100}},
    )
    detach = attach_router_logging(router, guard=guard)
    sim.script(
        "a",
        Fault.server_error(500),
        Fault.rate_limit(retry_after=0.01),
        Fault.http_error(503, message=f"upstream rejected key {SECRET} (Bearer abcdefghijklmnop)"),
    )
    sim.set_default("a", Fault.server_error(502))
    resp = await router.acompletion(
        model="primary", messages=MSG, max_tokens=5, metadata={"tenant": "acme"}, idempotency_key="order-42"
    )
    assert sim.count("a") == 4 and sim.count("b") == 1  # retries are counted per error class

    attempts = logs.events("llm_attempt")
    assert [(a["attempt"], a["retry_number"], a["deployment_id"], a["fallback_level"]) for a in attempts] == [
        (1, 0, "a", 0),
        (2, 1, "a", 0),
        (3, 2, "a", 0),
        (4, 3, "a", 0),
        (5, 4, "b", 1),
    ]
    assert [a["outcome"] for a in attempts] == ["failure"] * 4 + ["success"]
    assert [a["error_class"] for a in attempts] == ["server", "rate_limit", "server", "server", None]
    assert [a["status"] for a in attempts] == [500, 429, 503, 502, None]
    assert [a["level"] for a in attempts] == ["warning"] * 4 + ["info"]
    call_id = attempts[0]["call_id"]
    for a in attempts:
        assert a["call_id"] == call_id and a["request_key"] == call_id
        assert a["idempotency_key"] == "order-42"
        assert a["model_group"] == ("backup" if a["deployment_id"] == "b" else "primary")
        assert a["provider"] == "openai" and a["model"] == "openai/gpt-4o-mini"
        assert a["latency_ms"] >= 0 and a["breaker_state"] in ("closed", "open", "half_open")
        assert a["metadata"] == {"tenant": "acme"}
        assert a["ts"].endswith("Z") and a["logger"] == "llm_resilience.router"
        assert "budget_remaining" in a
    ok = attempts[-1]
    assert ok["served_model"] == "gpt-4o-mini"
    assert ok["prompt_tokens"] == resp.usage.prompt_tokens and ok["completion_tokens"] == 5
    assert ok["cost"] == pytest.approx(hidden_params_of(resp)["response_cost"])
    assert ok["budget_remaining"] == pytest.approx(0.5 - ok["cost"], abs=1e-9)
    assert ok["budget_tightest"].startswith("tenant/day[tenant=acme]")
    assert [a["cost"] for a in attempts[:4]] == [0.0] * 4
    assert (
        attempts[2]["error_message"].count("[REDACTED]") == 1
        and "(Bearer ***)" in attempts[2]["error_message"]
    )

    retries = logs.events("llm_retry")
    assert [(r["retry_number"], r["error_class"], r["deployment_id"]) for r in retries] == [
        (1, "server", "a"),
        (2, "rate_limit", "a"),
        (3, "server", "a"),
    ]
    (fb,) = logs.events("llm_fallback")
    assert (fb["from_group"], fb["to_group"], fb["fallback_level"], fb["reason"]) == (
        "primary",
        "backup",
        1,
        "server",
    )
    assert fb["idempotency_key"] == "order-42"
    (call,) = logs.events("llm_call")
    assert call["outcome"] == "success" and call["served_group"] == "backup" and call["deployment_id"] == "b"
    assert call["upstream_requests"] == 5 and call["retries"] == 4 and call["fallback_level"] == 1
    assert call["total_tokens"] == resp.usage.total_tokens and call["cost"] == pytest.approx(ok["cost"])
    assert call["idempotency_key"] == "order-42"

    # no API key in any record, in any form
    assert logs.lines and not any(SECRET in line for line in logs.lines)
    detach()
    await router.acompletion(model="primary", messages=MSG, max_tokens=5)
    assert len(logs.events("llm_call")) == 1  # detached
    assert router.guards == [guard]  # the observer is gone too


async def test_breaker_transitions_and_stream_attempts_are_logged(
    make_router: RouterFactory, sim: ProviderSimulator, logs: Capture
):
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"breaker": {"fail_max": 1}},
    )
    attach_router_logging(router)
    sim.script("a", Fault.server_error(500))
    stream = await router.acompletion(model="primary", messages=MSG, stream=True, max_tokens=5)
    async for _ in stream:
        pass
    opened = [b for b in logs.events("breaker_transition") if b["new_state"] == "open"]
    assert {b["deployment_id"] for b in opened} >= {"a"} and all(b["level"] == "warning" for b in opened)
    ok = logs.events("llm_attempt")[-1]
    assert ok["outcome"] == "success" and ok["ttft_ms"] is not None
    assert ok["prompt_tokens"] and ok["completion_tokens"] == 5
    assert ok["cost"] == pytest.approx(ok["prompt_tokens"] * 1.5e-7 + 5 * 6e-7)
    (call,) = logs.events("llm_call")
    assert (
        call["stream"] is True and call["ttft_ms"] is not None and call["cost"] == pytest.approx(ok["cost"])
    )
    assert not any(SECRET in line for line in logs.lines)


async def test_budget_refusals_are_logged(make_router: RouterFactory, sim: ProviderSimulator, logs: Capture):
    guard = CostGuard([Budget.per_request(1e-6)])
    router = make_router({"primary": ["a"]}, guards=[guard])
    attach_router_logging(router, guard=guard)
    with pytest.raises(Exception, match="per_request"):
        await router.acompletion(model="primary", messages=MSG, max_tokens=5)
    (refused,) = logs.events("budget_refused")
    assert refused["budget"] == "per_request" and refused["limit"] == 1e-6 and refused["reservation"] > 1e-6
    (att,) = logs.events("llm_attempt")
    assert att["outcome"] == "skipped" and att["error_class"] == "budget" and att["deployment_id"] is None
    (call,) = logs.events("llm_call")
    assert call["outcome"] == "failure" and call["upstream_requests"] == 0
    assert sim.count() == 0


# -- the LangChain handler ------------------------------------------------------------------------


def chat(sim: ProviderSimulator, **kw: Any) -> ChatLiteLLM:
    return ChatLiteLLM(
        model="openai/gpt-4o-mini",
        api_base=sim.api_base("x"),
        api_key=SECRET,
        max_retries=0,
        max_tokens=7,
        **kw,
    )


async def test_llm_run_records_for_invoke_stream_and_failure(sim: ProviderSimulator, logs: Capture):
    guard = CostGuard([Budget.daily(1.0)])
    handlers = [CostGuardCallbackHandler(guard), StructuredLogCallbackHandler(guard=guard)]
    config: RunnableConfig = {"callbacks": handlers, "metadata": {"tenant": "acme", "idempotency_key": "k-1"}}
    model = chat(sim)
    msg = model.invoke("hello there friend", config=config)
    list(model.stream("hello there friend", config=config))
    sim.script("x", Fault.http_error(400, message=f"bad request for key {SECRET}"))
    with pytest.raises(Exception, match="bad request"):
        await model.ainvoke("hello there friend", config=config)

    runs = logs.events("llm_run")
    assert [r["outcome"] for r in runs] == ["success", "success", "failure"]
    inv, stream, failed = runs
    for r in runs:
        assert uuid.UUID(r["run_id"]) and r["request_key"] == r["run_id"]
        assert r["model"] == "openai/gpt-4o-mini" and r["provider"] == "litellm"
        assert r["latency_ms"] > 0 and r["idempotency_key"] == "k-1"
        assert r["metadata"] == {"tenant": "acme", "idempotency_key": "k-1"}
        assert r["params"]["max_tokens"] == 7
        assert "input" not in r and "output" not in r  # no content unless asked
    assert inv["served_model"] == "openai/gpt-4o-mini" and inv["ttft_ms"] is None
    assert inv["prompt_tokens"] == msg.usage_metadata["input_tokens"] and inv["completion_tokens"] == 7
    assert inv["cost"] == pytest.approx(msg.response_metadata["response_cost"])
    assert inv["budget_remaining"] == pytest.approx(1.0 - inv["cost"], abs=1e-9)
    assert stream["ttft_ms"] is not None and stream["completion_tokens"] == 7 and stream["cost"] > 0
    assert failed["level"] == "warning" and failed["error_class"] == "bad_request"
    assert failed["error_type"] == "BadRequestError" and "[REDACTED]" in failed["error_message"]
    assert not any(SECRET in line for line in logs.lines)
    assert not any("hello there friend" in line for line in logs.lines)


def test_content_only_when_asked_and_parent_runs_are_linked(sim: ProviderSimulator, logs: Capture):
    handler = StructuredLogCallbackHandler(include_content=True)
    model = chat(sim)
    chain = RunnableLambda(lambda x, config: model.invoke(x, config=config))
    chain.invoke("hello there friend", config={"callbacks": [handler]})
    (run,) = logs.events("llm_run")
    assert run["input"] == [[{"role": "user", "content": "hello there friend"}]]
    assert run["output"].startswith("Hello from x.")
    assert run["parent_run_id"] is not None and run["root_run_id"] == run["parent_run_id"]


# -- the formatter ---------------------------------------------------------------------------------


class Color(enum.Enum):
    RED = "red"


def test_json_formatter_merges_payload_and_extras_and_redacts():
    fmt = JsonFormatter(static={"service": "checkout"})
    register_secret("hunter2-very-secret")
    rec = logging.LogRecord("app", logging.ERROR, __file__, 1, "hello %s", ("world",), None)
    rec.llm_event_name = "custom"
    rec.llm_event = {
        "api_key": "sk-live-abcdefghijkl",
        "headers": {"Authorization": "Bearer xyz123456789", "x-request-id": "r1"},
        "note": "password is hunter2-very-secret",
        "level": "shadowed",
    }
    rec.user_id = uuid.UUID(int=1)
    rec.when = datetime(2026, 1, 1, tzinfo=UTC)
    rec.color = Color.RED
    out = json.loads(fmt.format(rec))
    assert out["event"] == "custom" and out["message"] == "hello world" and out["level"] == "error"
    assert out["service"] == "checkout" and out["logger"] == "app"
    assert out["api_key"] == "[REDACTED]" and out["headers"]["Authorization"] == "[REDACTED]"
    assert out["headers"]["x-request-id"] == "r1"
    assert out["note"] == "password is [REDACTED]"
    assert out["event_level"] == "shadowed"
    assert out["user_id"] == str(uuid.UUID(int=1)) and out["when"].startswith("2026-01-01")
    assert "RED" in out["color"]
    try:
        raise ValueError("boom sk-abcdefghijklmnop")
    except ValueError:
        import sys

        rec2 = logging.LogRecord("app", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    out2 = json.loads(fmt.format(rec2))
    assert out2["exc_type"] == "ValueError" and "sk-***" in out2["exc_message"]
    assert out2["event"] == "failed" and "message" not in out2  # no field that only repeats event
    assert "sk-abcdefghijklmnop" not in json.dumps(out2)


def test_redact_keeps_counts_and_idempotency_keys():
    assert redact({"prompt_tokens": 3, "idempotency_key": "k", "max_tokens": 5, "token": "abc"}) == {
        "prompt_tokens": 3,
        "idempotency_key": "k",
        "max_tokens": 5,
        "token": "abc",
    }


def test_llm_run_record_of_a_resilient_chat_model_carries_the_router_report(
    make_router: RouterFactory, sim: ProviderSimulator, logs: Capture
):
    from llm_resilience_plugin.langchain import ResilientChatModel

    router = make_router({"primary": ["a"]}, policy={"breaker": {"fail_max": 100}})
    sim.script("a", Fault.server_error(500))
    llm = ResilientChatModel(router=router, model="primary", max_tokens=5)
    llm.invoke("hello there friend", config={"callbacks": [StructuredLogCallbackHandler()]})
    (run,) = logs.events("llm_run")
    assert run["model"] == "primary" and run["deployment_id"] == "a" and run["served_group"] == "primary"
    assert run["upstream_requests"] == 2 and run["retries"] == 1 and run["fallback_level"] == 0
    assert run["call_id"] and run["idempotency_key"].startswith("fp-")
    assert run["cost"] > 0 and run["completion_tokens"] == 5
    assert not any(SECRET in line for line in logs.lines)


async def test_keys_given_as_environment_references_are_scrubbed_too(
    sim: ProviderSimulator, logs: Capture, monkeypatch: pytest.MonkeyPatch
):
    from llm_resilience_plugin import ResilientRouter
    from llm_resilience_plugin.testing import FakeClock
    from tests.conftest import FAST_POLICY, deployment

    monkeypatch.setenv("LLMRP_TEST_KEY", "sk-from-env-0123456789")
    router = ResilientRouter(
        model_list=[deployment(sim, "primary", "a", api_key="os.environ/LLMRP_TEST_KEY")],
        policy=FAST_POLICY,
        clock=FakeClock(),
    )
    try:
        attach_router_logging(router)
        sim.script("a", Fault.http_error(500, message="key sk-from-env-0123456789 is throttled"))
        await router.acompletion(model="primary", messages=MSG, max_tokens=5)
        failed = logs.events("llm_attempt")[0]
        assert failed["error_message"].endswith("key [REDACTED] is throttled")
        assert not any("sk-from-env" in line for line in logs.lines)
    finally:
        router.close()
