"""The rest of LiteLLM's Router on the same engine: embeddings, text completions, image generations
and the Responses API, each a ``ResilientRouter`` method with LiteLLM's signature and return type.

Each call is checked before anything is sent (its payload, the model groups' ``model_info.mode``,
an embedding's vector dimensions across the groups it may fall back to), then walks the routes
exactly as a chat call does: the operation (``CallState.operation``) only tells the dispatcher
which of the Router's functions makes the attempt. An embedding batch longer than a deployment's
``model_info.max_embedding_batch_size`` is split into calls of at most that size, sent a few at
a time (``_batches``), each retried whole, and joined in order; any batch that finally fails fails
the whole call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import litellm

from llm_resilience_plugin import _litellm
from llm_resilience_plugin._engine.core import BeforeRetry, positive_seconds
from llm_resilience_plugin._engine.dispatch import PAYLOAD_KEYS, STREAMING_OPERATIONS
from llm_resilience_plugin.errors import ConfigError, ErrorClass
from llm_resilience_plugin.events import REPORT_KEY, CallReport, Listener, attach_report, hidden_params_of
from llm_resilience_plugin.routing._batches import batch_concurrency, run_batches
from llm_resilience_plugin.routing._operations_audio import AUDIO_MODES
from llm_resilience_plugin.routing._streams import SyncResilientStream

if TYPE_CHECKING:
    from llm_resilience_plugin.routing._calls import CallRunner

__all__ = ["MODES", "EndpointsMixin", "embedding_batch_limit", "embedding_dimension"]

# The ``model_info.mode`` values that can serve each operation (a deployment without a mode may
# serve any; LiteLLM's own names, as in its price map).
MODES: dict[str, frozenset[str]] = {
    "embedding": frozenset({"embedding"}),
    "text_completion": frozenset({"completion", "chat"}),
    "image_generation": frozenset({"image_generation"}),
    "responses": frozenset({"responses", "chat"}),
    **AUDIO_MODES,  # transcription, speech, moderation, rerank (``_operations_audio``)
}


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def embedding_dimension(params: Mapping[str, Any], dimensions: Any = None) -> int | None:
    """The length of a deployment's vectors: the call's ``dimensions``, else its
    ``model_info.output_vector_size``, else LiteLLM's price map for its model; None if unknown."""
    asked = _whole(dimensions)
    if asked is not None:
        return asked
    size = _whole(params.get("output_vector_size"))
    if size is not None:
        return size
    model = params.get("model")
    if not isinstance(model, str):
        return None
    for name in (model, model.split("/", 1)[-1]):
        info = litellm.model_cost.get(name)
        if isinstance(info, Mapping) and _whole(info.get("output_vector_size")) is not None:
            return int(info["output_vector_size"])
    return None


def embedding_batch_limit(params: Mapping[str, Any]) -> int | None:
    """How many inputs one request to a deployment may carry (``model_info.max_embedding_batch_size``,
    LiteLLM's own field), or None for no limit."""
    return _whole(params.get("max_embedding_batch_size"))


def _check_text(where: str, value: Any) -> None:
    if isinstance(value, bytes | bytearray):
        raise ConfigError(where, "is bytes; pass text (str), e.g. value.decode('utf-8')")
    if not isinstance(value, str):
        raise ConfigError(where, f"expected text, got {type(value).__name__}")
    if not value:
        raise ConfigError(where, "is an empty string; providers refuse empty inputs")
    if value.isascii():  # no surrogate possible: skip the encoding copy (most inputs)
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConfigError(
            where, f"is not valid UTF-8 text (a lone surrogate at position {e.start})"
        ) from None


def _check_texts(name: str, value: Any) -> None:
    """A string, or a non-empty list of strings (or of token ids, or of token-id lists)."""
    if isinstance(value, str):
        _check_text(name, value)
        return
    if not isinstance(value, list) or not value:
        raise ConfigError(name, "expected a string or a non-empty list of strings")
    if all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        return  # one input as token ids
    for i, item in enumerate(value):
        if isinstance(item, list) and item and all(isinstance(x, int) for x in item):
            continue
        _check_text(f"{name}[{i}]", item)


