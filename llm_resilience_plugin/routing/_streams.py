"""Streams through the router.

Chunks are read inside the attempt until the first one with content, a tool call or a finish
reason, so failures before anything reaches the caller are ordinary (retryable) attempt
failures. After that, a failure is recovered by the engine (:mod:`.._engine.stream_recovery`):
by default seamlessly - the stream simply goes on with a continuation, or with a replay whose
text was checked against what the caller saw (only the rest is yielded) - else it raises
:class:`StreamInterruptedError` with the partial text (and a replacement answer, if one was
had). With the marker protocol the stream yields a :class:`StreamRestart` marker before the new
route's chunks. A stream that ends without a finish reason is never a success. Streams reach
the engine only through their :class:`LiveAttempt`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

from llm_resilience_plugin import _litellm
from llm_resilience_plugin._engine.watchdog import AttemptWatchdog
from llm_resilience_plugin.errors import Failure, StreamInterruptedError
from llm_resilience_plugin.events import CallReport, StreamBreak, StreamRestart, hidden_params_of
from llm_resilience_plugin.routing._chunks import (
    chunk_finish,
    chunk_has_payload,
    chunk_has_tool_call,
    chunk_model,
    chunk_text,
    chunk_usage,
    done_text,
    is_usage_only,
    set_chunk_text,
)
from llm_resilience_plugin.routing._shutdown import StreamWatch, cut_error

if TYPE_CHECKING:
    from llm_resilience_plugin._engine.drivers import SyncRunner
    from llm_resilience_plugin._engine.live import LiveAttempt
    from llm_resilience_plugin._engine.stream_recovery import Recovered
    from llm_resilience_plugin.routing._sse_skip import EventSkipper


UNFINISHED = (
    "stream ended without the provider's finish; LiteLLM supplied 'stop' (an event it could not "
    "decode swallowed the rest: truncated answer)"
)


class Prefetched:
    """A LiteLLM stream with its leading chunks already read (inside the attempt)."""

    def __init__(
        self, stream: Any, buffered: list[Any], done: bool, witness: Callable[[], bool] | None = None
    ) -> None:
        self.stream = stream
        self.buffered = buffered
        self.done = done
        # where LiteLLM may supply a finish the provider never sent: did the provider send one?
        self.witness = witness
        self.skipper: EventSkipper | None = None  # drops one invalid SSE event in place, if set

    def unfinished(self) -> bool:
        """Did the stream end on a finish LiteLLM made up (the provider sent none)?"""
        return self.witness is not None and not self.witness()


async def prefetch_stream(stream: Any) -> Prefetched:
    """Read up to the first chunk with a payload; a stream that ends before one is a failure."""
    buffered: list[Any] = []
    witness = _litellm.finish_witness(stream)
    it = stream.__aiter__()
    while True:
        try:
            chunk = await it.__anext__()
        except StopAsyncIteration:
            if not any(chunk_has_payload(c) for c in buffered):
                raise ConnectionError("stream ended before any content") from None
            pre = Prefetched(stream, buffered, True, witness)
            if pre.unfinished():
                raise ConnectionError(UNFINISHED) from None
            return pre
        buffered.append(chunk)
        if chunk_has_payload(chunk):
            return Prefetched(stream, buffered, False, witness)


def usage_to_hidden_params(shown: Any, usage_chunk: Any) -> None:
    """Put a hidden usage-only chunk's usage where a plain Router stream keeps it when the caller
    did not ask for usage: the last chunk's ``_hidden_params["usage"]`` (read by
    ``litellm.stream_chunk_builder``), with its cost."""
    hidden = hidden_params_of(shown)
    usage = getattr(usage_chunk, "usage", None)
    if hidden is None or usage is None or "usage" in hidden:
        return
    cost = (hidden_params_of(usage_chunk) or {}).get("response_cost")
    if cost is not None and getattr(usage, "cost", None) is None:
        with contextlib.suppress(Exception):
            usage.cost = cost
    hidden["usage"] = usage


def _after_prefix(chunks: list[Any], skip: int) -> list[Any]:
    """``chunks`` without their first ``skip`` characters of text (a chunk cut in the middle keeps
    its tail); chunks without text (usage, finish) pass through."""
    out: list[Any] = []
    for chunk in chunks:
        text = chunk_text(chunk)
        if skip <= 0 or not text:
            out.append(chunk)
            continue
        if len(text) <= skip:
            skip -= len(text)
            continue
        set_chunk_text(chunk, text[skip:])
        skip = 0
        out.append(chunk)
    return out


def _rest_after(chunks: list[Any], skip: int) -> list[Any]:
    """A verified replay's held chunks after the ``skip`` characters the caller already has: what
    lies before that point is dropped whole (text, the role, a Responses event that opens the
    answer: the caller has them), a chunk cut in the middle keeps its tail."""
    out: list[Any] = []
    for chunk in chunks:
        text = chunk_text(chunk)
        if skip <= 0:
            out.append(chunk)
        elif len(text) <= skip:
            skip -= len(text)
        else:
            set_chunk_text(chunk, text[skip:])
            skip = 0
            out.append(chunk)
    return out


def _record_end(live: LiveAttempt, brk: StreamBreak, waited: float, stream: ResilientStream) -> None:
    """Record how a break ended once the stream that went on ends: the caller's wait for its next
    chunk, and the extra tokens - the prompt sent again and, for a replay, the part of its
    completion that repeated what was shown (by its share of the replay's text) - with their
    share of the attempt's cost."""
    usage, extra, cost = stream.usage, None, None
    if usage is not None:
        extra = usage["prompt_tokens"]
        total_chars = len("".join(stream._parts))
        if brk.end == "replayed" and total_chars:
            extra += round(usage["completion_tokens"] * min(1.0, brk.shown_chars / total_chars))
        if stream.cost is not None and usage["total_tokens"]:
            cost = stream.cost * extra / usage["total_tokens"]
    live.record_break(dataclasses.replace(brk, wait_s=waited, extra_tokens=extra, extra_cost=cost))


def _diverged(brk: StreamBreak, replay: Any, sent: Any) -> StreamBreak:
    """A diverged replay's record: all of it was extra - its usage and cost where it reported
    them, else (closed early) its tokens estimated from the prompt sent and the text received,
    and its cost unknown (None); a static answer costs none."""
    if not isinstance(replay, ResilientStream):
        return dataclasses.replace(brk, end="diverged", extra_tokens=0, extra_cost=0.0)
    if replay.usage is not None:
        tokens, cost = replay.usage["total_tokens"], replay.cost
    else:
        tokens, cost = replay._live.replay_tokens(sent, replay.partial_text), None
    return dataclasses.replace(brk, end="diverged", extra_tokens=tokens, extra_cost=cost)


class ReadCut:
    """The task reading a stream's source, and a cut of that read: some LiteLLM streams (the
    Router's fallback wrapper, an async generator) cannot be closed while another task reads
    them, which would read the answer to its end. A close cancels the read instead."""

    __slots__ = ("_cut", "reading")

    def __init__(self) -> None:
        self.reading: asyncio.Task[Any] | None = None  # the task awaiting the source's next chunk
        self._cut: asyncio.Task[Any] | None = None  # that read, cancelled by cut()

    def cut(self) -> None:
        """Cancel a read still waiting on the source (from another task; after the source's close)."""
        reader = self.reading
        if reader is not None and reader is not asyncio.current_task() and not reader.done():
            self._cut = reader
            reader.cancel()

    def ended(self) -> bool:
        """Was the cancellation just caught :meth:`cut`'s (and no one else's)? Then it is undone."""
        task, self._cut = self._cut, None
        if task is None or task is not asyncio.current_task():
            return False
        return task.uncancel() == 0


async def verify_replay(it: AsyncIterator[Any], delivered: str) -> tuple[list[Any], bool]:
    """Read a replay until its text covers ``delivered``, parts from it or finishes: (its
    chunks after what the caller has, is it the same so far?). A finish is never read past
    here, so a replay that falls short has not ended (nor published the call's report)."""
    held: list[Any] = []
    text = ""
    async for chunk in it:
        held.append(chunk)
        text += chunk_text(chunk)
        if len(text) < len(delivered) and chunk_has_tool_call(chunk):
            return held, False  # the caller saw text where the replay calls a tool
        if len(text) >= len(delivered) or not delivered.startswith(text) or chunk_finish(chunk):
            break
    if not text.startswith(delivered):
        return held, False
    return _rest_after(held, len(delivered)), True


class ResilientStream:
    """An async iterator of LiteLLM chunks (see the module docstring for the guarantees). It only
    relays chunks: accounting and recovery are the engine's, through its :class:`LiveAttempt`."""

    def __init__(
        self,
        live: LiveAttempt,
        pre: Prefetched,
        messages: list[dict[str, Any]] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        self._live = live
        self._pre = pre
        self._parts: list[str] = []
        self._part_from = 0  # where the current Responses output part's text begins in _parts
        self._max_gap = 0.0  # the longest silence between two chunks, for the learned idle timeout
        self._finish_reason: str | None = None
        self._closed = False
        self._messages = messages  # the caller's, as it sent them (what a restart sends again)
        self._kwargs = kwargs or {}
        # The router always asks for usage (the report and the cost guard need it); a caller who
        # did not ask never sees the usage-only last chunk, as with a plain Router.
        self._hide_usage_chunk = not (self._kwargs.get("stream_options") or {}).get("include_usage")
        self._shown_before = ""  # the text this stream continues (assistant prefill), if any
        self._next: ResilientStream | StaticStream | None = None
        self._saw_tools = False
        self._failure: Failure | None = None  # the break being recovered (seamless: moving on)
        self._on_end: Callable[[ResilientStream], None] | None = None  # records a recovery
        self._held: ResilientStream | StaticStream | None = None  # a replay held back, unverified
        self._left = False  # the caller closed the stream (maybe from another task or thread)
        self._reads = ReadCut()  # ends a read aclose() (from another task) could not stop
        self.cost: float | None = None  # this attempt's own cost, as its chunks report it
        self.report = live.report
        self.report.ttft_s = live.ttft
        self.usage: dict[str, int] | None = None
        # A stream dropped without being read to its end or closed still lets go of its breaker
        # ticket (a half-open probe) and settles its cost reservation, when it is collected.
        self._abandoned = weakref.finalize(self, live.abandoned, self._parts)
        self.watch: StreamWatch | None = None  # the router's shutdown watches the caller's stream

    @property
    def partial_text(self) -> str:
        """The answer's text the caller has been shown so far: after a recovery, the new route's
        (with the text it continues, for a prefill); what a ``"restart"`` discarded is not in it."""
        if self._next is not None:
            return self._next.partial_text
        return self._shown_before + "".join(self._parts)

    @property
    def picked(self) -> str | None:
        """The deployment this stream's attempt reads from."""
        return self._live.picked

    def _successor(self, nxt: Any, continues: str) -> Any:
        """Hand the recovered stream what a further recovery needs: the caller's own messages
        (never a prefill) and the text it continues (``continues``; empty after a restart)."""
        if isinstance(nxt, ResilientStream):
            nxt._messages = self._messages
            nxt._shown_before = continues
        self._next = nxt
        return nxt

    def __aiter__(self) -> AsyncIterator[Any]:
        if self.watch is not None:
            return self._watched(self.watch)
        return self._iterate()

    async def _watched(self, watch: StreamWatch) -> AsyncGenerator[Any, None]:
        """:meth:`_iterate` as the router's shutdown sees it: each read marked; a read the shutdown
        cut (or one after it) raises :class:`RouterClosedError` (the report says cancelled,
        nothing is counted); the watch ends - and lets go of the call's own credentials - once
        nothing more can come from the stream (its end, an error raised, a close, a cut)."""
        inner = cast("AsyncGenerator[Any, None]", self._iterate())
        try:
            while True:
                if watch.cut:
                    raise cut_error(self.report)
                task = asyncio.current_task()
                watch.reading(task)
                try:
                    chunk = await inner.__anext__()
                except StopAsyncIteration:
                    return
                except asyncio.CancelledError:
                    if not (watch.cut and task is not None and task.cancelling()):
                        raise
                    task.uncancel()  # the caller's task is not left cancelled
                    watch.reader = None
                    await self.aclose()
                    if self.report.outcome is None:  # cut while a break was being recovered
                        self.report.outcome = "cancelled"
                        self._live.publish(self.report)
                    raise cut_error(self.report) from None
                watch.reader = None
                yield chunk
        finally:
            try:
                await inner.aclose()
            finally:
                watch.end()

    async def _iterate(self) -> AsyncIterator[Any]:
        if self._closed:
            return
        live = self._live
        try:
            shown: Any = None
            for chunk in self._pre.buffered:
                self._observe(chunk)
                if self._hide_usage_chunk and is_usage_only(chunk):
                    usage_to_hidden_params(shown, chunk)
                else:
                    shown = chunk
                    yield chunk
            if not self._pre.done:
                it = self._pre.stream.__aiter__()
                last = live.now()
                while True:
                    self._reads.reading = asyncio.current_task()
                    try:
                        with AttemptWatchdog(live.idle_limit(), "stream idle"):
                            chunk = await it.__anext__()
                    except StopAsyncIteration:
                        break
                    except asyncio.CancelledError:
                        if not self._reads.ended():
                            raise
                        return  # closed from another task or thread: the reader's loop just ends
                    finally:
                        self._reads.reading = None
                    now = live.now()
                    self._max_gap, last = max(self._max_gap, now - last), now
                    self._observe(chunk)
                    if self._hide_usage_chunk and is_usage_only(chunk):
                        usage_to_hidden_params(shown, chunk)
                        continue  # the usage-only last chunk the caller did not ask for
                    shown = chunk
                    yield chunk
            if self._finish_reason is None:
                raise ConnectionError("stream ended without a finish_reason (truncated answer)")
            if self._pre.unfinished():
                raise ConnectionError(UNFINISHED)
        except (GeneratorExit, asyncio.CancelledError):
            self._close_cancelled()
            raise
        except Exception as exc:
            recovered = await self._recover(exc)
            if live.seamless and self._failure is not None and self._messages is not None:
                async for item in self._go_on(recovered, exc):
                    yield item
                return
            if recovered is None:
                raise StreamInterruptedError(
                    f"stream from {live.picked} failed after {len(self.partial_text)} chars: {exc}",
                    self.partial_text,
                    exc,
                    self.report,
                ) from exc
            async for item in self._resumed(recovered):
                yield item
            return
        self._succeed()

    async def _recover(self, exc: BaseException) -> Recovered | None:
        """Account for the break and let the engine resume the call elsewhere, if it may."""
        live = self._live
        recovering = live.may_recover(self._messages is not None)
        quits = not recovering and live.seamless  # no way on is left: recorded as given up
        failure = self._fail(exc, final=not recovering and not quits)
        if quits and failure is not None:
            live.gave_up(failure, len(self.partial_text))
        if not recovering or failure is None or self._messages is None:
            return None
        self._failure = failure
        return await live.recover(
            failure, self._messages, self._kwargs, self.partial_text, saw_tools=self._saw_tools
        )

    async def _go_on(self, recovered: Recovered | None, exc: BaseException) -> AsyncIterator[Any]:
        """Seamless recovery: the rest of the answer with nothing in-band. A continuation goes on
        as it comes; a replay is held back until its text covers what the caller has - identical:
        only the rest is yielded; different: it is dropped and the call moves on. When no way is
        left, :class:`StreamInterruptedError` (with the replacement answer, if one was had)."""
        live, failure, messages = self._live, self._failure, self._messages
        assert failure is not None and messages is not None
        delivered, broke, since = self.partial_text, live.picked, live.now()
        while recovered is not None and recovered.way != "replacement":
            nxt = recovered.result
            continued = recovered.way == "continue"
            brk = StreamBreak(
                live.call.call_id,
                live.call.report.requested_group,
                failure.error_class,
                "continued" if continued else "replayed",
                broke,
                getattr(nxt, "picked", None),
                len(delivered),
            )
            if isinstance(nxt, ResilientStream):  # what its own recovery would need
                nxt._messages, nxt._shown_before = messages, delivered if continued else ""
            if self._left:  # closed while the call went on elsewhere: nothing more is read
                await nxt.aclose()  # the report says cancelled
                return
            it = nxt.__aiter__()
            if continued:
                rest: list[Any] = []
            else:
                self._held = nxt  # what aclose() must close while it is held back
                try:
                    rest, same = await verify_replay(it, delivered)
                except StreamInterruptedError as err:  # the replay broke too, with no way left
                    if self._left:  # ... because the caller closed it: the loop just ends
                        return
                    raise StreamInterruptedError(
                        str(err), delivered, err.cause, self.report, err.replacement
                    ) from err.cause
                except (GeneratorExit, asyncio.CancelledError):  # the caller left meanwhile
                    await nxt.aclose()  # the report says cancelled
                    raise
                finally:
                    self._held = None
                if self._left:
                    await nxt.aclose()
                    return
                if not same:
                    live.record_break(_diverged(brk, nxt, messages))
                    await nxt.discard()
                    with contextlib.suppress(Exception):
                        await it.aclose()  # type: ignore[attr-defined]
                    recovered = await live.recover(
                        failure,
                        messages,
                        self._kwargs,
                        delivered,
                        saw_tools=self._saw_tools,
                        diverged=brk.deployment_id,
                    )
                    continue
            self._next = nxt
            if isinstance(nxt, ResilientStream):
                nxt._on_end = functools.partial(_record_end, live, brk, live.now() - since)
            for chunk in rest:
                yield chunk
            async for chunk in it:
                yield chunk
            return
        if self._left:  # closed while the call went on elsewhere
            return
        replacement = None if recovered is None else recovered.result
        attached = "; a replacement answer is attached (.replacement)" if replacement is not None else ""
        raise StreamInterruptedError(
            f"stream from {broke} failed after {len(delivered)} chars: {exc}{attached}",
            delivered,
            exc,
            self.report,
            replacement,
        ) from exc

    async def _resumed(self, recovered: Recovered) -> AsyncIterator[Any]:
        """The rest of the answer. A restart that repeats what the caller already has word for
        word goes on seamlessly after it (mode "resume", no marker in-band); otherwise the marker
        comes first, so the caller knows to keep or discard its text. For ``"answer"`` the marker
        (holding the whole answer) is the last item."""
        marker = recovered.marker
        live = self._live
        assert marker is not None
        if marker.mode == "answer":  # published by the engine with the call's report
            yield marker
            return
        nxt = self._successor(recovered.result, marker.discarded_text if marker.mode == "continue" else "")
        delivered = marker.discarded_text
        it = nxt.__aiter__()
        if marker.mode == "restart" and delivered:
            held: list[Any] = []
            text = ""
            async for chunk in it:
                held.append(chunk)
                text += chunk_text(chunk)
                if len(text) >= len(delivered) or not delivered.startswith(text):
                    break
            if text.startswith(delivered):
                live.publish(
                    StreamRestart(marker.call_id, marker.model_group, delivered, marker.error_class, "resume")
                )
                for chunk in _after_prefix(held, len(delivered)):
                    yield chunk
                async for chunk in it:
                    yield chunk
                return
            live.publish(marker)
            yield marker
            for chunk in held:
                yield chunk
            async for chunk in it:
                yield chunk
            return
        live.publish(marker)
        yield marker
        async for chunk in it:
            yield chunk

    def _observe(self, chunk: Any) -> None:
        text = chunk_text(chunk)
        if text:
            self._parts.append(text)
        stated = done_text(chunk)
        if stated is not None:
            # LiteLLM drops a Responses event it cannot decode: the part's deltas then fall short
            # of the text its done event states - a break, not a success with a hole in it.
            streamed = "".join(self._parts)[self._part_from :]
            if streamed != stated:
                raise ConnectionError(
                    f"Responses stream lost text: its deltas ({len(streamed)} chars) do not add up "
                    f"to the {len(stated)} chars output_text.done states (an event was not decoded)"
                )
            self._part_from += len(streamed)
        if chunk_has_tool_call(chunk):
            self._saw_tools = True
        finish = chunk_finish(chunk)
        if finish:
            self._finish_reason = finish
        usage = chunk_usage(chunk)
        if usage is not None and usage["total_tokens"]:
            self.usage = usage
        if self.report.served_model is None:
            self.report.served_model = chunk_model(chunk)
        cost = (hidden_params_of(chunk) or {}).get("response_cost")
        if cost is None and usage is not None:  # LiteLLM 1.105-1.108 price a stream in its usage only
            cost = getattr(getattr(chunk, "usage", None), "cost", None)
        if isinstance(cost, int | float) and not isinstance(cost, bool):
            self.report.response_cost = self.cost = float(cost)

    def _end(self) -> bool:
        """Mark the stream ended (False: it already was)."""
        if self._closed:
            return False
        self._closed = True
        self._abandoned.detach()
        self._count_skips()
        if self._on_end is not None:  # a recovery's record, before the report is published
            on_end, self._on_end = self._on_end, None
            on_end(self)
        return True

    def _succeed(self) -> None:
        if self._end():
            self._live.succeeded(
                self._max_gap, self.usage, self.report.served_model, self.report.response_cost
            )

    def _fail(self, exc: BaseException, *, final: bool) -> Failure | None:
        if not self._end():
            return None
        return self._live.failed(exc, final=final, usage=self.usage, produced=bool(self.partial_text))

    def _close_cancelled(self) -> None:
        if self._end():
            self._live.cancelled(self.usage, bool(self.partial_text))

    def _count_skips(self) -> None:
        """Invalid SSE events this attempt's stream dropped in place (see :mod:`._sse_skip`)."""
        skipper = self._pre.skipper
        if skipper is not None and skipper.skipped:
            self.report.skipped_stream_events += skipper.skipped

    async def discard(self) -> None:
        """Drop a replay whose text differed: quietly (no report: the call goes on elsewhere)."""
        if self._end():
            self._live.discarded(self.usage, bool(self._parts))
        if self._next is not None:
            await self._next.discard()
        await self._close_source()

    async def _close_source(self) -> None:
        close = getattr(self._pre.stream, "aclose", None)
        if close is not None:
            try:
                await close()
            except Exception:
                pass

    async def aclose(self) -> None:
        """Stop early (the deployment's breaker counts neither success nor failure); a replay
        being held back is closed too, and a reader waiting on it ends its loop."""
        self._left = True
        self._close_cancelled()
        for nxt in (self._next, self._held):
            if nxt is not None:
                await nxt.aclose()
        await self._close_source()
        self._reads.cut()
        if self.watch is not None:
            self.watch.end()


class StaticStream:
    """A configured static answer delivered as a one-chunk stream (marked degraded); ``publish``
    hands the call's report to the engine once the chunk was read."""

    def __init__(self, response: Any, report: CallReport, publish: Callable[[CallReport], None]) -> None:
        import litellm

        text = response.choices[0].message.content
        choice: Any = {"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        self._chunk = litellm.ModelResponseStream(model=response.model, choices=[choice])
        self._publish = publish
        self.report = report
        self.usage: dict[str, int] | None = None
        self.partial_text = text

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        yield self._chunk
        self.report.outcome = "success"
        self._publish(self.report)

    async def aclose(self) -> None:
        return None

    async def discard(self) -> None:
        """Nothing to stop: the answer is one chunk."""
        return None


class SyncResilientStream:
    """Blocking iterator over a :class:`ResilientStream`, driven on the router's private loop."""

    def __init__(self, stream: ResilientStream | StaticStream, runner: SyncRunner) -> None:
        self._stream = stream
        self._runner = runner
        self._watch = getattr(stream, "watch", None)
        if self._watch is not None:
            self._watch.blocking = True  # its reader is the thread calling next(), not a task
        self._it = stream.__aiter__()
        self.report = stream.report

    @property
    def partial_text(self) -> str:
        return self._stream.partial_text

    @property
    def usage(self) -> dict[str, int] | None:
        return self._stream.usage

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        async def step() -> Any:
            return await self._it.__anext__()

        if self._watch is not None:
            self._watch.owner = threading.get_ident()
        try:
            return self._runner.run(step())
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        if self._watch is not None and self._watch.ended:
            return  # nothing left to close (its end, a close, or the router's shutdown)
        self._runner.run(self._stream.aclose())


async def discard(result: Any) -> None:
    """Close the losing stream of a hedge race that also produced a result."""
    close = getattr(result, "aclose", None)
    if close is not None:
        await close()
