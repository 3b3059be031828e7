"""Tools and structured output for :class:`ResilientChatModel`, in OpenAI format (what LiteLLM takes):
``tool_choice`` normalisation for ``bind_tools`` and the ``with_structured_output`` chain builder."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.base import LanguageModelInput
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.base import OutputParserLike
from langchain_core.output_parsers.openai_tools import JsonOutputKeyToolsParser, PydanticToolsParser
from langchain_core.output_parsers.transform import BaseCumulativeTransformOutputParser
from langchain_core.outputs import Generation
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import BaseModel

ToolLike = dict[str, Any] | type | Callable[..., Any] | BaseTool
"""Anything ``convert_to_openai_tool`` accepts."""

StructuredOutputMethod = Literal["json_schema", "function_calling", "json_mode"]
"""The ways ``with_structured_output`` can ask for structured output."""

TOOL_CHOICE_KEYWORDS = frozenset({"auto", "none", "required"})
"""``tool_choice`` strings OpenAI understands as they are."""


def openai_tool_choice(tool_choice: dict[str, Any] | str | bool, names: Sequence[str]) -> Any:
    """OpenAI's ``tool_choice`` for LangChain's spellings (``True``/``"any"`` -> ``"required"``, a
    bound tool's name -> its function dict); a name or dict naming an unbound tool is an error."""
    if tool_choice is True or tool_choice == "any":
        return "required"
    if isinstance(tool_choice, str) and tool_choice in TOOL_CHOICE_KEYWORDS:
        return tool_choice
    if isinstance(tool_choice, str):
        if tool_choice not in names:
            raise ValueError(f"tool_choice {tool_choice!r} is not a bound tool; bound tools: {names}")
        return {"type": "function", "function": {"name": tool_choice}}
    if isinstance(tool_choice, dict):
        wanted = (tool_choice.get("function") or {}).get("name")
        if wanted is not None and wanted not in names:
            raise ValueError(f"tool_choice names {wanted!r}, which is not a bound tool; bound: {names}")
        return tool_choice
    raise ValueError(f"unsupported tool_choice {tool_choice!r}")


def tool_choice_kwargs(
    formatted: Sequence[Mapping[str, Any]],
    *,
    tool_choice: dict[str, Any] | str | bool | None,
    parallel_tool_calls: bool | None,
) -> dict[str, Any]:
    """``tool_choice`` / ``parallel_tool_calls`` kwargs for binding the OpenAI tools ``formatted``,
    when given (``tool_choice=False`` leaves it unset)."""
    names = [t["function"]["name"] for t in formatted if "function" in t]
    kwargs: dict[str, Any] = {}
    if tool_choice is not None and tool_choice is not False:
        kwargs["tool_choice"] = openai_tool_choice(tool_choice, names)
    if parallel_tool_calls is not None:
        kwargs["parallel_tool_calls"] = parallel_tool_calls
    return kwargs


def json_parser(schema: dict[str, Any] | type | None, is_pydantic: bool) -> OutputParserLike[Any]:
    """Parse the message text as JSON: into the Pydantic class, or to a dict."""
    if is_pydantic:
        return PydanticOutputParser(pydantic_object=schema)  # type: ignore[arg-type,type-var]
    return JsonOutputParser()


def response_format_schema(schema: dict[str, Any] | type, strict: bool | None) -> dict[str, Any]:
    """The ``json_schema`` member of an OpenAI ``response_format`` for a JSON schema or TypedDict
    (``strict`` unset is sent as ``False``, as ``ChatOpenAI`` sends it)."""
    tool = convert_to_openai_tool(schema, strict=bool(strict))
    json_schema: dict[str, Any] = {"name": tool["function"]["name"], "schema": tool["function"]["parameters"]}
    if tool["function"].get("description"):
        json_schema["description"] = tool["function"]["description"]
    json_schema["strict"] = bool(strict)
    return json_schema


def pydantic_response_format(schema: type, strict: bool) -> dict[str, Any]:
    """The ``response_format`` of a Pydantic class as the OpenAI SDK (and so ``ChatOpenAI``) sends
    it: the strict form of its schema (closed objects, every property required), marked
    ``strict`` or not."""
    from llm_resilience_plugin._litellm import response_format_of

    response_format = response_format_of(schema)
    response_format["json_schema"]["strict"] = strict
    return response_format


def forced_tool_kwargs(schema: dict[str, Any] | type) -> dict[str, Any]:
    """``method="function_calling"``'s request: ``schema`` as the one tool, which must be called."""
    tool = convert_to_openai_tool(schema)
    choice = {"type": "function", "function": {"name": tool["function"]["name"]}}
    return {"tools": [tool], "tool_choice": choice, "parallel_tool_calls": False}


def json_schema_binding(
    schema: dict[str, Any] | type,
    strict: bool | None,
    *,
    is_pydantic: bool,
    strict_routes: Mapping[str, bool],
) -> dict[str, Any]:
    """What ``method="json_schema"`` binds. A JSON schema or TypedDict, or an explicit ``strict``,
    is sent as asked everywhere. A Pydantic class otherwise is asked as ``ChatOpenAI`` asks it,
    per reachable group (``strict_routes``: the model's own group first, and whether its models
    take strict output): a strict ``response_format`` where they do, else a forced tool call (as
    ``ChatOpenAI`` does for models without structured outputs); groups asked the other way than
    the model's own get theirs in ``kwargs_by_group``. A Pydantic v1 class is sent like a JSON
    schema (the SDK's strict form needs v2)."""
    if not (is_pydantic and isinstance(schema, type) and issubclass(schema, BaseModel)):  # not v2
        json_schema = response_format_schema(schema, strict)
        return {"response_format": {"type": "json_schema", "json_schema": json_schema}}
    assert isinstance(schema, type)
    if strict is not None or not strict_routes:
        return {"response_format": pydantic_response_format(schema, True if strict is None else strict)}
    strict_form: dict[str, Any] = {"response_format": pydantic_response_format(schema, True)}
    tool_form: dict[str, Any] = forced_tool_kwargs(schema)
    here = next(iter(strict_routes.values()))
    own, other = (strict_form, tool_form) if here else (tool_form, strict_form)
    # Keys of the group's own form the other form leaves unset (None: LiteLLM sends nothing).
    other = {**dict.fromkeys(own, None), **other}
    bound = dict(own)
    others = [g for g, takes in strict_routes.items() if takes != here]
    if others:
        bound["kwargs_by_group"] = {g: other for g in others}
    return bound


class ContentOrToolParser(BaseCumulativeTransformOutputParser[Any]):
    """Parses a reply that is either the schema's JSON text or a call of the schema's tool
    (a structured output asked per group in both ways); streams like the parser it picks."""

    content: Any
    """The parser of a JSON text reply."""
    tool: Any
    """The parser of a forced tool call."""

    def parse_result(self, result: list[Generation], *, partial: bool = False) -> Any:
        message = getattr(result[0], "message", None) if result else None
        called = message is not None and bool(
            getattr(message, "tool_calls", None) or getattr(message, "tool_call_chunks", None)
        )
        return (self.tool if called else self.content).parse_result(result, partial=partial)

    def parse(self, text: str) -> Any:
        return self.content.parse(text)


def tool_parser(schema: dict[str, Any] | type, is_pydantic: bool) -> OutputParserLike[Any]:
    """Parse the first call of ``schema``'s tool: into the Pydantic class, or to a dict."""
    if is_pydantic:
        return PydanticToolsParser(tools=[schema], first_tool_only=True)  # type: ignore[list-item]
    name = convert_to_openai_tool(schema)["function"]["name"]
    return JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)