def validate_payload(operation: str, payload: Any, kwargs: Mapping[str, Any]) -> None:
    """Refuse a payload LiteLLM could not send, before any attempt (a ConfigError naming it)."""
    key = PAYLOAD_KEYS[operation]
    if operation in ("embedding", "text_completion"):
        _check_texts(key, payload)
    elif operation == "image_generation":
        _check_text(key, payload)
        n = kwargs.get("n")
        if n is not None and _whole(n) is None:
            raise ConfigError("n", f"expected a whole number of images >= 1, got {n!r}")
    elif operation == "responses":
        if isinstance(payload, str):
            _check_text(key, payload)
        elif not isinstance(payload, list) or not payload:
            raise ConfigError(key, "expected a string or a non-empty list of input items")
        else:
            for i, item in enumerate(payload):
                if not isinstance(item, Mapping):
                    raise ConfigError(
                        f"{key}[{i}]", "expected an input item mapping, e.g. {'role': 'user', ...}"
                    )
    dims = kwargs.get("dimensions")
    if dims is not None and _whole(dims) is None:
        raise ConfigError("dimensions", f"expected a whole number >= 1, got {dims!r}")
    if kwargs.get("scenario") is not None:
        raise ConfigError("scenario", f"static answers are chat replies; {operation} has none")


