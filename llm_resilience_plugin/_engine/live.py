"""A stream's attempt after its first chunk, as the stream sees the engine.

Streams reach the engine only through :class:`LiveAttempt`: how long they may stay silent, how
they ended (accounted once: breaker, guards, timings, report), and how a break after content is
recovered (:mod:`._engine.stream_recovery`) - inside the same call, its one deadline and its one
report. The stream itself only relays chunks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from llm_resilience_plugin._engine import stream_recovery
from llm_resilience_plugin._engine.attempts import stream_ended
from llm_resilience_plugin.errors import Failure
from llm_resilience_plugin.events import CallReport, Event, StreamBreak

if TYPE_CHECKING:
    from llm_resilience_plugin._engine.attempt import AttemptContext
    from llm_resilience_plugin._engine.core import CallState
    from llm_resilience_plugin._engine.engine import Engine
    from llm_resilience_plugin._engine.stream_recovery import Recovered


class LiveAttempt:
    """One stream attempt whose first chunk reached the caller, until the stream ends."""

    __slots__ = ("_actx", "_engine", "_level", "_started_wall", "_wait_before", "t0", "ttft")

    def __init__(
        self,
        engine: Engine,
        actx: AttemptContext,
        level: int,
        started_wall: float,
        ttft: float,
        wait_before: float,
    ) -> None:
        self._engine = engine
        self._actx = actx
        self._level = level
        self._started_wall = started_wall
        self._wait_before = wait_before
        self.ttft = ttft
        self.t0 = engine.clock.monotonic() - ttft

    @property
    def call(self) -> CallState:
        """The call this attempt belongs to (its deadline, options and report)."""
        return self._actx.call

    @property
    def report(self) -> CallReport:
        """The call's report, filled as the stream goes."""
        return self._actx.call.report

    @property
    def group(self) -> str:
        """The model group this attempt was sent to."""
        return self._actx.group

    @property
    def picked(self) -> str | None:
        """The deployment that is streaming."""
        return self._actx.picked

    def now(self) -> float:
        """The engine's monotonic clock."""
        return self._engine.clock.monotonic()

    def idle_limit(self) -> float:
        """The longest silence allowed before the next chunk: the group's idle timeout (learned
        from its streams where a break is recovered), never past the call's deadline."""
        idle = self._engine.idle_timeout(self._actx.call, self._actx.group)
        return max(0.001, min(idle, self._actx.call.deadline.remaining()))

    def publish(self, event: Event) -> None:
        """Hand ``event`` to the call's listener and the engine's observers."""
        self._engine.emit(self._actx.call, event)

    def succeeded(
        self,
        longest_gap: float,
        usage: dict[str, int] | None,
        served_model: str | None,
        cost: float | None,
    ) -> None:
        """The stream ended with a finish reason: count the attempt and publish the report."""
        engine = self._engine
        engine.timings[self._actx.group].observe_gap(longest_gap)
        self.report.usage = usage
        stream_ended(
            engine,
            self._actx,
            self._level,
            self.t0,
            self._started_wall,
            self._wait_before,
            ttft=self.ttft,
            usage=usage,
            served_model=served_model,
            cost=cost,
        )

    def failed(
        self, exc: BaseException, *, final: bool, usage: dict[str, int] | None, produced: bool
    ) -> Failure | None:
        """The stream broke: count the attempt (classified once). Content that reached the caller
        was generated and billed, so the guards settle it as spent. ``final``: no recovery
        follows, the report is published now."""
        actx = self._actx
        if actx.guard_tokens and produced:
            actx.settle_guards(None, usage, None, billable=True, produced=True)
        return stream_ended(
            self._engine, actx, self._level, self.t0, self._started_wall, self._wait_before, exc, final=final
        )

    def cancelled(self, usage: dict[str, int] | None, produced: bool) -> None:
        """The caller stopped early: the breaker counts nothing, the guards settle their estimate
        (the request was sent), the report says ``cancelled``."""
        self._engine.release(self._actx.admission)
        if self._actx.guard_tokens:
            self._actx.settle_guards(None, usage, None, billable=True, produced=produced)
        self.report.outcome = "cancelled"
        self.publish(self.report)

    def abandoned(self, parts: Sequence[str]) -> None:
        """Nobody finished nor closed the stream (it was collected): free its breaker ticket (a
        half-open probe would otherwise stay taken) and settle its reservation."""
        self._engine.release(self._actx.admission)
        if self._actx.guard_tokens:
            self._actx.settle_guards(None, None, None, billable=True, produced=any(parts))

    def discarded(self, usage: dict[str, int] | None, produced: bool) -> None:
        """A replay whose text differed from what the caller saw was dropped: its breaker counts
        nothing (the deployment answered), the guards settle what it generated, and no report
        is published (the call goes on)."""
        self._engine.release(self._actx.admission)
        if self._actx.guard_tokens:
            self._actx.settle_guards(None, usage, None, billable=True, produced=produced)

    @property
    def seamless(self) -> bool:
        """Is a break after content recovered without a marker (see :mod:`.stream_recovery`)?"""
        return stream_recovery.seamless(self._engine, self._actx.call)

    def gave_up(self, failure: Failure, shown: int) -> None:
        """A seamless recovery's cap is reached: record the break as given up, publish the report."""
        stream_recovery.gave_up(self._engine, self._actx.call, failure, self._actx.picked, shown, None)

    def record_break(self, brk: StreamBreak) -> None:
        """Keep how a break ended in the report, and publish it."""
        stream_recovery.record_break(self._engine, self._actx.call, brk)

    def replay_tokens(self, sent: Any, received: str) -> int:
        """Estimated tokens of this replay, closed early without usage (see
        :func:`.stream_recovery.replay_tokens`)."""
        return stream_recovery.replay_tokens(self._engine, self._actx.picked, sent, received)

    def may_recover(self, resendable: bool) -> bool:
        """Will a break after content be recovered (see :func:`.stream_recovery.may_recover`)?"""
        return resendable and stream_recovery.may_recover(self._engine, self._actx.call)

    async def recover(
        self,
        failure: Failure,
        messages: list[dict[str, Any]],
        kwargs: dict[str, Any],
        shown: str,
        *,
        saw_tools: bool,
        diverged: str | None = None,
    ) -> Recovered | None:
        """Resume the call elsewhere after this attempt broke (None: it could not; the report is
        then published as the original failure). ``diverged``: seamless recovery moves on after
        that deployment's replay differed."""
        engine, call = self._engine, self._actx.call
        try:
            if self.seamless:
                return await stream_recovery.recover_seamless(
                    engine,
                    call,
                    self._actx,
                    failure,
                    messages,
                    kwargs,
                    shown,
                    saw_tools=saw_tools,
                    diverged=diverged,
                )
            return await stream_recovery.recover(
                engine, call, self._actx, failure, messages, kwargs, shown, saw_tools=saw_tools
            )
        except asyncio.CancelledError:  # the caller left while the call was going on elsewhere
            stream_recovery.cancelled(engine, call)
            raise
