"""One :class:`ResilientChatModel` call to its router, shared by the sync and async twins:
request preparation (parameters, stop, deadline), the router call with the run's event sink,
and the LangChain result or stream chunks with their response metadata."""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from langchain_core.outputs import ChatGenerationChunk, ChatResult

from llm_resilience_plugin.errors import StreamInterruptedError
from llm_resilience_plugin.events import CallReport, DeploymentInfo, StreamRestart, hidden_params_of
from llm_resilience_plugin.langchain._bridge import EventSink, config_deadline
from llm_resilience_plugin.langchain._construction import masked
from llm_resilience_plugin.langchain._convert import (
    StreamAssembler,
    generations_from_response,
    json_safe,
    to_openai_messages,
)
from llm_resilience_plugin.langchain._recovery import AnsweredAgain, take_answer
from llm_resilience_plugin.routing import (
    ResilientRouter,
    ResilientStream,
    StaticStream,
    SyncResilientStream,
    get_report,
)

# The RunnableConfig of the call in progress: BaseChatModel.invoke/stream do not hand
# `configurable` down to _generate/_stream, and the deadline may be there.
RUN_CONFIG: ContextVar[Mapping[str, Any] | None] = ContextVar("llm_resilience_run_config", default=None)

LC_ONLY_KWARGS = frozenset({"stream", "ls_structured_output_format", "run_manager"})
"""LangChain-level kwargs that never go to the provider."""


# The model whose invoke/ainvoke is running: the stream it opens is one LangChain aggregates; a break
# after content is recovered by answering the call again whole (see _recovery).
AGGREGATING: ContextVar[object | None] = ContextVar("llm_resilience_aggregating", default=None)


def claim_aggregation(model: object) -> bool:
    """Is this request the one ``model``'s own invoke makes (then no other request in the run is:
    a model called from a callback later is not aggregated, and must not be answered whole)?"""
    if AGGREGATING.get() is not model:
        return False
    AGGREGATING.set(None)
    return True


@contextlib.contextmanager
def run_config(config: Any, aggregating: object = None) -> Iterator[None]:
    """Make ``config`` the RunnableConfig of the call in progress (read by :func:`prepare_request`);
    ``aggregating``: the model whose invoke this is (it aggregates its own stream)."""
    token = RUN_CONFIG.set(config)
    agg = AGGREGATING.set(aggregating)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # reset from another context after a stream's handoff
            RUN_CONFIG.reset(token)
        with contextlib.suppress(ValueError):
            AGGREGATING.reset(agg)


class RequestDefaults(Protocol):
    """The model settings that shape every request (the fields of :class:`ResilientChatModel`)."""

    model: str
    temperature: float | None
    max_tokens: int | None
    top_p: float | None
    stop: list[str] | None
    timeout: float | None
    model_kwargs: dict[str, Any]


class PreparedRequest(NamedTuple):
    """One chat model call as the router gets it."""

    group: str
    params: dict[str, Any]
    deadline: float | None
    """The call's own deadline: per call ``deadline``, else ``timeout``, else the model's
    ``timeout`` (None: the router's tier or policy decides)."""
    deadline_cap: float | None
    """What the run's RunnableConfig has left (see ``config_deadline``): the call never
    outlives it, whatever its own deadline (the router applies ``call_budget``)."""