class EndpointsMixin:
    """``embedding``/``aembedding``, ``text_completion``/``atext_completion``,
    ``image_generation``/``aimage_generation`` and ``responses``/``aresponses`` of
    :class:`~llm_resilience_plugin.routing.ResilientRouter` (see the module docs)."""

    # All the mixin needs from its host: the CallRunner that opens and runs the router's calls.
    calls: CallRunner

    # -- embeddings -------------------------------------------------------------------------------

    async def aembedding(
        self,
        model: str,
        input: str | list[Any],
        *,
        deadline: float | None = None,
        listener: Listener | None = None,
        before_retry: BeforeRetry | None = None,
        vectors_compatible: bool = False,
        batch_concurrency: int | None = None,
        **kwargs: Any,
    ) -> litellm.EmbeddingResponse:
        """Like ``litellm.Router.aembedding``; returns LiteLLM's ``EmbeddingResponse``.

        A batch longer than the smallest ``model_info.max_embedding_batch_size`` among the groups
        the call may use is split, its parts sent ``batch_concurrency`` at a time (default: the
        policy's ``embedding_batch_concurrency``) and joined in order. Fallback to a group whose vectors have
        another dimension is refused unless ``vectors_compatible=True`` (mixing vector spaces
        corrupts an index). Plugin options as for ``acompletion``.
        """
        self.calls.check_group(model)
        validate_payload("embedding", input, kwargs)
        self._check_modes("embedding", model)
        if not isinstance(vectors_compatible, bool):
            raise ConfigError("vectors_compatible", "must be True or False")
        if batch_concurrency is not None and _whole(batch_concurrency) is None:
            raise ConfigError(
                "batch_concurrency", f"expected a whole number of batches >= 1, got {batch_concurrency!r}"
            )
        if not vectors_compatible:
            self._check_dimensions(model, kwargs.get("dimensions"))
        limit = self._batch_limit(model)
        if limit is None or not isinstance(input, list) or len(input) <= limit or _is_tokens(input):
            return await self._operation(
                "embedding", model, input, False, deadline, listener, before_retry, kwargs
            )  # type: ignore[no-any-return]
        return await self._split_embedding(
            model, input, limit, deadline, listener, before_retry, kwargs, batch_concurrency
        )

    def embedding(self, model: str, input: str | list[Any], **kwargs: Any) -> litellm.EmbeddingResponse:
        """Blocking twin of :meth:`aembedding` (runs on the router's private loop thread)."""
        return self.calls.run_sync(self.aembedding(model, input, **kwargs))

    async def _split_embedding(
        self,
        model: str,
        inputs: list[Any],
        limit: int,
        deadline: float | None,
        listener: Listener | None,
        before_retry: BeforeRetry | None,
        kwargs: Mapping[str, Any],
        concurrency: int | None = None,
    ) -> litellm.EmbeddingResponse:
        """One call per batch of at most ``limit`` inputs, at most ``concurrency`` (else the
        policy's ``embedding_batch_concurrency``) in flight, under one deadline; the joined
        response carries a report of all of them (any batch failing fails the whole)."""
        starts = range(0, len(inputs), limit)
        whole = self.calls.budget(model, deadline, kwargs)  # one deadline (and cap) for all batches
        each = {k: v for k, v in kwargs.items() if k != "deadline_cap"}
        key = each.get("idempotency_key")

        def start(i: int, left: float | None) -> Any:
            # A caller's idempotency key names the whole call: each batch keys its own part of it
            # (one key for all would replay the first batch's vectors for every batch).
            batch = each if key is None else {**each, "idempotency_key": f"{key}#batch-{i}-of-{len(starts)}"}
            return self._operation(
                "embedding",
                model,
                inputs[starts[i] : starts[i] + limit],
                False,
                left,
                listener,
                before_retry,
                batch,
            )

        bound = self._batch_concurrency(model, concurrency)
        parts = await run_batches(len(starts), bound, start, self.calls.engine.clock, whole)
        return _join_embeddings(parts)

    # -- the other operations ---------------------------------------------------------------------

    async def atext_completion(
        self,
        model: str,
        prompt: str | list[Any],
        *,
        stream: bool = False,
        deadline: float | None = None,
        listener: Listener | None = None,
        before_retry: BeforeRetry | None = None,
        **kwargs: Any,
    ) -> Any:
        """Like ``litellm.Router.atext_completion``: a ``TextCompletionResponse``, or with
        ``stream=True`` a :class:`ResilientStream` of text-completion chunks."""
        return await self._checked(
            "text_completion", model, prompt, stream, deadline, listener, before_retry, kwargs
        )

    def text_completion(
        self, model: str, prompt: str | list[Any], *, stream: bool = False, **kwargs: Any
    ) -> Any:
        """Blocking twin of :meth:`atext_completion` (a stream is a blocking iterator)."""
        return self._blocking(self.atext_completion(model, prompt, stream=stream, **kwargs), stream)

    async def aimage_generation(
        self,
        model: str,
        prompt: str,
        *,
        deadline: float | None = None,
        listener: Listener | None = None,
        before_retry: BeforeRetry | None = None,
        **kwargs: Any,
    ) -> litellm.ImageResponse:
        """Like ``litellm.Router.aimage_generation``; returns LiteLLM's ``ImageResponse``."""
        _litellm.internals().warn_missing("image_sdk_retries_off")
        return await self._checked(  # type: ignore[no-any-return]
            "image_generation", model, prompt, False, deadline, listener, before_retry, kwargs
        )

    def image_generation(self, model: str, prompt: str, **kwargs: Any) -> litellm.ImageResponse:
        """Blocking twin of :meth:`aimage_generation`."""
        return self.calls.run_sync(self.aimage_generation(model, prompt, **kwargs))

    async def aresponses(
        self,
        model: str,
        input: str | list[Any],
        *,
        stream: bool = False,
        deadline: float | None = None,
        listener: Listener | None = None,
        before_retry: BeforeRetry | None = None,
        **kwargs: Any,
    ) -> Any:
        """Like ``litellm.Router.aresponses`` (OpenAI's Responses API): a ``ResponsesAPIResponse``,
        or with ``stream=True`` a :class:`ResilientStream` of its typed events."""
        return await self._checked(
            "responses", model, input, stream, deadline, listener, before_retry, kwargs
        )

    def responses(self, model: str, input: str | list[Any], *, stream: bool = False, **kwargs: Any) -> Any:
        """Blocking twin of :meth:`aresponses` (a stream is a blocking iterator)."""
        return self._blocking(self.aresponses(model, input, stream=stream, **kwargs), stream)

    def check_call(self, operation: str, group: str) -> None:
        """Raise a ConfigError unless ``group`` (and its fallbacks) can serve ``operation``
        (``"embedding"``, ``"text_completion"``, ``"image_generation"``, ``"responses"``,
        ``"transcription"``, ``"speech"``, ``"moderation"`` or ``"rerank"``)."""
        if operation not in MODES:
            raise ConfigError("operation", f"expected one of {sorted(MODES)}, got {operation!r}")
        self.calls.check_group(group)
        self._check_modes(operation, group)

    # -- shared steps -----------------------------------------------------------------------------

    def _blocking(self, coro: Any, stream: bool) -> Any:
        result = self.calls.run_sync(coro)
        return SyncResilientStream(result, self.calls.sync) if stream else result

    async def _checked(
        self,
        operation: str,
        model: str,
        payload: Any,
        stream: bool,
        deadline: float | None,
        listener: Listener | None,
        before_retry: BeforeRetry | None,
        kwargs: Mapping[str, Any],
    ) -> Any:
        self.calls.check_group(model)
        validate_payload(operation, payload, kwargs)
        if stream and operation not in STREAMING_OPERATIONS:
            raise ConfigError("stream", f"LiteLLM does not stream {operation}")
        self._check_modes(operation, model)
        return await self._operation(
            operation, model, payload, stream, deadline, listener, before_retry, kwargs
        )

    async def _operation(
        self,
        operation: str,
        model: str,
        payload: Any,
        stream: bool,
        deadline: float | None,
        listener: Listener | None,
        before_retry: BeforeRetry | None,
        kwargs: Mapping[str, Any],
    ) -> Any:
        """One checked call on the engine, like ``acompletion`` (options, deadline, idempotency)."""
        if deadline is not None:
            deadline = positive_seconds("deadline", deadline)
        calls = self.calls
        ctx, clean = calls.open_call(
            model, payload, stream, deadline, listener, before_retry, kwargs, operation
        )
        if stream:
            return await calls.stream(ctx, model, payload, clean)
        return await calls.complete(ctx, model, payload, clean)

    def _memo(self) -> dict[tuple[Any, ...], Any]:
        """Per-router answers of the checks below: they read only the configuration (deployments,
        fallbacks, policy), which never changes after construction, so each is worked out once."""
        memo: dict[tuple[Any, ...], Any] | None = self.__dict__.get("_endpoint_memo")
        if memo is None:
            memo = self.__dict__["_endpoint_memo"] = {}
        return memo

    def _groups_of(self, group: str) -> tuple[str, ...]:
        """``group`` and every group its calls may fall back to (any error class)."""
        memo = self._memo()
        known = memo.get(("groups", group))
        if known is not None:
            return known  # type: ignore[no-any-return]
        engine = self.calls.engine
        out = [group]
        for cls in (None, ErrorClass.CONTEXT_WINDOW, ErrorClass.CONTENT_POLICY):
            out.extend(g for g in engine.fallback_chain(group, cls) if g not in out)
        memo["groups", group] = found = tuple(out)
        return found

    def _check_modes(self, operation: str, group: str) -> None:
        """Every deployment the call may reach must serve ``operation`` (its ``model_info.mode``)."""
        memo = self._memo()
        if ("modes", operation, group) in memo:
            return
        allowed = MODES[operation]
        engine = self.calls.engine
        for g in self._groups_of(group):
            for dep in engine.group_deployments.get(g, []):
                mode = engine.deployments[dep].params.get("mode")
                if mode is not None and mode not in allowed:
                    where = "model group" if g == group else f"fallback {g!r} of model group"
                    raise ConfigError(
                        "model_info.mode",
                        f"deployment {dep!r} of {where} {group!r} has mode {mode!r}, which cannot "
                        f"serve {operation} (needs one of {sorted(allowed)}); route {operation} "
                        "calls to a group of such deployments",
                    )
        memo["modes", operation, group] = True

    def _check_dimensions(self, group: str, dimensions: Any) -> None:
        """Refuse a call whose routes would return vectors of different lengths."""
        memo = self._memo()
        key = ("dimensions", group, dimensions if isinstance(dimensions, int) else None)
        if key in memo:
            return
        engine = self.calls.engine
        first: tuple[str, int] | None = None
        for g in self._groups_of(group):
            for dep in engine.group_deployments.get(g, []):
                size = embedding_dimension(engine.deployments[dep].params, dimensions)
                if size is None:
                    continue
                if first is None:
                    first = (dep, size)
                elif size != first[1]:
                    raise ConfigError(
                        "model_info.output_vector_size",
                        f"deployment {dep!r} (group {g!r}) returns {size}-dimensional vectors but "
                        f"{first[0]!r} returns {first[1]}: a fallback would mix vector spaces in one "
                        f"index. Remove the fallback, or pass vectors_compatible=True if {group!r}'s "
                        "routes really share one vector space",
                    )
        memo[key] = True

    def _batch_concurrency(self, group: str, wanted: int | None) -> int:
        """How many batches of a split call may be in flight (see :func:`batch_concurrency`)."""
        memo = self._memo()
        key = ("concurrency", group, wanted)
        if key in memo:
            return memo[key]  # type: ignore[no-any-return]
        calls = self.calls
        memo[key] = bound = batch_concurrency(
            wanted or calls.policy.embedding_batch_concurrency,
            (
                calls.engine.deployments[dep].params
                for g in self._groups_of(group)
                for dep in calls.engine.group_deployments.get(g, [])
            ),
            calls.spec.router_settings.get("default_max_parallel_requests"),
        )
        return bound

    def _batch_limit(self, group: str) -> int | None:
        """The smallest ``max_embedding_batch_size`` among the deployments the call may reach."""
        memo = self._memo()
        if ("limit", group) in memo:
            return memo["limit", group]  # type: ignore[no-any-return]
        engine = self.calls.engine
        limits = [
            limit
            for g in self._groups_of(group)
            for dep in engine.group_deployments.get(g, [])
            if (limit := embedding_batch_limit(engine.deployments[dep].params)) is not None
        ]
        memo["limit", group] = found = min(limits) if limits else None
        return found


