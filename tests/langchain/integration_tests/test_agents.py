"""An LCEL chain and tool-calling agents (LangGraph's prebuilt ReAct agent and a hand loop) keep
answering while the primary deployment is down and while a 429 storm hits it, reporting usage
and cost for the deployment that actually served."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest
import tenacity
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.callbacks.usage import get_usage_metadata_callback
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.outputs import LLMResult
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.tools import tool

from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin.langchain import ResilientChatModel
from llm_resilience_plugin.testing import FakeClock
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator
from tests.conftest import deployment

PRICES = {"primary": (1e-6, 2e-6), "backup": (4e-6, 8e-6)}


@pytest.fixture
def router(sim: ProviderSimulator) -> Iterator[ResilientRouter]:
    model_list = [
        deployment(
            sim,
            group,
            dep,
            model=f"openai/{group}-model",
            input_cost_per_token=PRICES[group][0],
            output_cost_per_token=PRICES[group][1],
        )
        for group, dep in (("primary", "p1"), ("backup", "b1"))
    ]
    r = ResilientRouter(
        model_list=model_list,
        fallbacks=[{"primary": ["backup"]}],
        policy={
            "deadline": 10,
            "attempt_timeout": 5,
            "backoff": {"initial": 0.01, "maximum": 0.05},
            # 429s open a breaker only for a deployment that answers nothing else: by default ten
            # in a row over a minute; here three, at once (a provider refusing every request),
            # so the 429-storm cases do not depend on how many requests six calls send.
            "breaker": {
                "fail_max": 3,
                "reset_timeout": 30,
                "rate_limit_fail_max": 3,
                "rate_limit_open_after": 0,
            },
        },
        clock=FakeClock(),
        seed=3,
    )
    yield r
    r.close()


class Served(BaseCallbackHandler):
    """What each LLM run reported at its end, and the retries it went through."""

    def __init__(self) -> None:
        self.metadata: list[dict[str, Any]] = []
        self.usage: list[dict[str, Any] | None] = []
        self.retries: list[UUID] = []

    def on_llm_end(self, response: LLMResult, **kw: Any) -> None:
        msg = response.generations[0][0].message  # type: ignore[attr-defined]
        self.metadata.append(msg.response_metadata)
        self.usage.append(msg.usage_metadata)

    def on_retry(self, retry_state: tenacity.RetryCallState, *, run_id: UUID, **kw: Any) -> None:
        self.retries.append(run_id)


def assert_served_by_backup(md: dict[str, Any], usage: dict[str, Any] | None) -> None:
    assert md["model_name"] == "backup-model" and md["model_id"] == "b1"
    assert usage is not None and usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    inp, out = PRICES["backup"]
    assert md["response_cost"] == pytest.approx(usage["input_tokens"] * inp + usage["output_tokens"] * out)


@tool
def search(query: str) -> str:
    """Search the knowledge base for a query."""
    return f"3 results for {query}"


def _break_primary(sim: ProviderSimulator, how: str) -> None:
    if how == "outage":
        sim.outage("p1", 60, Fault.server_error(503))
    else:  # a 429 storm: every request is rate limited, with a short Retry-After
        sim.set_default("p1", Fault.rate_limit(retry_after=0.01))


@pytest.mark.parametrize("how", ["outage", "429-storm"])
async def test_lcel_chain_keeps_answering(sim: ProviderSimulator, router: ResilientRouter, how: str) -> None:
    llm = ResilientChatModel(router=router, model="primary")
    chain = ChatPromptTemplate.from_messages([("system", "Be brief."), ("human", "{question}")]) | llm
    text_chain = chain | StrOutputParser()
    assert text_chain.invoke({"question": "warm up"}).startswith("Hello from p1")
    _break_primary(sim, how)
    served = Served()
    cfg: Any = {"callbacks": [served]}
    answers = [
        text_chain.invoke({"question": "one"}, config=cfg),
        await text_chain.ainvoke({"question": "two"}, config=cfg),
        *text_chain.batch([{"question": "three"}, {"question": "four"}], config=cfg),
        "".join(text_chain.stream({"question": "five"}, config=cfg)),
        "".join([c async for c in text_chain.astream({"question": "six"}, config=cfg)]),
    ]
    assert all(a.startswith("Hello from b1") for a in answers), answers
    assert len(served.metadata) == 6
    for md, usage in zip(served.metadata, served.usage, strict=True):
        assert_served_by_backup(md, usage)
    # the breaker opened on the primary: later calls stop knocking on it
    assert router.breakers()["p1"]["state"] == "open"
    before = sim.count("p1")
    with get_usage_metadata_callback() as usage_cb:
        msg = await chain.ainvoke({"question": "seven"})
    assert sim.count("p1") == before
    assert msg.response_metadata["resilience"]["attempts"][0]["outcome"] == "skipped"
    assert list(usage_cb.usage_metadata) == ["backup-model"]


@pytest.mark.parametrize("how", ["outage", "429-storm"])
def test_langgraph_react_agent_keeps_answering(
    sim: ProviderSimulator, router: ResilientRouter, how: str
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_react_agent is deprecated in favour of langchain's
        from langgraph.prebuilt import create_react_agent

        agent = create_react_agent(ResilientChatModel(router=router, model="primary"), [search])
    _break_primary(sim, how)
    served = Served()
    out = agent.invoke(
        {"messages": [("user", "search for 'circuit breakers'")]}, config={"callbacks": [served]}
    )
    messages: list[BaseMessage] = out["messages"]
    ai = [m for m in messages if isinstance(m, AIMessage)]
    tools = [m for m in messages if isinstance(m, ToolMessage)]
    assert ai[0].tool_calls[0]["name"] == "search"
    assert ai[0].tool_calls[0]["args"] == {"query": "circuit breakers"}
    assert tools[0].content == "3 results for circuit breakers"
    assert ai[-1].content == "The tool returned: 3 results for circuit breakers."
    for m in ai:
        assert_served_by_backup(m.response_metadata, m.usage_metadata)
    assert len(served.metadata) == 2
    assert sim.count("b1") == 2


def test_langgraph_messages_mode_streams_through_the_resilient_path(
    sim: ProviderSimulator, router: ResilientRouter
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

        agent = create_react_agent(ResilientChatModel(router=router, model="primary"), [search])
    # LangGraph's "messages" mode makes invoke() stream through _stream: resilience (and
    # on_retry) must hold there too.
    sim.script("p1", Fault.rate_limit(), Fault.stream_cut(after_chunks=0))
    served = Served()
    tokens: list[Any] = []
    for chunk, _meta in agent.stream(
        {"messages": [("user", "search for 'retries'")]},
        stream_mode="messages",
        config={"callbacks": [served]},
    ):
        tokens.append(chunk)
    assert any(getattr(c, "tool_call_chunks", None) for c in tokens)
    assert sum(1 for r in sim.requests("p1") if r.stream) == 4  # 2 failures before the first chunk
    assert len(served.retries) == 2
    final = [c for c in tokens if isinstance(c, AIMessage) and c.response_metadata.get("model_name")]
    assert final and final[-1].response_metadata["model_id"] == "p1"


async def test_hand_rolled_agent_loop_survives_an_outage_mid_conversation(
    sim: ProviderSimulator, router: ResilientRouter
) -> None:
    llm = ResilientChatModel(router=router, model="primary").bind_tools([search])
    history: list[BaseMessage] = [HumanMessage("search for 'fallbacks'")]
    first = await llm.ainvoke(history)
    assert isinstance(first, AIMessage) and first.response_metadata["model_id"] == "p1"
    history.append(first)
    for call in first.tool_calls:
        history.append(await search.ainvoke(call))
    sim.outage("p1", 60)  # the primary dies between two turns
    second = await llm.ainvoke(history)
    assert second.content == "The tool returned: 3 results for fallbacks."
    assert_served_by_backup(second.response_metadata, second.usage_metadata)
    sent = sim.requests("b1")[-1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert sent[1]["tool_calls"][0]["function"]["name"] == "search"
