"""The hard bound on every attempt: if LiteLLM's own timeout does not end an attempt (a provider
that trickles bytes, an SDK that ignores ``timeout``), the watchdog cancels it shortly after.

One sweep timer per event loop checks every attempt in flight, instead of one ``asyncio.timeout``
timer per attempt: a per-attempt timer costs a heap push, a context copy and a cancelled handle
left in the loop's heap, which is measurable on healthy calls (benchmarks/overhead.py).
"""

from __future__ import annotations

import asyncio
import time
import weakref

# How often the sweep runs while attempts are in flight; an overrun attempt ends at most this late.
SWEEP_INTERVAL = 0.05

_BASE_LOOP_TIME = asyncio.BaseEventLoop.time  # time.monotonic(), for every loop that keeps it
_monotonic = time.monotonic


class _LoopWatchdog:
    """The attempts in flight on one event loop (each AttemptWatchdog adds and removes itself);
    holds the loop weakly so a finished loop can go."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)
        # The guards in flight (a dict as an ordered set): each guard is its own entry, so arming
        # one allocates nothing beyond the guard itself.
        self._watches: dict[AttemptWatchdog, None] = {}
        self._armed = False  # a sweep is scheduled (a flag: a handle would hold the loop strongly)

    @property
    def in_flight(self) -> int:
        """How many guards this loop's sweep watches now (a finished attempt's is gone)."""
        return len(self._watches)

    @property
    def armed(self) -> bool:
        """Is a sweep scheduled? It stops once nothing is in flight."""
        return self._armed

    def _sweep(self) -> None:
        self._armed = False
        loop = self._loop()
        if loop is None:  # pragma: no cover - the loop runs this callback, so it is alive
            return
        now = loop.time()
        for watch in list(self._watches):
            if watch.expires_at <= now:
                del self._watches[watch]
                if not watch.task.done():
                    watch.fire()
        if self._watches:
            loop.call_later(SWEEP_INTERVAL, self._sweep)
            self._armed = True


_WATCHDOGS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWatchdog] = weakref.WeakKeyDictionary()
# The last loop used and its watchdog, checked first: a WeakKeyDictionary lookup is Python code.
_last: tuple[weakref.ref[asyncio.AbstractEventLoop], _LoopWatchdog] | None = None


def _watchdog(loop: asyncio.AbstractEventLoop) -> _LoopWatchdog:
    global _last
    last = _last
    if last is not None and last[0]() is loop:
        return last[1]
    dog = _WATCHDOGS.get(loop)
    if dog is None:
        dog = _WATCHDOGS[loop] = _LoopWatchdog(loop)
    _last = (weakref.ref(loop), dog)
    return dog


def loop_watchdog(loop: asyncio.AbstractEventLoop) -> _LoopWatchdog | None:
    """The sweep of ``loop`` (None: no attempt was ever guarded on it); read-only use, for tests."""
    return _WATCHDOGS.get(loop)


class AttemptWatchdog:
    """``with AttemptWatchdog(seconds):`` around one attempt's awaits (the current task's), or
    around one wait for the next stream chunk (re-armed per chunk for a few dict operations).

    On expiry the task is cancelled and the ``CancelledError`` that results becomes a
    ``TimeoutError``, as with ``asyncio.timeout``; a cancellation from elsewhere stays one.
    """

    __slots__ = ("_cancelling", "_dog", "_fired", "_seconds", "_what", "expires_at", "task")

    def __init__(self, seconds: float, what: str = "attempt") -> None:
        self._seconds = seconds
        self._what = what
        self._fired = False

    def __enter__(self) -> AttemptWatchdog:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("the attempt watchdog needs a running task")
        self.task: asyncio.Task[object] = task
        # loop time (asyncio's own loops read time.monotonic: called directly, one Python call fewer)
        now = _monotonic() if type(loop).time is _BASE_LOOP_TIME else loop.time()
        self.expires_at = now + self._seconds
        self._cancelling = task.cancelling()
        # Armed inline (the last loop's watchdog first): this runs on every attempt.
        last = _last
        dog = self._dog = last[1] if last is not None and last[0]() is loop else _watchdog(loop)
        dog._watches[self] = None
        if not dog._armed:
            loop.call_later(SWEEP_INTERVAL, dog._sweep)
            dog._armed = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._dog._watches.pop(self, None)
        if self._fired and exc_type is asyncio.CancelledError and self.task.uncancel() <= self._cancelling:
            raise TimeoutError(f"{self._what} exceeded {self._seconds:.2f}s") from exc

    def fire(self) -> None:
        """The bound passed: cancel the guarded task (the sweep calls this)."""
        self._fired = True
        self.task.cancel()

    @property
    def fired(self) -> bool:
        return self._fired