def with_parser(
    llm: Runnable[LanguageModelInput, Any], parser: OutputParserLike[Any], *, include_raw: bool
) -> Runnable[LanguageModelInput, Any]:
    """``llm | parser``, or with ``include_raw`` a map ``{"raw", "parsed", "parsing_error"}``
    whose ``parsed`` is None (and ``parsing_error`` set) when parsing fails."""
    if not include_raw:
        return llm | parser
    parser_assign = RunnablePassthrough.assign(
        parsed=itemgetter("raw") | parser, parsing_error=lambda _: None
    )
    parser_none = RunnablePassthrough.assign(parsed=lambda _: None)
    parser_with_fallback = parser_assign.with_fallbacks([parser_none], exception_key="parsing_error")
    return RunnableMap(raw=llm) | parser_with_fallback


def structured_output(
    model: BaseChatModel,
    schema: dict[str, Any] | type | None,
    *,
    method: StructuredOutputMethod,
    include_raw: bool,
    strict: bool | None,
    strict_routes: Callable[[], Mapping[str, bool]] | None = None,
) -> Runnable[LanguageModelInput, dict[str, Any] | BaseModel]:
    """The ``with_structured_output`` chain of ``model``: a binding for ``method`` (carrying
    ``ls_structured_output_format``, which langchain-tests checks) piped into its parser.
    ``strict_routes``: which groups a call may reach take strict ``json_schema`` output (asked
    for ``json_schema`` only)."""
    is_pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
    ls_format: dict[str, Any] | None = (
        {"kwargs": {"method": method, "strict": strict}, "schema": schema} if schema is not None else None
    )
    parser: OutputParserLike[Any]
    llm: Runnable[LanguageModelInput, Any]
    if method == "function_calling":
        if schema is None:
            raise ValueError("method='function_calling' needs a schema")
        name = convert_to_openai_tool(schema, strict=strict)["function"]["name"]
        llm = model.bind_tools(
            [schema],
            tool_choice=name,
            strict=strict,
            parallel_tool_calls=False,
            ls_structured_output_format=ls_format,
        )
        parser = tool_parser(schema, is_pydantic)
    elif method == "json_schema":
        if schema is None:
            raise ValueError("method='json_schema' needs a schema")
        binding = json_schema_binding(
            schema, strict, is_pydantic=is_pydantic, strict_routes=strict_routes() if strict_routes else {}
        )
        llm = model.bind(**binding, ls_structured_output_format=ls_format)
        parser = json_parser(schema, is_pydantic)
        if "tools" in binding or "kwargs_by_group" in binding:  # some group is asked for a tool call
            parser = ContentOrToolParser(content=parser, tool=tool_parser(schema, is_pydantic))
    elif method == "json_mode":
        bind_kwargs: dict[str, Any] = {"response_format": {"type": "json_object"}}
        if ls_format is not None:
            bind_kwargs["ls_structured_output_format"] = ls_format
        llm = model.bind(**bind_kwargs)
        parser = json_parser(schema, is_pydantic)
    else:
        raise ValueError(
            f"unsupported method {method!r}: use 'json_schema', 'function_calling' or 'json_mode'"
        )
    return with_parser(llm, parser, include_raw=include_raw)
