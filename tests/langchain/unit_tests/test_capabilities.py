"""Capability decisions and the per-group structured-output request, without a socket."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration
from pydantic import BaseModel

from llm_resilience_plugin.langchain import ResilientChatModel
from llm_resilience_plugin.langchain._capabilities import Deployment, GroupMap, all_true, smallest
from llm_resilience_plugin.langchain._tools import ContentOrToolParser, json_schema_binding
from llm_resilience_plugin.policy import build_spec


class Person(BaseModel):
    name: str
    age: int | None = None


def test_the_smallest_capability_wins() -> None:
    assert all_true([True, True]) is True
    assert all_true([True, False, None]) is False  # one route that cannot is enough
    assert all_true([True, None]) is None and all_true([]) is None  # unknown: left out
    assert smallest([128000, 8192]) == 8192
    assert smallest([128000, None]) is None and smallest([]) is None


@pytest.mark.parametrize(
    ("model", "declared", "strict"),
    [
        ("openai/gpt-4o-mini", {}, True),  # in the map with structured outputs
        ("openai/gpt-4-turbo", {}, False),  # in the map without; ChatOpenAI's rule agrees
        ("gpt-3.5-turbo", {}, False),
        ("openai/gpt-4", {"supports_response_schema": True}, True),  # a declaration wins
        ("openai/house-model", {}, True),  # unknown to the map: as ChatOpenAI decides
        ("openai/house-model", {"supports_response_schema": False}, False),
    ],
)
def test_who_takes_a_strict_schema(model: str, declared: dict[str, Any], strict: bool) -> None:
    assert Deployment(model, None, declared).takes_strict_schema() is strict


def test_the_reachable_groups_are_the_group_then_every_fallback_chain() -> None:
    model_list = [
        {"model_name": g, "litellm_params": {"model": m}, "model_info": {"id": g}}
        for g, m in [
            ("p", "openai/gpt-4o-mini"),
            ("b", "openai/gpt-4-turbo"),
            ("big", "openai/gpt-4o"),
            ("x", "m"),
        ]
    ]
    spec = build_spec(model_list, fallbacks=[{"p": ["b"]}], context_window_fallbacks=[{"p": ["big"]}])
    routes = GroupMap.of(spec, "p")
    assert list(routes.routes) == ["p", "b", "big"]
    assert routes.strict_routes() == {"p": True, "b": False, "big": True}
    assert routes.profile()["max_output_tokens"] == 4096  # gpt-4-turbo's, the smallest


def test_a_pydantic_schema_is_asked_per_group() -> None:
    bound = json_schema_binding(Person, None, is_pydantic=True, strict_routes={"p": True, "b": False})
    assert bound["response_format"]["json_schema"]["strict"] is True
    backup = bound["kwargs_by_group"]["b"]
    assert backup["response_format"] is None and backup["tool_choice"]["function"]["name"] == "Person"
    flipped = json_schema_binding(Person, None, is_pydantic=True, strict_routes={"b": False, "p": True})
    assert "response_format" not in flipped and flipped["tools"][0]["function"]["name"] == "Person"
    assert flipped["kwargs_by_group"]["p"]["tools"] is None  # the other form's keys unset
    same = json_schema_binding(Person, None, is_pydantic=True, strict_routes={"p": True, "q": True})
    assert "kwargs_by_group" not in same
    explicit = json_schema_binding(Person, False, is_pydantic=True, strict_routes={"p": True, "b": False})
    assert explicit["response_format"]["json_schema"]["strict"] is False and "kwargs_by_group" not in explicit


def test_the_parser_reads_either_a_json_text_or_the_schemas_tool_call() -> None:
    model_list = [
        {
            "model_name": g,
            "litellm_params": {"model": m, "api_key": "sk-x", "api_base": "http://127.0.0.1:9/v1"},
        }
        for g, m in [("p", "openai/gpt-4o-mini"), ("b", "openai/gpt-4-turbo")]
    ]
    with ResilientChatModel(
        model_list=model_list, model="p", fallbacks=[{"p": ["b"]}]
    ) as llm:  # never called
        parser = llm.with_structured_output(Person).last  # type: ignore[attr-defined]
    assert isinstance(parser, ContentOrToolParser)
    text = AIMessage('{"name": "Ann", "age": 31}')
    call = AIMessage("", tool_calls=[{"name": "Person", "args": {"name": "Ann", "age": 31}, "id": "1"}])
    for message in (text, call):
        assert parser.parse_result([ChatGeneration(message=message)]) == Person(name="Ann", age=31)
