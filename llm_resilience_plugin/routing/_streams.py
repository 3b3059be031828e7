"""Streams through the router.

Chunks are read inside the attempt until the first one with content, a tool call or a finish
reason, so failures before anything reaches the caller are ordinary (retryable) attempt
failures. After that, a failure raises :class:`StreamInterruptedError` with the partial text —
or, where ``restart_broken_streams`` is on, yields a :class:`StreamRestart` marker and starts
over on another route. A stream that ends without a finish reason is never a success.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from llm_resilience_plugin._engine import prefill as prefill_state
from llm_resilience_plugin._engine.attempts import stream_ended
from llm_resilience_plugin._engine.core import router_recovers_streams
from llm_resilience_plugin._engine.drivers import walk_routes
from llm_resilience_plugin._engine.taxonomy import classify
from llm_resilience_plugin._engine.watchdog import AttemptWatchdog
from llm_resilience_plugin.errors import StreamInterruptedError
from llm_resilience_plugin.events import CallReport, StreamRestart, hidden_params_of
from llm_resilience_plugin.routing._chunks import (
    chunk_finish,
    chunk_has_payload,
    chunk_has_tool_call,
    chunk_model,
    chunk_text,
    chunk_usage,
    is_usage_only,
    set_chunk_text,
)

if TYPE_CHECKING:
    from llm_resilience_plugin._engine.attempt import AttemptContext
    from llm_resilience_plugin._engine.core import CallState
    from llm_resilience_plugin._engine.drivers import SyncRunner
    from llm_resilience_plugin._engine.engine import Engine
    from llm_resilience_plugin.routing._sse_skip import EventSkipper


class Prefetched:
    """A LiteLLM stream with its leading chunks already read (inside the attempt)."""

    def __init__(self, stream: Any, buffered: list[Any], done: bool) -> None:
        self.stream = stream
        self.buffered = buffered
        self.done = done
        self.skipper: EventSkipper | None = None  # drops one invalid SSE event in place, if set


async def prefetch_stream(stream: Any) -> Prefetched:
    """Read up to the first chunk with a payload; a stream that ends before one is a failure."""
    buffered: list[Any] = []
    it = stream.__aiter__()
    while True:
        try:
            chunk = await it.__anext__()
        except StopAsyncIteration:
            if not any(chunk_has_payload(c) for c in buffered):
                raise ConnectionError("stream ended before any content") from None
            return Prefetched(stream, buffered, done=True)
        buffered.append(chunk)
        if chunk_has_payload(chunk):
            return Prefetched(stream, buffered, done=False)


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


def _abandon(engine: Engine, actx: AttemptContext, parts: list[str]) -> None:
    """A stream nobody finished: free its breaker ticket; the guards settle their estimate (the
    request was sent and may be billed; ``parts`` says whether content reached the caller)."""
    engine.release(actx.admission)
    if actx.guard_tokens:
        actx.settle_guards(None, None, None, billable=True, produced=any(parts))


class ResilientStream:
    """An async iterator of LiteLLM chunks (see the module docstring for the guarantees)."""

    def __init__(
        self,
        engine: Engine,
        ctx: CallState,
        group: str,
        level: int,
        actx: AttemptContext,
        pre: Prefetched,
        started_wall: float,
        ttft: float,
        wait_before: float,
    ) -> None:
        self._engine = engine
        self._ctx = ctx
        self._group = group
        self._level = level
        self._actx = actx
        self._pre = pre
        self._started_wall = started_wall
        self._t0 = engine.clock.monotonic() - ttft
        self._ttft = ttft
        self._wait_before = wait_before
        self._parts: list[str] = []
        self._max_gap = 0.0  # the longest silence between two chunks, for the learned idle timeout
        self._hide_usage_chunk = False
        self._finish_reason: str | None = None
        self._closed = False
        self._messages: list[dict[str, Any]] | None = None  # the caller's, as it sent them
        self._kwargs: dict[str, Any] = {}
        self._shown_before = ""  # the text this stream continues (assistant prefill), if any
        self._next: ResilientStream | StaticStream | None = None
        self._saw_tools = False
        self.report = ctx.report
        self.report.ttft_s = ttft
        self.usage: dict[str, int] | None = None
        # A stream dropped without being read to its end or closed still lets go of its breaker
        # ticket (a half-open probe) and settles its cost reservation, when it is collected.
        self._abandoned = weakref.finalize(self, _abandon, engine, actx, self._parts)

    def bind_restart(self, messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> None:
        """What a restart needs to send the request again from scratch."""
        self._messages = messages
        self._kwargs = kwargs
        asked = (kwargs.get("stream_options") or {}).get("include_usage")
        # The router always asks for usage (the report and the cost guard need it); a caller who
        # did not ask never sees the usage-only last chunk, as with a plain Router.
        self._hide_usage_chunk = not asked

    @property
    def partial_text(self) -> str:
        """The answer's text the caller has been shown so far: after a recovery, the new route's
        (with the text it continues, for a prefill); what a ``"restart"`` discarded is not in it."""
        if self._next is not None:
            return self._next.partial_text
        return self._shown_before + "".join(self._parts)

    def _successor(self, nxt: Any, continues: str) -> Any:
        """Hand the recovered stream what a further recovery needs: the caller's own messages
        (never a prefill) and the text it continues (``continues``; empty after a restart)."""
        if isinstance(nxt, ResilientStream):
            nxt._messages = self._messages
            nxt._shown_before = continues
        self._next = nxt
        return nxt

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        if self._closed:
            return
        engine = self._engine
        idle = engine.idle_timeout(self._ctx, self._group)  # learned from the group's streams
        clock = engine.clock
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
                last = clock.monotonic()
                while True:
                    remaining = self._ctx.deadline.remaining()
                    try:
                        with AttemptWatchdog(max(0.001, min(idle, remaining)), "stream idle"):
                            chunk = await it.__anext__()
                    except StopAsyncIteration:
                        break
                    now = clock.monotonic()
                    self._max_gap, last = max(self._max_gap, now - last), now
                    self._observe(chunk)
                    if self._hide_usage_chunk and is_usage_only(chunk):
                        usage_to_hidden_params(shown, chunk)
                        continue  # the usage-only last chunk the caller did not ask for
                    shown = chunk
                    yield chunk
            if self._finish_reason is None:
                raise ConnectionError("stream ended without a finish_reason (truncated answer)")
        except (GeneratorExit, asyncio.CancelledError):
            self._close_cancelled()
            raise
        except Exception as exc:
            restart = await self._restart(exc)
            if restart is None:
                raise StreamInterruptedError(
                    f"stream from {self._actx.picked} failed after {len(self.partial_text)} chars: {exc}",
                    self.partial_text,
                    exc,
                    self.report,
                ) from exc
            marker, nxt = restart
            async for item in self._resumed(marker, nxt):
                yield item
            return
        self._succeed()

    def _recovers(self) -> bool:
        return router_recovers_streams(self._ctx.opts, self._engine.policies[self.report.requested_group])

    async def _restart(self, exc: BaseException) -> tuple[StreamRestart, Any] | None:
        """Resume a broken stream on another route, as often as the policy's cap and the deadline
        allow: by assistant prefill where the route supports it (the answer continues), else from
        scratch with the caller's own messages. A prefill refused (a bad request) is never
        surfaced: the stream restarts from scratch. A restart that fails surfaces the original
        failure."""
        engine = self._engine
        ctx = self._ctx
        requested = self.report.requested_group
        pol = engine.policies[requested]
        if (
            not self._recovers()
            or self._messages is None
            or self.report.stream_restarts >= pol.max_stream_restarts
        ):
            self._fail(exc, final=True)
            return None
        self._fail(exc, final=False)
        failure = classify(exc)
        if self._actx.picked is not None:
            ctx.avoid(self._actx.picked)  # resume somewhere else: this one just broke
        if ctx.deadline.remaining() <= engine.policy.min_attempt_time:
            self._give_up(failure)
            return None
        shown = self.partial_text
        constrained = "response_format" in self._kwargs or self._kwargs.get("tool_choice") not in (
            None,
            "auto",
            "none",
        )
        refusers: frozenset[str] = frozenset()
        if (
            pol.continue_streams_with_prefill
            and ctx.operation == "completion"  # assistant prefill is a chat message
            and shown
            and not self._saw_tools
            and not constrained
        ):
            # One assistant prefill with everything shown so far, after the caller's messages.
            prefill = {"role": "assistant", "content": shown, "prefix": True}
            before = prefill_state.mark(ctx)
            ctx.require_prefill = True
            try:
                nxt = await walk_routes(engine, ctx, requested, [*self._messages, prefill], self._kwargs)
            except Exception:
                nxt = None  # refused or nowhere to continue: start over instead
            finally:
                ctx.require_prefill = False
            if nxt is not None:
                self.report.stream_restarts += 1
                marker = StreamRestart(ctx.call_id, self._group, shown, failure.error_class, "continue")
                return marker, self._successor(nxt, shown)
            refusers = prefill_state.settle_refusals(engine, ctx, before) - before.never_again
            if ctx.deadline.remaining() <= engine.policy.min_attempt_time:
                self._give_up(failure)
                return None
        nxt = await self._from_scratch(refusers)
        if nxt is None:
            self._give_up(failure)
            return None
        self.report.stream_restarts += 1
        return StreamRestart(ctx.call_id, self._group, shown, failure.error_class), self._successor(nxt, "")

    async def _from_scratch(self, refusers: frozenset[str]) -> Any:
        """The caller's own request again, on a remaining route (None: nowhere answered). The
        deployments that just refused a prefill go last: elsewhere first, then them."""
        engine, ctx = self._engine, self._ctx
        assert self._messages is not None
        for dep in refusers:
            ctx.avoid(dep)
        ctx.tentative = True  # a walk that fails does not end the call: _give_up publishes once
        try:
            try:
                return await walk_routes(
                    engine, ctx, self.report.requested_group, self._messages, self._kwargs
                )
            except Exception:
                if not refusers or ctx.deadline.remaining() <= engine.policy.min_attempt_time:
                    return None
            ctx.never_again = ctx.never_again - refusers  # healthy but for the prefill: last resort
            try:
                return await walk_routes(
                    engine, ctx, self.report.requested_group, self._messages, self._kwargs
                )
            except Exception:
                return None
        finally:
            ctx.tentative = False

    async def _resumed(self, marker: StreamRestart, nxt: Any) -> AsyncIterator[Any]:
        """The rest of the answer from the new route. A restart that repeats what the caller
        already has word for word goes on seamlessly after it (mode "resume", no marker in-band);
        otherwise the marker comes first, so the caller knows to keep or discard its text."""
        engine = self._engine
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
                resumed = StreamRestart(
                    marker.call_id, marker.model_group, delivered, marker.error_class, "resume"
                )
                engine.emit(self._ctx, resumed)
                for chunk in _after_prefix(held, len(delivered)):
                    yield chunk
                async for chunk in it:
                    yield chunk
                return
            engine.emit(self._ctx, marker)
            yield marker
            for chunk in held:
                yield chunk
            async for chunk in it:
                yield chunk
            return
        engine.emit(self._ctx, marker)
        yield marker
        async for chunk in it:
            yield chunk

    def _give_up(self, failure: Any) -> None:
        """Surface the original mid-stream failure after a recovery attempt did not work."""
        self.report.outcome = "failure"
        self.report.error_class = failure.error_class
        self.report.total_latency_s = self._engine.clock.wall() - self.report.started_at
        self._engine.emit(self._ctx, self.report)

    def _observe(self, chunk: Any) -> None:
        text = chunk_text(chunk)
        if text:
            self._parts.append(text)
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
        if isinstance(cost, int | float) and not isinstance(cost, bool):
            self.report.response_cost = float(cost)

    def _succeed(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._abandoned.detach()
        engine = self._engine
        engine.timings[self._group].observe_gap(self._max_gap)
        self._count_skips()
        self.report.usage = self.usage
        stream_ended(
            engine,
            self._actx,
            self._level,
            self._t0,
            self._started_wall,
            self._wait_before,
            ttft=self._ttft,
            usage=self.usage,
            served_model=self.report.served_model,
            cost=self.report.response_cost,
        )

    def _fail(self, exc: BaseException, *, final: bool) -> None:
        if self._closed:
            return
        self._closed = True
        self._abandoned.detach()
        self._count_skips()
        if self._actx.guard_tokens and self.partial_text:
            # Content was generated (and billed): settle like a stream cut short, not a release.
            self._actx.settle_guards(None, self.usage, None, billable=True, produced=bool(self.partial_text))
        t0, started, waited = self._t0, self._started_wall, self._wait_before
        stream_ended(self._engine, self._actx, self._level, t0, started, waited, exc, final=final)

    def _close_cancelled(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._abandoned.detach()
        adm = self._actx.admission
        if adm is not None:
            self._engine.release(adm)
        if self._actx.guard_tokens:
            # Cut short by the caller: the guard settles its estimate (no final usage is known).
            self._actx.settle_guards(None, self.usage, None, billable=True, produced=bool(self.partial_text))
        self._count_skips()
        self.report.outcome = "cancelled"
        self._engine.emit(self._ctx, self.report)

    def _count_skips(self) -> None:
        """Invalid SSE events this attempt's stream dropped in place (see :mod:`._sse_skip`)."""
        skipper = self._pre.skipper
        if skipper is not None and skipper.skipped:
            self.report.skipped_stream_events += skipper.skipped

    async def aclose(self) -> None:
        """Stop early (the deployment's breaker counts neither success nor failure)."""
        self._close_cancelled()
        if self._next is not None:
            await self._next.aclose()
        close = getattr(self._pre.stream, "aclose", None)
        if close is not None:
            try:
                await close()
            except Exception:
                pass


class StaticStream:
    """A configured static answer delivered as a one-chunk stream (marked degraded)."""

    def __init__(self, response: Any, report: CallReport, engine: Engine, ctx: CallState) -> None:
        import litellm

        text = response.choices[0].message.content
        choice: Any = {"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        self._chunk = litellm.ModelResponseStream(model=response.model, choices=[choice])
        self._engine = engine
        self._ctx = ctx
        self.report = report
        self.usage: dict[str, int] | None = None
        self.partial_text = text

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        yield self._chunk
        self.report.outcome = "success"
        self._engine.emit(self._ctx, self.report)

    async def aclose(self) -> None:
        return None


class SyncResilientStream:
    """Blocking iterator over a :class:`ResilientStream`, driven on the router's private loop."""

    def __init__(self, stream: ResilientStream | StaticStream, runner: SyncRunner) -> None:
        self._stream = stream
        self._runner = runner
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

        try:
            return self._runner.run(step())
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        self._runner.run(self._stream.aclose())


async def discard(result: Any) -> None:
    """Close the losing stream of a hedge race that also produced a result."""
    close = getattr(result, "aclose", None)
    if close is not None:
        await close()