def _is_tokens(inputs: Sequence[Any]) -> bool:
    return bool(inputs) and all(isinstance(x, int) and not isinstance(x, bool) for x in inputs)


def _join_embeddings(parts: list[Any]) -> litellm.EmbeddingResponse:
    """The batches' vectors in input order, their usage and cost summed, one report for all."""
    data: list[Any] = []
    prompt = total = 0
    cost: float | None = None
    reports: list[CallReport] = []
    for part in parts:
        for item in part.data:
            entry = dict(item) if isinstance(item, Mapping) else item.model_dump()
            entry["index"] = len(data)
            data.append(entry)
        usage = getattr(part, "usage", None)
        prompt += int(getattr(usage, "prompt_tokens", 0) or 0)
        total += int(getattr(usage, "total_tokens", 0) or 0)
        c = (hidden_params_of(part) or {}).get("response_cost")
        if isinstance(c, int | float):
            cost = (cost or 0.0) + float(c)
        rep = (hidden_params_of(part) or {}).get(REPORT_KEY)
        if isinstance(rep, CallReport):
            reports.append(rep)
    joined = litellm.EmbeddingResponse(
        model=parts[0].model,
        data=data,
        usage=litellm.Usage(prompt_tokens=prompt, completion_tokens=0, total_tokens=total),
    )
    hidden = hidden_params_of(joined)
    if hidden is not None:
        hidden.update({k: v for k, v in (hidden_params_of(parts[-1]) or {}).items() if k != "response_cost"})
        hidden["response_cost"] = cost
        hidden["batches"] = len(parts)
    if reports:
        attach_report(joined, _joined_report(reports, cost, prompt, total))
    return joined


def _joined_report(reports: list[CallReport], cost: float | None, prompt: int, total: int) -> CallReport:
    """One report over the batch calls: every attempt, usage and cost summed, the last route."""
    last = reports[-1]
    first_start = min(r.started_at for r in reports)
    joined = CallReport(
        call_id=f"{reports[0].call_id}..{last.call_id}",
        requested_group=last.requested_group,
        stream=False,
        started_at=first_start,
        served_group=last.served_group,
        deployment_id=last.deployment_id,
        served_model=last.served_model,
        fallback_level=max(r.fallback_level for r in reports),
        outcome=last.outcome,
        # batches may overlap: the call took from the first start to the last end
        total_latency_s=max(r.started_at + r.total_latency_s for r in reports) - first_start,
        usage={"prompt_tokens": prompt, "completion_tokens": 0, "total_tokens": total},
        response_cost=cost,
        priority=last.priority,
        hedged=any(r.hedged for r in reports),
        operation=last.operation,
    )
    for r in reports:
        joined.attempts.extend(r.attempts)
    return joined
