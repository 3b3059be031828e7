"""Transcription, speech, moderation, rerank and batch completions of LiteLLM's Router on the
engine, each a ``ResilientRouter`` method with LiteLLM's signature and return type.

Transcription, speech, moderation and rerank are operations like embeddings (``_operations``):
checked before anything is sent (payload, ``model_info.mode``), then retried, failed over and
guarded as any call; the Router's function for the operation makes each attempt (direct dispatch
does not cover them). A transcription's file is read once, before the first attempt, so a retry
uploads the same bytes (a file object would be at its end). Speech answers LiteLLM's binary
response (``HttpxBinaryResponseContent``: ``.content``, ``.read()``); its report is on it as on any
answer, and the idempotency store does not keep it (no JSON to replay).

The batch completions fan out as LiteLLM's do, each element one resilient ``acompletion``;
an element that finally fails is its exception, returned in place.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from llm_resilience_plugin._engine.core import positive_seconds
from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.events import hidden_params_of

if TYPE_CHECKING:
    from litellm.types.llms.openai import HttpxBinaryResponseContent, OpenAIModerationResponse
    from litellm.types.rerank import RerankResponse
    from litellm.types.utils import TranscriptionResponse

    from llm_resilience_plugin._engine.core import BeforeRetry
    from llm_resilience_plugin.events import Listener
    from llm_resilience_plugin.routing._calls import CallRunner

__all__ = ["AUDIO_MODES", "AudioMixin", "check_audio_payload", "read_file"]

# ``model_info.mode`` values (LiteLLM's price-map names) that can serve each operation.
AUDIO_MODES: dict[str, frozenset[str]] = {
    "transcription": frozenset({"audio_transcription"}),
    "speech": frozenset({"audio_speech"}),
    "moderation": frozenset({"moderation"}),
    "rerank": frozenset({"rerank"}),
}


def _nonempty_text(field: str, value: Any) -> None:
    if isinstance(value, bytes | bytearray):
        raise ConfigError(field, "is bytes; pass text (str), e.g. value.decode('utf-8')")
    if not isinstance(value, str):
        raise ConfigError(field, f"expected text, got {type(value).__name__}")
    if not value.strip():
        raise ConfigError(field, "is empty; providers refuse an empty input")


def _content(field: str, value: Any) -> bytes:
    """The bytes of a file value (bytes, a binary file object, a path)."""
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
    elif isinstance(value, os.PathLike):
        try:
            with open(value, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ConfigError(field, f"cannot read {os.fspath(value)!r}: {e.strerror}") from None
    elif callable(getattr(value, "read", None)):
        data = value.read()
        if isinstance(data, str):
            raise ConfigError(field, "is a text-mode file; open it with 'rb'")
        if not isinstance(data, bytes | bytearray):
            raise ConfigError(field, f"read() gave {type(data).__name__}, expected bytes")
        data = bytes(data)
    elif isinstance(value, str):
        raise ConfigError(field, "is a str; pass the audio: open(path, 'rb'), pathlib.Path(path) or bytes")
    else:
        raise ConfigError(field, f"expected audio bytes, a binary file or a path, got {type(value).__name__}")
    if not data:
        raise ConfigError(field, "is empty (a file object already read to its end?)")
    return data


def read_file(file: Any) -> tuple[str, bytes] | tuple[Any, ...]:
    """A transcription's ``file`` as ``(filename, bytes[, content_type, ...])``, read once so every
    attempt uploads the same bytes; a ConfigError naming ``file`` when there is nothing to send."""
    if file is None:
        raise ConfigError("file", "is missing: pass the audio to transcribe, e.g. file=open('a.mp3', 'rb')")
    if isinstance(file, tuple):
        if len(file) < 2 or not isinstance(file[0], str | type(None)):
            raise ConfigError("file", "a tuple must be (filename, content[, content_type])")
        return (file[0] or "audio", _content("file[1]", file[1]), *file[2:])
    data = _content("file", file)
    name = getattr(file, "name", None)
    if isinstance(file, os.PathLike):
        name = PurePath(os.fspath(file)).name
    elif isinstance(name, str):
        name = os.path.basename(name)
    # The provider tells the format by the file name's extension: bytes alone get a neutral one.
    return (name if isinstance(name, str) and name else "audio.mp3", data)


def check_audio_payload(operation: str, payload: Any, kwargs: Mapping[str, Any]) -> None:
    """Refuse a transcription, speech, moderation or rerank call LiteLLM could not send."""
    if operation == "speech":
        _nonempty_text("input", payload)
        voice = kwargs.get("voice")
        if voice is None or voice == "":
            raise ConfigError("voice", "is missing: name the voice, e.g. voice='alloy'")
        if not isinstance(voice, str | Mapping):
            raise ConfigError("voice", f"expected a voice name, got {type(voice).__name__}")
    elif operation == "moderation":
        if isinstance(payload, str):
            _nonempty_text("input", payload)
        elif not isinstance(payload, list) or not payload:
            raise ConfigError("input", "expected a string or a non-empty list of strings or input items")
        else:
            for i, item in enumerate(payload):
                if isinstance(item, str):
                    _nonempty_text(f"input[{i}]", item)
                elif not isinstance(item, Mapping):
                    raise ConfigError(f"input[{i}]", "expected a string or an input item mapping")
    elif operation == "rerank":
        _nonempty_text("query", payload)
        documents = kwargs.get("documents")
        if not isinstance(documents, list) or not documents:
            raise ConfigError("documents", "expected a non-empty list of strings (or {'text': ...} mappings)")
        for i, doc in enumerate(documents):
            if isinstance(doc, str):
                _nonempty_text(f"documents[{i}]", doc)
            elif not isinstance(doc, Mapping):
                raise ConfigError(
                    f"documents[{i}]", f"expected a string or a mapping, got {type(doc).__name__}"
                )
        top_n = kwargs.get("top_n")
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
            raise ConfigError("top_n", f"expected a whole number >= 1, got {top_n!r}")
    if kwargs.get("stream"):
        raise ConfigError("stream", f"LiteLLM does not stream {operation}")


class AudioMixin:
    """``atranscription``/``transcription``, ``aspeech``/``speech``, ``amoderation``/``moderation``,
    ``arerank``/``rerank`` and the batch completions of
    :class:`~llm_resilience_plugin.routing.ResilientRouter` (see the module docs)."""

    calls: CallRunner

    if TYPE_CHECKING:

        def check_call(self, operation: str, group: str) -> None: ...

        async def acompletion(self, model: str, messages: list[dict[str, Any]], **kwargs: Any) -> Any: ...

    # -- audio, moderation, rerank ----------------------------------------------------------------

    async def _call(
        self,
        operation: str,
        model: str,
        payload: Any,
        deadline: float | None,
        listener: Listener | None,
        before_retry: BeforeRetry | None,
        kwargs: Mapping[str, Any],
    ) -> Any:
        """One checked call on the engine (group, payload, modes checked before anything is sent)."""
        calls = self.calls
        calls.check_group(model)
        check_audio_payload(operation, payload, kwargs)
        if kwargs.get("scenario") is not None:
            raise ConfigError("scenario", f"static answers are chat replies; {operation} has none")
        self.check_call(operation, model)  # every deployment it may reach serves the operation
        if deadline is not None:
            deadline = positive_seconds("deadline", deadline)
        ctx, clean = calls.open_call(
            model, payload, False, deadline, listener, before_retry, kwargs, operation
        )
        return await calls.complete(ctx, model, payload, clean)

    async def atranscription(
        self,
        model: str,
        file: Any = None,
        *,
        deadline: float | None = None,
        listener: Listener | None = None,
        before_retry: BeforeRetry | None = None,
        **kwargs: Any,
    ) -> TranscriptionResponse:
        """Like ``litellm.Router.atranscription``; returns LiteLLM's ``TranscriptionResponse``.
        ``file`` (bytes, a binary file, a path or ``(filename, bytes)``) is read once up front."""
        self.calls.check_group(model)
        payload = read_file(file)
        return await self._call(  # type: ignore[no-any-return]
            "transcription", model, payload, deadline, listener, before_retry, kwargs
        )

    def transcription(self, model: str, file: Any = None, **kwargs: Any) -> TranscriptionResponse:
        """Blocking twin of :meth:`atranscription`."""
        return self.calls.run_sync(self.atranscription(model, file, **kwargs))  # type: ignore[no-any-return]

    async def aspeech(
        self,
        model: str,
        input: str | None = None,
        voice: Any = None,
        *,
        deadline: float | None = None,
        listener: Listener | None = None,
        before_retry: BeforeRetry | None = None,
        **kwargs: Any,
    ) -> HttpxBinaryResponseContent:
        """Like ``litellm.Router.aspeech``; returns LiteLLM's binary ``HttpxBinaryResponseContent``
        (the audio in ``.content``), never a chat response."""
        return await self._call(  # type: ignore[no-any-return]
            "speech", model, input, deadline, listener, before_retry, {**kwargs, "voice": voice}
        )

    def speech(
        self, model: str, input: str | None = None, voice: Any = None, **kwargs: Any
    ) -> HttpxBinaryResponseContent:
        """Blocking twin of :meth:`aspeech`."""
        return self.calls.run_sync(self.aspeech(model, input, voice, **kwargs))  # type: ignore[no-any-return]

    async def amoderation(
        self,
        input: str | list[Any] | None = None,
        model: str | None = None,
        *,
        deadline: float | None = None,
        listener: Listener | None = None,
        before_retry: BeforeRetry | None = None,
        **kwargs: Any,
    ) -> OpenAIModerationResponse:
        """Like ``litellm.Router.amoderation`` (``input`` first, as there); returns LiteLLM's
        ``OpenAIModerationResponse``. ``model`` must name one of the router's groups."""
        if model is None:
            raise ConfigError(
                "model", "is missing: name the model group that moderates, e.g. model='moderation'"
            )
        return await self._call(  # type: ignore[no-any-return]
            "moderation", model, input, deadline, listener, before_retry, kwargs
        )

    def moderation(
        self, input: str | list[Any] | None = None, model: str | None = None, **kwargs: Any
    ) -> OpenAIModerationResponse:
        """Blocking twin of :meth:`amoderation`."""
        return self.calls.run_sync(self.amoderation(input, model, **kwargs))  # type: ignore[no-any-return]

    async def arerank(
        self,
        model: str,
        query: str | None = None,
        documents: list[Any] | None = None,
        *,
        deadline: float | None = None,
        listener: Listener | None = None,
        before_retry: BeforeRetry | None = None,
        **kwargs: Any,
    ) -> RerankResponse:
        """Like ``litellm.Router.arerank``; returns LiteLLM's ``RerankResponse``."""
        return await self._call(  # type: ignore[no-any-return]
            "rerank",
            model,
            query,
            deadline,
            listener,
            before_retry,
            {**kwargs, "documents": documents},
        )

    def rerank(
        self, model: str, query: str | None = None, documents: list[Any] | None = None, **kwargs: Any
    ) -> RerankResponse:
        """Blocking twin of :meth:`arerank`."""
        return self.calls.run_sync(self.arerank(model, query, documents, **kwargs))  # type: ignore[no-any-return]

    # -- batch completions ------------------------------------------------------------------------

    async def abatch_completion(self, models: list[str], messages: list[Any], **kwargs: Any) -> list[Any]:
        """Like ``litellm.Router.abatch_completion``: ``messages`` (one conversation) sent to each
        of ``models``, one answer per model; or a list of conversations, a list per conversation
        of one answer per model. Each is a resilient call; one that finally fails is its
        exception, in place. Unknown groups and malformed messages raise before any request."""
        groups = self._batch_groups("models", models)
        if not isinstance(messages, list) or not messages:
            raise ConfigError("messages", "expected a conversation (list of message dicts) or a list of them")
        if all(isinstance(m, Mapping) for m in messages):
            return await self._fan_out([(g, messages) for g in groups], kwargs)
        if all(isinstance(m, list) for m in messages):
            flat = await self._fan_out([(g, row) for row in messages for g in groups], kwargs)
            n = len(groups)
            return [flat[i * n : (i + 1) * n] for i in range(len(messages))]
        raise ConfigError(
            "messages", "mixes message dicts and lists: pass one conversation or a list of them"
        )

    async def abatch_completion_one_model_multiple_requests(
        self, model: str, messages: list[list[dict[str, Any]]], **kwargs: Any
    ) -> list[Any]:
        """Like LiteLLM's: each conversation in ``messages`` sent to ``model``, answers in order;
        each a resilient call, one that finally fails is its exception, in place."""
        self.calls.check_group(model)
        if not isinstance(messages, list) or not messages or not all(isinstance(m, list) for m in messages):
            raise ConfigError(
                "messages", "expected a non-empty list of conversations (lists of message dicts)"
            )
        return await self._fan_out([(model, m) for m in messages], kwargs)

    async def abatch_completion_fastest_response(
        self, model: str, messages: list[dict[str, Any]], stream: bool = False, **kwargs: Any
    ) -> Any:
        """Like LiteLLM's: ``model`` is comma-separated groups, all asked at once (each a resilient
        call); the first answer wins (``_hidden_params["fastest_response_batch_completion"]``),
        the rest are cancelled; every one failing raises ``Exception("All tasks failed")``."""
        if not isinstance(model, str):
            raise ConfigError("model", "expected comma-separated model groups, e.g. 'fast,backup'")
        groups = self._batch_groups("model", [m.strip() for m in model.split(",")])

        async def one(group: str) -> Any:
            try:
                return await self.acompletion(group, messages, stream=stream, **kwargs)
            except ConfigError:
                raise
            except Exception as error:  # returned, as LiteLLM's does
                return error

        pending = {asyncio.ensure_future(one(g)) for g in groups}
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                winners = [t.result() for t in done if not isinstance(t.result(), BaseException)]
                if winners:
                    for extra in winners[1:]:
                        await _close(extra)
                    hidden = hidden_params_of(winners[0])
                    if hidden is not None:
                        hidden["fastest_response_batch_completion"] = True
                    return winners[0]
        finally:
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        raise Exception("All tasks failed")  # LiteLLM raises a bare Exception

    def _batch_groups(self, field: str, models: Any) -> list[str]:
        if not isinstance(models, list | tuple) or not models:
            raise ConfigError(field, "expected a non-empty list of model group names")
        for m in models:
            self.calls.check_group(m)
        return list(models)

    async def _fan_out(self, calls: list[tuple[str, Any]], kwargs: Mapping[str, Any]) -> list[Any]:
        """Each ``(group, messages)`` one resilient call, all at once; failures in place (a
        ConfigError, the same for every element and raised before its request, is raised)."""

        key = kwargs.get("idempotency_key")

        async def one(i: int, group: str, messages: Any) -> Any:
            # A caller's key names the whole batch: each element keys its own part of it.
            each = (
                kwargs if key is None else {**kwargs, "idempotency_key": f"{key}#batch-{i}-of-{len(calls)}"}
            )
            try:
                return await self.acompletion(group, messages, **each)
            except ConfigError:
                raise
            except Exception as error:  # returned in place, as LiteLLM's does
                return error

        results = await asyncio.gather(
            *(one(i, g, m) for i, (g, m) in enumerate(calls)), return_exceptions=True
        )
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, Exception):
                raise r  # cancellation and the like
            if isinstance(r, ConfigError):
                raise r
        return list(results)


async def _close(result: Any) -> None:
    """Close a stream that lost the race (a plain answer needs nothing)."""
    close = getattr(result, "aclose", None)
    if close is not None:
        await close()