def prepare_request(
    defaults: RequestDefaults, stop: list[str] | None, kwargs: Mapping[str, Any]
) -> PreparedRequest:
    """The model group, provider parameters and deadline of one call: per-call kwargs over the
    model's settings; LangChain-only kwargs and empty tool lists dropped."""
    kwargs = dict(kwargs)
    group = kwargs.pop("model", None) or defaults.model
    deadline = kwargs.pop("deadline", None)
    timeout = kwargs.pop("timeout", None)
    for k in LC_ONLY_KWARGS:
        kwargs.pop(k, None)
    params: dict[str, Any] = {}
    if defaults.temperature is not None:
        params["temperature"] = defaults.temperature
    if defaults.max_tokens is not None:
        params["max_tokens"] = defaults.max_tokens
    if defaults.top_p is not None:
        params["top_p"] = defaults.top_p
    params.update(defaults.model_kwargs)
    stops = stop if stop is not None else defaults.stop
    if stops:
        params["stop"] = list(stops)
    params.update(kwargs)
    if params.get("tools") == []:
        params.pop("tools")
        params.pop("tool_choice", None)
    own = deadline or timeout or defaults.timeout
    return PreparedRequest(group, params, own, config_deadline(RUN_CONFIG.get()))


def chat_request(
    model: RequestDefaults,
    router: ResilientRouter,
    messages: Sequence[Any],
    stop: list[str] | None,
    kwargs: Mapping[str, Any],
    sink: EventSink,
) -> ChatRequest:
    """The router call of one chat model request (``messages`` as LangChain gives them)."""
    group, params, deadline, cap = prepare_request(model, stop, kwargs)
    aggregated = claim_aggregation(model)
    return ChatRequest(
        router, model.model, group, to_openai_messages(list(messages)), params, deadline, sink,
        deadline_cap=cap, aggregated=aggregated,
    )  # fmt: skip


def cache_key(
    defaults: RequestDefaults,
    model_list: Sequence[Mapping[str, Any]],
    stop: list[str] | None,
    kwargs: Mapping[str, Any],
) -> str:
    """LangChain's LLM cache key of a call: the model group, what its deployments are (secrets
    redacted) and every parameter sent (bound tools, response format, ...), not the deadline."""
    group, params, _, _ = prepare_request(defaults, stop, kwargs)
    params.pop("avoid_deployments", None)  # where a call goes, not what it asks
    deployments = [d.get("litellm_params") for d in model_list if d.get("model_name") == group]
    key = {"type": "llm-resilience-chat", "group": group, "deployments": deployments, "params": params}
    try:
        return json.dumps(masked(key), sort_keys=True, default=str)
    except TypeError:  # keys of mixed types cannot be sorted
        return json.dumps(masked(key), default=str)


@functools.lru_cache(maxsize=256)
def _provider(model: str, custom_provider: str | None) -> str:
    """LiteLLM's provider name of a deployment model (``openai`` for ``openai/gpt-4o-mini``)."""
    import litellm

    try:
        return str(litellm.get_llm_provider(model=model, custom_llm_provider=custom_provider)[1])
    except Exception:  # a model LiteLLM cannot place: name the prefix, if any
        return model.split("/", 1)[0] if "/" in model else "litellm"


def provider_of(info: DeploymentInfo | None) -> str:
    """The provider that served an answer (``litellm`` when no deployment is known)."""
    if info is None:
        return "litellm"
    custom = info.params.get("custom_llm_provider")
    return _provider(info.model, custom if isinstance(custom, str) else None)


def response_metadata(
    router: ResilientRouter,
    model: str,
    report: CallReport | None,
    served_model: str | None,
    cost: float | None,
) -> dict[str, Any]:
    """``response_metadata`` of an answer: the model that served it (``model`` as the last
    resort), its group and deployment id, the cost and the call report."""
    group = report.served_group if report else None
    dep = report.deployment_id if report else None
    info = next((d for d in router.deployments() if d.id == dep), None) if dep is not None else None
    name = served_model or (info.model if info is not None else None)
    md: dict[str, Any] = {
        "model_name": name or group or model,
        "model_provider": provider_of(info),
        "model_group": group,
        "model_id": dep,
    }
    if cost is not None:
        md["response_cost"] = cost
    if report is not None:
        rd = report.to_dict()
        if rd.get("response_cost") is None and cost is not None:
            rd["response_cost"] = cost  # streamed answers: the cost comes with the usage chunk
        md["resilience"] = json_safe(rd)
    return md


