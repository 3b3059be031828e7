"""ResilientChatModel: a LangChain chat model backed by a :class:`ResilientRouter` model group.

Every LangChain entry point (``invoke``, ``ainvoke``, ``batch``, ``stream``, ``astream``,
``astream_events``, LangGraph) goes through the router, so retries, breakers, fallbacks and the
deadline apply on both the generate and the stream paths; ``with_retry`` is never needed.
The class keeps what LangChain calls; request building, results and streams live in
``_requests``, tools and structured output in ``_tools``, router-spec building in ``_construction``.
"""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams
from langchain_core.language_models.base import LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import AliasChoices, BaseModel, Field, PrivateAttr, SecretStr, field_serializer, field_validator

from llm_resilience_plugin.errors import ConfigError, UnknownModelGroupError
from llm_resilience_plugin.langchain._bridge import AnyRunManager, EventSink, bridge_router, find_run_manager
from llm_resilience_plugin.langchain._capabilities import GroupCapabilities, GroupMap
from llm_resilience_plugin.langchain._construction import (
    RouterLease,
    build_router_spec,
    has_literal_secret,
    lease_router,
    masked,
)
from llm_resilience_plugin.langchain._convert import json_safe
from llm_resilience_plugin.langchain._lifecycle import ClosesRouter
from llm_resilience_plugin.langchain._recovery import AnsweredAgain, handed_over, new_run
from llm_resilience_plugin.langchain._requests import ChatRequest, cache_key, chat_request, run_config
from llm_resilience_plugin.langchain._tools import (
    StructuredOutputMethod,
    ToolLike,
    structured_output,
    tool_choice_kwargs,
)
from llm_resilience_plugin.policy import ResiliencePolicy, RouterSpec
from llm_resilience_plugin.routing import ResilientRouter

CONFIG_ENV = "LLM_RESILIENCE_CONFIG"
API_KEY_ENV = "LLM_RESILIENCE_API_KEY"


