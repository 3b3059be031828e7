"""Side by side with langchain-openai's ChatOpenAI on the simulator: what a LangChain user notices
when swapping one for the other (structured output, ``profile``, token counts, a wrapped chat
model in agents, response metadata and errors). Each check runs on both models; ChatOpenAI talks
to the simulator through ``base_url=sim.api_base(dep)`` (the simulator is OpenAI-compatible)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.exceptions import OutputParserException
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ValidationError
from typing_extensions import TypedDict

from llm_resilience_plugin.errors import ErrorClass
from llm_resilience_plugin.events import AttemptRecord
from llm_resilience_plugin.langchain import ResilientChatModel, ResilientChatRunnable, resilient
from llm_resilience_plugin.langchain._capabilities import GroupMap
from llm_resilience_plugin.testing import FakeClock, Fault
from llm_resilience_plugin.testing._simulator import ProviderSimulator
from tests.conftest import FAST_POLICY, deployment

NOT_STRICT = "openai/gpt-4-turbo"  # no structured outputs in LiteLLM's map; ChatOpenAI's rule agrees


class Person(BaseModel):
    """A person."""

    name: str
    age: int | None = None


class PersonDict(TypedDict):
    """A person."""

    name: str
    age: int


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def openai(sim: ProviderSimulator, dep: str, model: str = "gpt-4o-mini", **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model=model, base_url=sim.api_base(dep), api_key="sk-sim-secret", max_retries=0, **kwargs
    )  # type: ignore[arg-type]


@pytest.fixture
def ours(sim: ProviderSimulator) -> Iterator[ResilientChatModel]:
    """``primary`` (gpt-4o-mini on ``a``) falling back to ``backup`` (gpt-4-turbo on ``b``)."""
    model_list = [deployment(sim, "primary", "a"), deployment(sim, "backup", "b", model=NOT_STRICT)]
    llm = ResilientChatModel(
        model_list=model_list,
        model="primary",
        fallbacks=[{"primary": ["backup"]}],
        policy={**FAST_POLICY, "breaker": {"fail_max": 50}},
        router_options={"clock": FakeClock()},
    )
    yield llm
    llm.close()


def last_body(sim: ProviderSimulator, dep: str) -> dict[str, Any]:
    return sim.requests(dep)[-1].body


# -- 1. structured output: strict where the model takes it, per fallback group ---------------------


def test_a_pydantic_schema_is_sent_strict_as_chat_openai_sends_it(sim, ours) -> None:
    theirs = openai(sim, "o")
    a = theirs.with_structured_output(Person, method="json_schema").invoke("Ann is 31")
    b = ours.with_structured_output(Person, method="json_schema").invoke("Ann is 31")
    assert a == b == Person(name="example name", age=31)
    sent_theirs, sent_ours = last_body(sim, "o")["response_format"], last_body(sim, "a")["response_format"]
    assert sent_ours == sent_theirs
    assert sent_ours["json_schema"]["strict"] is True
    assert sent_ours["json_schema"]["schema"]["additionalProperties"] is False
    assert sent_ours["json_schema"]["schema"]["required"] == ["name", "age"]


@pytest.mark.parametrize("strict", [None, True, False])
def test_typed_dicts_are_sent_as_chat_openai_sends_them(sim, ours, strict) -> None:
    a = (
        openai(sim, "o")
        .with_structured_output(PersonDict, method="json_schema", strict=strict)
        .invoke("Ann is 31")
    )
    b = ours.with_structured_output(PersonDict, method="json_schema", strict=strict).invoke("Ann is 31")
    assert a == b == {"name": "example name", "age": 31}
    sent = last_body(sim, "a")["response_format"]
    assert sent == last_body(sim, "o")["response_format"]
    assert sent["json_schema"]["strict"] is bool(strict)  # strict unset is sent as False by both


def test_a_fallback_without_structured_outputs_is_asked_for_a_tool_call_as_chat_openai_asks_it(
    sim, ours
) -> None:
    chain = ours.with_structured_output(Person, method="json_schema")
    assert chain.invoke("Ann is 31") == Person(name="example name", age=31)
    assert last_body(sim, "a")["response_format"]["json_schema"]["strict"] is True
    sim.outage("a", 60)
    raw = ours.with_structured_output(Person, method="json_schema", include_raw=True).invoke("Ann is 31")
    assert raw["parsed"] == Person(name="example", age=31) and raw["parsing_error"] is None
    assert raw["raw"].response_metadata["model_group"] == "backup"
    assert raw["raw"].response_metadata["resilience"]["fallback_level"] == 1
    ours_sent = last_body(sim, "b")
    assert ours_sent.get("response_format") is None
    # ChatOpenAI on the same model (warning that it switches to function calling) sends the same
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = openai(sim, "o", model="gpt-4-turbo").with_structured_output(Person, method="json_schema")
    assert theirs.invoke("Ann is 31") == Person(name="example", age=31)
    theirs_sent = last_body(sim, "o")
    for key in ("tools", "tool_choice", "parallel_tool_calls"):
        assert ours_sent[key] == theirs_sent[key], key
    assert ours_sent["tool_choice"] == {"type": "function", "function": {"name": "Person"}}


async def test_the_fallback_form_streams_and_runs_async(sim, ours) -> None:
    sim.outage("a", 60)
    chain = ours.with_structured_output(Person, method="json_schema")
    assert await chain.ainvoke("Ann is 31") == Person(name="example", age=31)
    parts = [p async for p in chain.astream("Ann is 31")]
    assert parts and parts[-1] == Person(name="example", age=31)
    assert all(r.body.get("tools") for r in sim.requests("b"))


def test_a_group_is_asked_the_way_its_least_capable_deployment_takes(sim) -> None:
    model_list = [
        deployment(sim, "mixed", "m1"),
        deployment(sim, "mixed", "m2", model=NOT_STRICT),
        deployment(sim, "declared", "d1", model="openai/house-model"),  # unmapped: ChatOpenAI's rule
        deployment(sim, "refuses", "r1", model="openai/house-model"),
    ]
    model_list[3]["model_info"]["supports_response_schema"] = False  # a declaration wins
    with ResilientChatModel(model_list=model_list, model="mixed", policy=FAST_POLICY) as llm:
        assert llm.with_structured_output(Person).invoke("Ann is 31") == Person(name="example", age=31)
        assert all(r.body.get("tools") and not r.body.get("response_format") for r in sim.requests())
        spec = llm.get_router().spec
        assert {g: GroupMap.of(spec, g).strict_routes()[g] for g in ("mixed", "declared", "refuses")} == {
            "mixed": False,
            "declared": True,
            "refuses": False,
        }


def test_an_explicit_strict_is_sent_to_every_group(sim, ours) -> None:
    sim.outage("a", 60)
    ours.with_structured_output(Person, method="json_schema", strict=True).invoke("Ann is 31")
    assert last_body(sim, "b")["response_format"]["json_schema"]["strict"] is True


def test_an_explicit_strict_false_is_honoured_where_chat_openai_sends_strict_anyway(sim, ours) -> None:
    openai(sim, "o").with_structured_output(Person, method="json_schema", strict=False).invoke("Ann is 31")
    assert last_body(sim, "o")["response_format"]["json_schema"]["strict"] is True  # documented difference
    ours.with_structured_output(Person, method="json_schema", strict=False).invoke("Ann is 31")
    assert last_body(sim, "a")["response_format"]["json_schema"]["strict"] is False


# -- 2. profile -------------------------------------------------------------------------------------


def _smallest(*profiles: dict[str, Any]) -> dict[str, Any]:
    keys = set.intersection(*(set(p) for p in profiles))
    out: dict[str, Any] = {}
    for k in keys:
        values = [p[k] for p in profiles]
        if all(isinstance(v, bool) for v in values):
            out[k] = all(values)
        elif all(isinstance(v, int) for v in values):
            out[k] = min(values)
    return out


def test_profile_is_chat_openais_for_the_same_model(sim) -> None:
    theirs = openai(sim, "o").profile
    with ResilientChatModel(model_list=[deployment(sim, "g", "a")], model="g") as llm:
        ours = llm.profile
    assert ours and theirs
    shared = set(ours) & set(theirs)
    assert {
        "max_input_tokens",
        "max_output_tokens",
        "tool_calling",
        "structured_output",
        "image_inputs",
    } <= shared
    assert {k: ours[k] for k in shared} == {k: theirs[k] for k in shared}  # type: ignore[literal-required]


def test_profile_is_the_smallest_across_the_group_and_its_fallbacks(sim, ours) -> None:
    primary, backup = openai(sim, "o").profile, openai(sim, "o", model="gpt-4-turbo").profile
    assert primary and backup and ours.profile
    expected = _smallest(primary, backup)  # type: ignore[arg-type]
    shared = set(expected) & set(ours.profile)
    assert {"max_output_tokens", "structured_output", "tool_calling"} <= shared
    assert {k: ours.profile[k] for k in shared} == {k: expected[k] for k in shared}  # type: ignore[literal-required]
    assert ours.profile["max_output_tokens"] == 4096 and ours.profile["structured_output"] is False


def test_profile_takes_declarations_and_leaves_unknowns_out(sim) -> None:
    declared = deployment(sim, "g", "a")
    declared["model_info"].update(max_input_tokens=1000, supports_vision=False)
    unknown = deployment(sim, "house", "h", model="openai/house-model")
    with (
        ResilientChatModel(model_list=[declared, unknown], model="g") as llm,
        ResilientChatModel(model_list=[declared, unknown], model="house") as house,
        ResilientChatModel(router=llm.get_router(), model="g") as shared,
    ):
        assert (
            llm.profile and llm.profile["max_input_tokens"] == 1000 and llm.profile["image_inputs"] is False
        )
        assert house.profile == {"text_inputs": True, "text_outputs": True}
        assert shared.profile == llm.profile


def test_agent_middleware_reads_the_profile(sim, ours) -> None:
    from langchain.agents.middleware import SummarizationMiddleware

    for model in (openai(sim, "o"), ours):  # needs the context window from the profile
        middleware = SummarizationMiddleware(model=model, trigger=("fraction", 0.8))
        assert middleware is not None
    bare = ResilientChatModel(router=ours.get_router(), model="primary", profile={})
    with pytest.raises(ValueError, match="profile"):
        SummarizationMiddleware(model=bare, trigger=("fraction", 0.8))


# -- 3. token counts ----------------------------------------------------------------------------------


def test_token_counts_match_chat_openai_offline_without_transformers(sim, ours, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` fails
    text = "hello world, how are you? Pneumonoultramicroscopic 東京 🙂"
    messages = [SystemMessage("be brief"), HumanMessage(text), AIMessage("ok then"), HumanMessage("and now?")]
    n_text, n_messages = ours.get_num_tokens(text), ours.get_num_tokens_from_messages(messages)
    # ChatOpenAI's tiktoken files come from LiteLLM's bundled copy (pointed at when it first counts)
    theirs = openai(sim, "o")
    assert (n_text, n_messages) == (
        theirs.get_num_tokens(text),
        theirs.get_num_tokens_from_messages(messages),
    )
    assert n_text == 16 and n_messages == 42
    assert ours.get_num_tokens_from_messages(messages, tools=[get_weather]) > n_messages  # tools count too
    assert sim.count() == 0  # nothing was sent


# -- 4. resilient() over a chat model stays a chat model ------------------------------------------


def test_resilient_chat_model_keeps_bind_tools_structured_output_and_with_config(sim) -> None:
    inner = openai(sim, "o")
    wrapped = resilient(inner, name="openai", clock=FakeClock())
    assert isinstance(wrapped, ResilientChatRunnable) and wrapped.profile == inner.profile
    with_tools = wrapped.bind_tools([get_weather], tool_choice="get_weather")
    structured = wrapped.with_structured_output(Person, method="json_schema")
    configured = wrapped.with_config(tags=["t"])
    for w in (with_tools, structured, configured):
        assert isinstance(w, ResilientChatRunnable) and w.breaker is wrapped.breaker
    for plain, resilient_one in ((inner.bind_tools([get_weather], tool_choice="get_weather"), with_tools),
                                 (inner.with_structured_output(Person, method="json_schema"), structured),
                                 (inner.with_config(tags=["t"]), configured)):  # fmt: skip
        expected = plain.invoke("weather in 'Paris'? Ann is 31")
        sim.script("o", Fault.rate_limit())  # one 429: retried by the wrapper, not by ChatOpenAI
        got = resilient_one.invoke("weather in 'Paris'? Ann is 31")
        if isinstance(expected, AIMessage):
            assert isinstance(got, AIMessage)
            assert [(c["name"], c["args"]) for c in got.tool_calls] == [
                (c["name"], c["args"]) for c in expected.tool_calls
            ]
            assert got.content == expected.content
        else:
            assert got == expected
    assert sim.count("o") == 9  # three plain calls, three 429s, three retries


def test_resilient_chat_model_runs_inside_create_agent(sim) -> None:
    from langchain.agents import create_agent

    question = {"messages": [HumanMessage("What is the weather in 'Paris'?")]}
    plain = create_agent(openai(sim, "o"), tools=[get_weather]).invoke(question)
    sim.clear_log()
    sim.script("o", Fault.rate_limit(), Fault.server_error())
    wrapped = resilient(openai(sim, "o"), name="openai", clock=FakeClock())
    answered = create_agent(wrapped, tools=[get_weather]).invoke(question)
    assert [type(m) for m in answered["messages"]] == [type(m) for m in plain["messages"]]
    assert [HumanMessage, AIMessage, ToolMessage, AIMessage] == [type(m) for m in answered["messages"]]
    assert answered["messages"][-1].content == plain["messages"][-1].content
    assert sim.count("o") == 4  # two failures retried, then the tool call and the answer
    assert answered["messages"][2].content == "sunny in Paris"


def test_resilient_chat_model_runs_inside_langgraphs_prebuilt_agent(sim) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_react_agent is deprecated in favour of create_agent
        from langgraph.prebuilt import create_react_agent

        question = {"messages": [HumanMessage("What is the weather in 'Paris'?")]}
        plain = create_react_agent(openai(sim, "o"), tools=[get_weather]).invoke(question)
        sim.script("o", Fault.rate_limit())
        wrapped = resilient(openai(sim, "o"), name="openai", clock=FakeClock())
        answered = create_react_agent(wrapped, tools=[get_weather]).invoke(question)
    assert [type(m) for m in answered["messages"]] == [type(m) for m in plain["messages"]]
    assert answered["messages"][-1].content == plain["messages"][-1].content


def test_create_agent_picks_its_structured_output_strategy_from_the_profile(sim, ours) -> None:
    from langchain.agents import create_agent

    question = {"messages": [HumanMessage("Ann is 31")]}
    alone = ResilientChatModel(router=ours.get_router(), model="backup")  # gpt-4-turbo only
    with ResilientChatModel(model_list=[deployment(sim, "g", "g1")], model="g") as single:
        # gpt-4o-mini alone: native structured output (a response_format), as for ChatOpenAI
        for model, dep in ((openai(sim, "o"), "o"), (single, "g1")):
            out = create_agent(model, tools=[], response_format=Person).invoke(question)
            assert out["structured_response"] == Person(name="example name", age=31)
            assert last_body(sim, dep)["response_format"]["type"] == "json_schema"
        # a fallback without structured outputs may answer: the agent asks for a tool call instead
        for model, dep in ((ours, "a"), (alone, "b")):
            out = create_agent(model, tools=[], response_format=Person).invoke(question)
            assert out["structured_response"] == Person(name="example", age=31)
            assert last_body(sim, dep)["tools"][0]["function"]["name"] == "Person"


# -- 5. what else a user notices: metadata and errors ------------------------------------------


def test_response_metadata_has_chat_openais_id_fingerprint_and_logprobs(sim, ours) -> None:
    a, b = openai(sim, "o").invoke("hi"), ours.invoke("hi")
    for key in ("id", "system_fingerprint", "logprobs", "finish_reason", "model_name", "model_provider"):
        assert key in a.response_metadata and key in b.response_metadata, key
    assert (
        b.response_metadata["id"].startswith("chatcmpl-")
        and b.response_metadata["system_fingerprint"] == "sim"
    )
    assert b.id == b.response_metadata["id"]  # the message id is the provider's response id
    assert a.usage_metadata and b.usage_metadata
    assert set(a.usage_metadata) == set(b.usage_metadata)  # empty token-detail dicts included
    assert b.usage_metadata["input_token_details"] == {} and b.usage_metadata["output_token_details"] == {}


def test_an_unparsable_structured_reply_raises_an_output_parser_exception(sim, ours) -> None:
    sim.script("o", Fault.ok(text="not json at all"))
    with pytest.raises(ValidationError):  # ChatOpenAI validates inside the model call
        openai(sim, "o").with_structured_output(Person, method="json_schema").invoke("Ann is 31")
    sim.script("a", Fault.ok(text="not json at all"), Fault.ok(text='{"name": 3}'))
    with pytest.raises(OutputParserException):  # LangChain's parser error (ours parses after the call)
        ours.with_structured_output(Person, method="json_schema").invoke("Ann is 31")
    with pytest.raises(OutputParserException) as err:
        ours.with_structured_output(Person, method="json_schema").invoke("Ann is 31")
    assert isinstance(err.value.__cause__, ValidationError)  # the schema mismatch underneath
    sim.script("a", Fault.ok(text="not json at all"))
    raw = ours.with_structured_output(Person, method="json_schema", include_raw=True).invoke("Ann is 31")
    assert raw["parsed"] is None and isinstance(raw["parsing_error"], OutputParserException)


async def test_resilient_chat_model_runs_inside_create_agent_async(sim) -> None:
    from langchain.agents import create_agent

    question = {"messages": [HumanMessage("What is the weather in 'Paris'?")]}
    plain = await create_agent(openai(sim, "o"), tools=[get_weather]).ainvoke(question)
    sim.script("o", Fault.rate_limit())
    wrapped = resilient(openai(sim, "o"), name="openai", clock=FakeClock())
    seen: list[Any] = []
    wrapped.subscribe(seen.append)  # the agent's bound copies report to the wrapper's listeners
    answered = await create_agent(wrapped, tools=[get_weather]).ainvoke(question)
    assert [m.content for m in answered["messages"]] == [m.content for m in plain["messages"]]
    outcomes = [(r.outcome, r.error_class) for r in seen if isinstance(r, AttemptRecord)]
    assert outcomes == [("failure", ErrorClass.RATE_LIMIT), ("success", None), ("success", None)]
