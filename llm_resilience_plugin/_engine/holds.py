"""Who may wait out a ``Retry-After`` hold on the group asked for, and who fails over at once.

A hold means the provider is at its rate limit. When it lifts, a deployment takes about as many
requests as it had accepted when it started refusing (the ones it answers while held), not the
whole queue that built up behind it: calls beyond that would meet another 429 and wait again. So
a held deployment admits at most that many waiting calls per hold (at least one), and a call
waits out at most one hold per group; the overflow fails over at once when the group has a
fallback.

A hold that both refused more than one of our requests (sent before its first 429 came back, so
in flight together) and answered some of ours since it began is *saturated*: the deployment
serves part of our concurrent demand and refuses the rest, a rate limit of our own making (a 429
storm), not an incident. Queueing behind it cannot help - the demand that filled it comes back
with the waiters - so it admits no waiting call, and the calls already waiting are woken to fail
over (:meth:`HoldQueue.wakeup`). So is a group of two or more whose every deployment is held
after refusing requests of more than one of our calls at once (see :mod:`._engine.overload`):
the router spreads our load evenly, so our own demand saturates them together, while an incident
rarely hits all of them in the same instant (and one call refused by each in turn is no load).
A lone deployment that refuses everything (an incident, even one met by several concurrent
calls) keeps the queue above: the call waits.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque

# Answer times kept per deployment (enough for the throughput of any realistic hold window).
HISTORY = 256
# Refusals of one hold that, with an answer since it began, mark it saturated (see above).
SATURATING_REFUSALS = 2


class HoldQueue:
    """Per deployment: recent answer times, when its current hold began, how many of our requests
    it refused and how many calls wait for that hold."""

    def __init__(self) -> None:
        self._answers: dict[str, deque[float]] = {}
        self._held: dict[str, tuple[float, float]] = {}  # deployment -> (hold start, hold end)
        self._waiting: dict[str, tuple[float | None, int]] = {}  # deployment -> (hold start, waiting)
        # deployment -> (hold start, its 429s, the call its first 429 refused)
        self._refused: dict[str, tuple[float, int, str | None]] = {}
        # Calls waiting out a hold, to wake: a future (async) or an event (a blocking caller).
        self._wakeups: set[asyncio.Future[None] | threading.Event] = set()
        self._lock = threading.Lock()

    def answered(self, dep: str, now: float) -> None:
        """``dep`` answered a request at ``now`` (wall clock)."""
        times = self._answers.get(dep)
        if times is None:
            times = self._answers.setdefault(dep, deque(maxlen=HISTORY))
        times.append(now)
        if self._wakeups and self.saturated(dep):  # only while some call waits out a hold
            self._wake()

    def held(self, dep: str, now: float, seconds: float, caller: str | None = None) -> None:
        """``dep`` refused a request of call ``caller``, asking for ``seconds`` of rest at ``now``;
        a hold still running keeps its start (and counts this refusal as one more of it)."""
        with self._lock:
            start, end = self._held.get(dep, (now, 0.0))
            start = start if now < end else now
            self._held[dep] = (start, max(end, now + seconds))
            known, refused, first = self._refused.get(dep, (None, 0, None))
            if known == start:
                self._refused[dep] = (start, refused + 1, first)
            else:
                self._refused[dep] = (start, 1, caller)
        if self._wakeups:  # the waiting calls look again: is their group our own load now?
            self._wake()

    def refused_first(self, dep: str) -> str | None:
        """The call whose request ``dep``'s current hold refused first (None: no hold, unknown)."""
        hold = self._held.get(dep)
        known, _, first = self._refused.get(dep, (None, 0, None))
        return first if hold is not None and known == hold[0] else None

    def crowded(self, dep: str) -> bool:
        """Did ``dep``'s current hold refuse more than one of our requests (sent together)?"""
        hold = self._held.get(dep)
        if hold is None:
            return False
        known, refused, _ = self._refused.get(dep, (None, 0, None))
        return known == hold[0] and refused >= SATURATING_REFUSALS

    def saturated(self, dep: str) -> bool:
        """Is ``dep``'s current hold our own load: it refused more than one of our requests and
        answered some of ours since it began? Nobody waits for such a hold."""
        if not self.crowded(dep):
            return False
        times = self._answers.get(dep)
        return times is not None and len(times) > 0 and times[-1] >= self._held[dep][0]

    def wakeup(self) -> asyncio.Future[None]:
        """A future on the running loop, resolved when some hold becomes crowded or saturated (a
        waiting call then checks whether its group is now our own load); drop it with
        :meth:`forget`."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._wakeups.add(fut)
        return fut

    def wakeup_event(self) -> threading.Event:
        """The blocking twin of :meth:`wakeup`: an event set on the same occasions, for a
        caller waiting on its own thread; drop it with :meth:`forget`."""
        event = threading.Event()
        with self._lock:
            self._wakeups.add(event)
        return event

    @property
    def sleepers(self) -> int:
        """How many calls wait out a hold now, each with a wakeup to resolve (read-only, for tests)."""
        return len(self._wakeups)

    def forget(self, wake: asyncio.Future[None] | threading.Event) -> None:
        """Stop tracking ``wake`` (its waiting call slept its hold out, or was woken)."""
        with self._lock:
            self._wakeups.discard(wake)

    def _wake(self) -> None:
        with self._lock:
            wake, self._wakeups = self._wakeups, set()
        for w in wake:
            if isinstance(w, threading.Event):
                w.set()
            else:
                resolve(w)

    def capacity(self, dep: str) -> int:
        """Calls ``dep`` is likely to take when its hold lifts: the answers it gave since the
        hold began (requests it had accepted before refusing), at least one."""
        times = self._answers.get(dep)
        since = self._held.get(dep, (0.0, 0.0))[0]
        if not times:
            return 1
        return max(1, sum(1 for t in reversed(times) if t >= since))

    def try_wait(self, holds: list[tuple[str, float]], now: float) -> float | None:
        """Join the queue of the held deployment (``(id, seconds held)`` each) that frees first
        and still has room: the seconds to wait, or None when every queue is full (a saturated
        hold's queue has no room)."""
        with self._lock:
            for dep, held in sorted(holds, key=lambda h: h[1]):
                if self.saturated(dep):
                    continue
                # One hold, one queue: a hold extended by more 429s keeps its start, and its queue.
                start = self._held.get(dep, (round(now + held, 3), 0.0))[0]
                known, count = self._waiting.get(dep, (None, 0))
                if known != start:
                    count = 0
                if count < self.capacity(dep):
                    self._waiting[dep] = (start, count + 1)
                    return held
        return None


def resolve(fut: asyncio.Future[None]) -> None:
    """Resolve ``fut`` on its own loop, from any thread (a closed loop has nobody to wake)."""

    def done() -> None:
        if not fut.done():
            fut.set_result(None)

    try:
        fut.get_loop().call_soon_threadsafe(done)
    except RuntimeError:
        pass
