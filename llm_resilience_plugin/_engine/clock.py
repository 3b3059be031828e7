"""The clock every decision reads, a fake one for tests, and the one deadline of a call."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


class Clock:
    """Real time. Subclass (see :class:`FakeClock`) to test without sleeping."""

    # The C functions themselves: the router reads the clock several times per call.
    monotonic: Callable[[], float] = staticmethod(time.monotonic)
    wall: Callable[[], float] = staticmethod(time.time)

    async def sleep(self, seconds: float) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds)


class FakeClock(Clock):
    """Real time plus an offset that :meth:`sleep` advances instantly: retry waits cost nothing,
    while real I/O (the simulator, timeouts) still takes the time it takes."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.slept: list[float] = []
        self._lock = threading.Lock()

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.offset += seconds

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def wall(self) -> float:
        return time.time() + self.offset

    async def sleep(self, seconds: float) -> None:
        with self._lock:
            self.slept.append(seconds)
            self.offset += max(0.0, seconds)
        await asyncio.sleep(0)


@dataclass(slots=True)
class Deadline:
    """One absolute deadline for a whole call: every attempt, sleep and fallback fits inside."""

    clock: Clock
    expires_at: float

    @classmethod
    def after(cls, clock: Clock, seconds: float) -> Deadline:
        return cls(clock, clock.monotonic() + seconds)

    def remaining(self) -> float:
        return max(0.0, self.expires_at - self.clock.monotonic())

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0.0


def call_budget(*settings: float | None, cap: float | None = None) -> float:
    """The seconds a call may take - the one rule every entry point uses: the first of
    ``settings`` that is set, most specific first (the call's own, its model's, its tier's, the
    policy's), never more than ``cap`` (what an enclosing run, such as a LangChain chain with a
    deadline, has left)."""
    for budget in settings:
        if budget:
            return budget if cap is None or budget <= cap else cap
    raise ValueError("a call needs at least one deadline setting (the policy always has one)")