def _after_marker(asm: StreamAssembler, item: Any, stream: Any, request: ChatRequest) -> StreamAssembler:
    """Chunks already handed to LangChain cannot be taken back: a restart marker after content
    ends the stream as interrupted (its text would be spliced onto the new answer); before any
    content it starts a fresh assembly; a continuation keeps what was sent. An ``"answer"``
    marker (a stream ``invoke`` aggregates, answered again whole) ends the streamed run with
    :class:`AnsweredAgain`, which ``invoke`` turns into its result."""
    if not isinstance(item, StreamRestart) or item.mode in ("continue", "resume"):
        return asm
    if item.mode == "answer":
        raise AnsweredAgain(item, getattr(stream, "report", None), request.identity())
    if item.discarded_text:
        raise StreamInterruptedError(
            "the stream restarted on another route after content was sent; the chat model cannot"
            " take chunks back (invoke/ainvoke recover by asking again without streaming)",
            item.discarded_text,
            ConnectionError("stream restarted"),
            getattr(stream, "report", None),
        )
    return StreamAssembler()


@dataclass
class ChatRequest:
    """One call of a chat model to its router: what to send, and the LangChain run's event sink."""

    router: ResilientRouter
    model: str
    """The chat model's own group (named in the metadata when nothing better is known)."""
    group: str
    messages: list[dict[str, Any]]
    params: dict[str, Any]
    deadline: float | None
    sink: EventSink
    deadline_cap: float | None = None
    """What the run's config has left (the router caps the call's deadline with it)."""
    aggregated: bool = False
    """The request of an ``invoke`` whose stream LangChain aggregates (see :func:`claim_aggregation`)."""

    def params_for(self, stream: bool) -> dict[str, Any]:
        """The request's parameters; a stream asks for its usage chunk (usage_metadata needs it)."""
        params = (
            self.params if self.deadline_cap is None else {**self.params, "deadline_cap": self.deadline_cap}
        )
        if not stream:
            return params
        options = {**(params.get("stream_options") or {}), "include_usage": True}
        if self.aggregated:  # a break after content: the call is answered again whole
            # True (the caller wants recovery) means the way an aggregated stream can take it.
            recover = params.get("recover_streams", "answer")
            return {
                **params,
                "recover_streams": "answer" if recover is True else recover,
                "stream_options": options,
            }
        recover = params.get("recover_streams")
        if recover is True or recover == "restart" or (recover is None and self._marks_restarts()):
            # LangChain cannot take back a chunk: recovery on means seamless (no marker)
            return {**params, "recover_streams": "seamless", "stream_options": options}
        return {**params, "stream_options": options}

    def _marks_restarts(self) -> bool:
        """Would the group's policy recover a broken stream with the marker protocol?"""
        policy_of = getattr(self.router, "effective_policy", None)  # None: a request built bare
        if policy_of is None:
            return False
        pol = policy_of(self.group)
        return bool(pol.restart_broken_streams or pol.continue_streams_with_prefill)

    def identity(self) -> tuple[Any, ...]:
        """What makes two requests the same: the group, the messages and the parameters."""
        return (self.group, self.messages, self.params)

    def send(self, *, stream: bool) -> Any:
        """Call the router from a sync run: a response, or a :class:`SyncResilientStream`."""
        # The router runs its async attempt loop on a private thread shared by every sync call:
        # no sync callback runs there. Events are buffered and delivered on this thread (or, with
        # on_retry, on a worker thread while the retry waits; see _bridge).
        answer = None if stream else take_answer(self.router, self.identity())
        if answer is not None:  # the rest of a broken stream's call, already answered
            return answer
        try:
            with self.sink.scope():
                return self.router.completion(
                    self.group, self.messages, stream=stream, deadline=self.deadline,
                    listener=self.sink.on_event, before_retry=self.sink.before_retry_offloop,
                    **self.params_for(stream),
                )  # fmt: skip
        finally:
            self.sink.flush()

    async def asend(self, *, stream: bool) -> Any:
        """Call the router from an async run: a response, or a :class:`ResilientStream`."""
        answer = None if stream else take_answer(self.router, self.identity())
        if answer is not None:
            return answer
        try:
            with self.sink.scope():
                return await self.router.acompletion(
                    self.group, self.messages, stream=stream, deadline=self.deadline,
                    listener=self.sink.on_event, before_retry=self.sink.before_retry_async,
                    **self.params_for(stream),
                )  # fmt: skip
        finally:
            await self.sink.aflush()

    def result(self, resp: Any) -> ChatResult:
        """The ``ChatResult`` of a whole response, with metadata and token usage."""
        report = get_report(resp)
        hidden = hidden_params_of(resp) or {}
        cost = hidden.get("response_cost")
        cost = float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else None
        md = response_metadata(self.router, self.model, report, getattr(resp, "model", None), cost)
        gens, usage = generations_from_response(resp, md)
        llm_output: dict[str, Any] = {
            "model_name": md["model_name"],
            "model_group": md["model_group"],
            "model_id": md["model_id"],
        }
        if usage is not None:
            llm_output["token_usage"] = dict(usage)
        return ChatResult(generations=gens, llm_output=llm_output)

    def final_chunk(self, asm: StreamAssembler, report: CallReport | None) -> ChatGenerationChunk:
        """The closing chunk of a stream: finish reason, usage and the response metadata."""
        served = (report.served_model if report else None) or asm.model
        return asm.final_chunk(response_metadata(self.router, self.model, report, served, asm.response_cost))

    def relay(self, stream: SyncResilientStream) -> Iterator[ChatGenerationChunk]:
        """Chunks of a sync stream, then the closing chunk; the stream is closed if left early."""
        relayed = _Relayed(self, stream)
        it = iter(stream)
        finished = False
        try:
            while True:
                with self.sink.scope():
                    try:
                        chunk = next(it)
                    except StopIteration:
                        break
                    finally:
                        self.sink.flush()
                gen = relayed.feed(chunk)
                if gen is not None:
                    yield gen
            finished = True
        finally:
            # At interpreter exit the router's loop is gone: closing would restart it (and hang).
            if not finished and not sys.is_finalizing():
                with contextlib.suppress(Exception):  # the stream already failed; keep the original error
                    stream.close()
        yield relayed.closing()

    async def arelay(
        self, stream: ResilientStream | StaticStream
    ) -> AsyncGenerator[ChatGenerationChunk, None]:
        """Async twin of :meth:`relay`; router events are delivered as the chunks arrive."""
        relayed = _Relayed(self, stream)
        it = stream.__aiter__()
        finished = False
        try:
            while True:
                with self.sink.scope():
                    try:
                        chunk = await it.__anext__()
                    except StopAsyncIteration:
                        break
                gen = relayed.feed(chunk)
                if gen is not None:
                    yield gen
            finished = True
        finally:
            if not finished:
                with contextlib.suppress(Exception):
                    await stream.aclose()
            await self.sink.aflush()
        yield relayed.closing()


class _Relayed:
    """What :meth:`ChatRequest.relay` and its async twin share: the router's items in, LangChain
    chunks out (markers handled by :func:`_after_marker`), and the closing chunk."""

    def __init__(self, request: ChatRequest, stream: Any) -> None:
        self.request = request
        self.stream = stream
        self.asm = StreamAssembler()

    def feed(self, item: Any) -> ChatGenerationChunk | None:
        """The LangChain chunk for one router item, if it makes one."""
        self.asm = _after_marker(self.asm, item, self.stream, self.request)
        if isinstance(item, StreamRestart):
            return None
        return self.asm.feed(item)

    def closing(self) -> ChatGenerationChunk:
        """The closing chunk: finish reason, usage and the response metadata."""
        return self.request.final_chunk(self.asm, self.stream.report)