class ResilientChatModel(ClosesRouter, GroupCapabilities, BaseChatModel):
    """A LangChain chat model over one model group of a :class:`ResilientRouter`.

    Build it from an existing router, a LiteLLM config (YAML path or parsed mapping, with an
    optional ``resilience:`` section) or a ``model_list``::

        llm = ResilientChatModel(router=router, model="primary")
        llm = ResilientChatModel.from_config("router.yaml", model="primary")
        llm = ResilientChatModel(model_list=[...], model="primary", fallbacks=[{"primary": ["backup"]}])

    With none of these, the config path is read from ``$LLM_RESILIENCE_CONFIG``. An unknown
    model group raises :class:`UnknownModelGroupError` at construction.

    Standard parameters: ``temperature``, ``max_tokens``, ``top_p``, ``stop`` and
    ``model_kwargs`` are sent with every request (per-call kwargs override them, and a per-call
    ``model=`` selects another model group). ``timeout`` is the call's total deadline in seconds
    (every attempt, backoff sleep and fallback fits inside it; per-attempt timeouts come from the
    policy). ``max_retries`` sets the retry count of every retried error class in a router this
    model builds; with ``router=`` the router's policy governs and ``max_retries`` is ignored
    with a warning. ``api_key`` fills deployments that carry no key of their own (routers built
    here only).

    Response metadata: ``model_name`` (the model that answered, after any fallback),
    ``model_group``, ``model_id`` (the deployment id), ``finish_reason``, ``response_cost`` and
    ``resilience`` (the call report: every attempt, retries, fallbacks, latency).
    """

    model: str = Field(validation_alias=AliasChoices("model", "model_name"))
    """The model group to call (a ``model_name`` of the router's ``model_list``)."""

    router: ResilientRouter | None = Field(default=None, exclude=True, repr=False)
    """An existing router to use (shared breakers, budgets and events)."""
    config: str | dict[str, Any] | None = Field(default=None, repr=False)
    """A LiteLLM proxy-style config: a YAML path, or its parsed mapping."""
    model_list: list[dict[str, Any]] | None = Field(default=None, repr=False)
    """A LiteLLM ``model_list`` to build a router from."""
    policy: dict[str, Any] | None = None
    """The resilience policy (a :class:`ResiliencePolicy` or its mapping) for a router built
    from ``model_list``."""
    fallbacks: list[dict[str, Any]] | dict[str, Any] | None = None
    """Fallback groups for a router built from ``model_list`` (LiteLLM's format)."""
    router_settings: dict[str, Any] | None = None
    """Other LiteLLM Router settings for a router built from ``model_list``."""
    router_options: dict[str, Any] = Field(default_factory=dict, exclude=True, repr=False)
    """Extra :class:`ResilientRouter` arguments (``clock``, ``seed``, ``guards``) for a router
    built here."""

    temperature: float | None = None
    max_tokens: int | None = Field(
        default=None, validation_alias=AliasChoices("max_tokens", "max_completion_tokens")
    )
    top_p: float | None = None
    stop: list[str] | None = Field(default=None, validation_alias=AliasChoices("stop", "stop_sequences"))
    timeout: float | None = Field(default=None, validation_alias=AliasChoices("timeout", "request_timeout"))
    """Total deadline per call, in seconds (the policy's ``deadline`` when unset)."""
    max_retries: int | None = Field(default=None, ge=0, le=20)
    """Retries per retried error class, for routers built by this model."""
    api_key: SecretStr | None = Field(default=None, repr=False)
    """Key for deployments without their own ``api_key`` (routers built by this model)."""
    streaming: bool = False
    """Stream from the provider even for ``invoke`` (LangChain convention)."""
    model_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra request parameters for every call (e.g. ``seed``, ``user``)."""
    emit_events: bool = True
    """Dispatch ``llm_resilience.*`` custom events (attempt, retry, fallback, breaker)."""

    _spec: RouterSpec | None = PrivateAttr(default=None)
    _lease: RouterLease | None = PrivateAttr(default=None)

    # -- construction ----------------------------------------------------------------------------

    @field_validator("config", mode="before")
    @classmethod
    def _path_to_str(cls, value: Any) -> Any:
        """A config path may be given as a ``Path``."""
        return str(value) if isinstance(value, Path) else value

    @field_validator("policy", mode="before")
    @classmethod
    def _policy_mapping(cls, value: Any) -> Any:
        """A :class:`ResiliencePolicy` is kept as its JSON mapping (serializable)."""
        if isinstance(value, ResiliencePolicy):
            return value.model_dump(mode="json")
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, value: Any) -> Any:
        """A single stop string is a one-item list."""
        return [value] if isinstance(value, str) else value

    @field_serializer("config", "model_list", "policy", "fallbacks", "router_settings", "model_kwargs")
    def _masked(self, value: Any) -> Any:
        """Dumps never show a literal credential or URL credentials (they stay usable inside)."""
        return masked(value)

    def __repr_args__(self) -> Any:
        """``repr``/``str`` (and LangChain's "not implemented" serialization) with credentials masked."""
        return [(k, masked(v)) for k, v in super().__repr_args__()]

    def __init__(self, **data: Any) -> None:
        """Validate the fields, then check the router source and the model group."""
        super().__init__(**data)
        self._setup()

    def _setup(self) -> None:
        """Exactly one router source (``$LLM_RESILIENCE_CONFIG`` by default); the group must exist."""
        sources = [n for n in ("router", "model_list", "config") if getattr(self, n) is not None]
        if len(sources) > 1:
            raise ConfigError(", ".join(sources), "give one of router, model_list or config, not several")
        if not sources:
            env = os.environ.get(CONFIG_ENV)
            if not env:
                raise ConfigError(
                    "router",
                    f"give router=, model_list= or config= (or set ${CONFIG_ENV} to a config path)",
                )
            self.config = env
        if self.router is not None:
            for name in ("policy", "fallbacks", "router_settings", "api_key"):
                if getattr(self, name) is not None:
                    raise ConfigError(name, "applies only when ResilientChatModel builds the router")
            if self.max_retries is not None:
                warnings.warn(
                    "ResilientChatModel(max_retries=...) is ignored with router=: the router's "
                    "policy sets the retry counts",
                    stacklevel=3,
                )
            groups = self.router.model_groups
        else:
            self._spec = build_router_spec(
                model_list=self.model_list, config=self.config, policy=self.policy, fallbacks=self.fallbacks,
                router_settings=self.router_settings, api_key=self.api_key, max_retries=self.max_retries,
            )  # fmt: skip
            groups = self._spec.groups
        if self.model not in groups:
            raise UnknownModelGroupError(self.model, groups)
        if self._spec is not None:  # held from construction: configured copies share the router
            self._hold_router()
        if self.profile is None:  # LangChain's profile: the smallest across the group's routes
            self.profile = self._capability_map().profile()

    @classmethod
    def from_config(
        cls, config: str | Path | Mapping[str, Any], *, model: str, **kwargs: Any
    ) -> ResilientChatModel:
        """One line from a LiteLLM proxy-style YAML (or its parsed mapping)."""
        cfg = str(config) if isinstance(config, Path) else config
        return cls(config=dict(cfg) if isinstance(cfg, Mapping) else cfg, model=model, **kwargs)

    @classmethod
    def from_router(cls, router: ResilientRouter, *, model: str, **kwargs: Any) -> ResilientChatModel:
        """A model over ``model`` of an existing router (shared breakers, budgets and events)."""
        return cls(router=router, model=model, **kwargs)

    def _hold_router(self) -> RouterLease:
        """This model's hold on the router of its configuration, released when it is collected."""
        assert self._spec is not None
        lease = self._lease = lease_router(self._spec, self.router_options)
        weakref.finalize(self, lease.release)
        return lease

    def get_router(self) -> ResilientRouter:
        """The router this model calls: ``router=``, or the one shared by every model built with
        the same configuration (built on first use, closed with its last model)."""
        if self.router is not None:
            return self.router
        lease = self._lease
        if lease is None or lease.released:
            lease = self._hold_router()
        return lease.router()

    def close(self) -> None:
        """Release the router this model built (closed with its last model; ``router=`` is left
        alone). Also ``with model:``, ``async with model:`` and ``await model.aclose()``."""
        if self._lease is not None:
            self._lease.release()

    # -- LangChain identity ----------------------------------------------------------------------

    @property
    def _llm_type(self) -> str:
        """LangChain's name for this kind of model."""
        return "llm-resilience-chat"

    @classmethod
    def is_lc_serializable(cls) -> bool:
        """Serializable with LangChain's ``dumps`` (see :meth:`to_json` for the exceptions)."""
        return True

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        """The importable path LangChain's ``load`` resolves (the public subpackage)."""
        return ["llm_resilience_plugin", "langchain"]

    @property
    def lc_secrets(self) -> dict[str, str]:
        """``api_key`` serializes as a reference to ``$LLM_RESILIENCE_API_KEY``."""
        return {"api_key": API_KEY_ENV}

    def to_json(self) -> Any:
        """LangChain's serialized form, or "not implemented" when it cannot round-trip safely."""
        # A router object (or clocks and guards) cannot be serialized, and a model_list or config
        # mapping holding a literal key must not be: those serialize as "not implemented". A config
        # path, or a mapping whose keys are LiteLLM ``os.environ/NAME`` references, round-trips.
        if (
            self.router is not None
            or self.router_options
            or has_literal_secret(self.model_list)
            or has_literal_secret(self.config)
        ):
            return self.to_json_not_implemented()
        return super().to_json()

    def _get_llm_string(self, stop: list[str] | None = None, **kwargs: Any) -> str:
        """The LLM cache key: group, deployments and every request parameter, no secret."""
        spec = self.router.spec if self.router is not None else self._spec
        return cache_key(self, spec.model_list if spec else [], stop, kwargs)

    @property
    def _identifying_params(self) -> dict[str, Any]:
        """The settings that identify this model in traces."""
        return {
            "model": self.model,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "top_p": self.top_p,
            "timeout": self.timeout,
            "max_retries": self.max_retries,
            "model_kwargs": masked(json_safe(self.model_kwargs)),
        }

    def _get_invocation_params(self, stop: list[str] | None = None, **kwargs: Any) -> dict[str, Any]:
        """What traces and callbacks see of a call's parameters: a bound ``api_key`` masked."""
        return masked(super()._get_invocation_params(stop=stop, **kwargs))  # type: ignore[no-any-return]

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        """LangSmith's standard parameters of a call."""
        params = LangSmithParams(
            ls_provider="litellm",
            ls_model_name=kwargs.get("model") or self.model,
            ls_model_type="chat",
        )
        temperature = kwargs.get("temperature", self.temperature)
        if isinstance(temperature, int | float):
            params["ls_temperature"] = float(temperature)
        max_tokens = kwargs.get("max_tokens", self.max_tokens)
        if isinstance(max_tokens, int):
            params["ls_max_tokens"] = max_tokens
        ls_stop = stop if stop is not None else self.stop
        if ls_stop is not None:
            params["ls_stop"] = list(ls_stop)
        return params

    def _capability_map(self) -> GroupMap:
        """The deployments of the group and of every group its calls may fall back to."""
        if self.router is not None:
            return GroupMap.of(self.router.spec, self.model, self.router.deployments(self.model))
        return GroupMap.of(self._spec, self.model)

    # -- tools and structured output -------------------------------------------------------------

    def bind_tools(
        self,
        tools: Sequence[ToolLike],
        *,
        tool_choice: dict[str, Any] | str | bool | None = None,
        strict: bool | None = None,
        parallel_tool_calls: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools in OpenAI format. ``tool_choice``: ``"auto"``, ``"none"``, ``"required"``
        (also ``"any"`` or ``True``), a tool name, or an OpenAI tool-choice dict."""
        formatted = [convert_to_openai_tool(t, strict=strict) for t in tools]
        kwargs.update(
            tool_choice_kwargs(formatted, tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls)
        )
        return super().bind(tools=formatted, **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type | None = None,
        *,
        method: StructuredOutputMethod = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | BaseModel]:
        """Structured output by ``json_schema`` (default: ``response_format`` with the schema),
        ``function_calling`` (a forced tool call) or ``json_mode`` (``json_object``).

        Pydantic classes parse to instances; TypedDicts and JSON schemas parse to dicts.
        ``include_raw=True`` returns ``{"raw", "parsed", "parsing_error"}``. A Pydantic class is
        asked strictly per fallback group where supported (``GroupCapabilities``).
        """
        if kwargs:
            raise ValueError(f"Received unsupported arguments {kwargs}")
        routes = self._capability_map().strict_routes
        return structured_output(
            self, schema, method=method, include_raw=include_raw, strict=strict, strict_routes=routes
        )

    # -- the run's config (for a deadline carried in `configurable` / metadata) -----------------

    def invoke(self, input: LanguageModelInput, config: Any = None, **kwargs: Any) -> AIMessage:
        """``BaseChatModel.invoke``, with ``config`` visible to the request (its deadline). A
        stream broken after content (LangChain streaming internally) is answered again whole
        inside the same call, and that answer is the result (see ``_recovery``)."""
        with run_config(config, aggregating=self):
            try:
                return super().invoke(input, config, **kwargs)
            except AnsweredAgain as again:
                with handed_over(again, self.get_router()):
                    return super().invoke(input, new_run(config), **{**kwargs, "stream": False})

    async def ainvoke(self, input: LanguageModelInput, config: Any = None, **kwargs: Any) -> AIMessage:
        """``BaseChatModel.ainvoke``; a broken internal stream is recovered as in :meth:`invoke`."""
        with run_config(config, aggregating=self):
            try:
                return await super().ainvoke(input, config, **kwargs)
            except AnsweredAgain as again:
                with handed_over(again, self.get_router()):
                    return await super().ainvoke(input, new_run(config), **{**kwargs, "stream": False})

    def stream(self, input: LanguageModelInput, config: Any = None, **kwargs: Any) -> Iterator[Any]:
        """``BaseChatModel.stream``, with ``config`` visible to the request (its deadline)."""
        with run_config(config):
            yield from super().stream(input, config, **kwargs)

    async def astream(
        self, input: LanguageModelInput, config: Any = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """``BaseChatModel.astream``, with ``config`` visible to the request (its deadline)."""
        with run_config(config):
            async for chunk in super().astream(input, config, **kwargs):
                yield chunk

    # -- generate and stream: thin sync/async twins over one request builder ---------------------

    def _request(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        run_manager: AnyRunManager | None,
        kwargs: dict[str, Any],
    ) -> ChatRequest:
        """The router call for these messages and kwargs, delivering its events to ``run_manager``."""
        router = self.get_router()
        bridge_router(router)
        return chat_request(
            self, router, messages, stop, kwargs, EventSink(run_manager, enabled=self.emit_events)
        )

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        """One answer through the router (sync)."""
        request = self._request(messages, stop, run_manager, kwargs)
        return request.result(request.send(stream=False))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        """One streamed answer through the router (sync)."""
        run_manager = find_run_manager(run_manager)  # first line: it reads the caller's frame
        request = self._request(messages, stop, run_manager, kwargs)
        yield from request.relay(request.send(stream=True))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        """One answer through the router (async)."""
        request = self._request(messages, stop, run_manager, kwargs)
        return request.result(await request.asend(stream=False))

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        """One streamed answer through the router (async)."""
        run_manager = find_run_manager(run_manager)  # first line: it reads the caller's frame
        request = self._request(messages, stop, run_manager, kwargs)
        async with contextlib.aclosing(request.arelay(await request.asend(stream=True))) as chunks:
            async for chunk in chunks:
                yield chunk
