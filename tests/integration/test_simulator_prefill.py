"""The simulator's ``refuse_prefill`` fault: a model that takes no assistant prefill answers a
request ending in an assistant message with the 400 real providers send, and any other request
as its inner fault says; LiteLLM surfaces the refusal as a bad request in every dialect."""

from __future__ import annotations

import httpx
import litellm
import pytest

from llm_resilience_plugin._engine.taxonomy import classify
from llm_resilience_plugin.errors import ErrorClass
from llm_resilience_plugin.testing import Fault, ProviderSimulator
from llm_resilience_plugin.testing._fault_spec import behavior_from_data
from llm_resilience_plugin.testing._faults import PREFILL_REFUSAL

ASK = [{"role": "user", "content": "tell me a story"}]
PREFILL = [*ASK, {"role": "assistant", "content": "Hello from ", "prefix": True}]


def _chat(sim: ProviderSimulator, messages: list[dict[str, object]], **body: object) -> httpx.Response:
    return httpx.post(
        sim.api_base("a") + "/chat/completions",
        json={"model": "m", "messages": messages, **body},
        timeout=5,
        trust_env=False,
    )


def test_only_a_prefilled_request_is_refused(sim: ProviderSimulator) -> None:
    sim.set_default("a", Fault.refuse_prefill())
    plain = _chat(sim, ASK)
    assert plain.status_code == 200
    refused = _chat(sim, PREFILL)
    assert refused.status_code == 400
    assert refused.json() == {
        "error": {"message": PREFILL_REFUSAL, "type": "invalid_request_error", "param": None, "code": None}
    }
    # a trailing assistant turn without the prefix flag is a prefill too (Anthropic's reading)
    bare = [*ASK, {"role": "assistant", "content": "Hello"}]
    assert _chat(sim, bare).status_code == 400
    assert [r.behavior for r in sim.requests("a")] == ["ok", "prefill_refused", "prefill_refused"]


def test_the_inner_fault_applies_to_every_other_request(sim: ProviderSimulator) -> None:
    sim.script("a", Fault.refuse_prefill(Fault.ok(text="scripted answer")), Fault.refuse_prefill())
    sim.set_default("a", Fault.refuse_prefill(Fault.server_error(503), message="no prefill here"))
    assert _chat(sim, ASK).json()["choices"][0]["message"]["content"] == "scripted answer"
    assert _chat(sim, PREFILL).json()["error"]["message"] == PREFILL_REFUSAL
    assert _chat(sim, ASK).status_code == 503
    assert _chat(sim, PREFILL).json()["error"]["message"] == "no prefill here"
    # one wrapped in flaky: the draw first, then the prefill check
    sim.script("a", Fault.flaky(1.0, Fault.refuse_prefill()))
    assert _chat(sim, PREFILL).status_code == 400
    assert [r.behavior for r in sim.requests("a")][-1] == "flaky:prefill_refused"


def test_a_stream_refuses_before_any_byte(sim: ProviderSimulator) -> None:
    sim.set_default("a", Fault.refuse_prefill(Fault.stream_cut(after_chunks=1)))
    assert _chat(sim, PREFILL, stream=True).status_code == 400
    sim.set_default("a", Fault.refuse_prefill())
    streamed = _chat(sim, ASK, stream=True)
    assert streamed.status_code == 200 and "data: [DONE]" in streamed.text


def test_as_data_it_takes_an_inner_fault_and_a_message() -> None:
    assert behavior_from_data({"kind": "refuse_prefill"}) == Fault.refuse_prefill()
    spec = {"kind": "refuse_prefill", "fault": {"kind": "stream_cut", "after_chunks": 3}, "message": "x"}
    assert behavior_from_data(spec) == Fault.refuse_prefill(Fault.stream_cut(3), message="x")
    with pytest.raises(ValueError, match="refuse_prefill does not take seconds"):
        behavior_from_data({"kind": "refuse_prefill", "seconds": 1})
    with pytest.raises(ValueError, match="fault must be a Behavior"):
        Fault.refuse_prefill("ok")  # type: ignore[arg-type]


async def test_litellm_reads_the_refusal_as_a_bad_request(sim: ProviderSimulator) -> None:
    sim.set_default("a", Fault.refuse_prefill())
    with pytest.raises(litellm.BadRequestError) as info:
        await litellm.acompletion(
            model="openai/gpt-4o-mini",
            api_base=sim.api_base("a"),
            api_key="sk-sim",
            messages=PREFILL,
            stream=True,
            max_retries=0,
        )
    assert "does not support assistant message prefill" in str(info.value)
    assert classify(info.value).error_class is ErrorClass.BAD_REQUEST


def test_in_anthropics_dialect_too(sim: ProviderSimulator) -> None:
    sim.set_default("a", Fault.refuse_prefill())
    messages = [*ASK, {"role": "assistant", "content": "Hello from"}]
    with pytest.raises(litellm.BadRequestError) as info:
        litellm.completion(
            model="anthropic/claude-sonnet-4-5",
            api_base=sim.anthropic_base("a"),
            api_key="sk-ant-sim",
            messages=messages,
            max_tokens=32,
            max_retries=0,
        )
    assert "does not support assistant message prefill" in str(info.value)
    answered = litellm.completion(
        model="anthropic/claude-sonnet-4-5",
        api_base=sim.anthropic_base("a"),
        api_key="sk-ant-sim",
        messages=ASK,
        max_tokens=32,
        max_retries=0,
    )
    assert answered.choices[0].message.content.startswith("Hello from a.")
    assert [r.behavior for r in sim.requests("a")] == ["prefill_refused", "ok"]
