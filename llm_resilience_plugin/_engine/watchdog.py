"""The hard bound on every attempt: if LiteLLM's own timeout does not end an attempt (a provider
that trickles bytes, an SDK that ignores ``timeout``), the watchdog cancels it shortly after.

One sweep timer per event loop checks every attempt in flight, instead of one ``asyncio.timeout``
timer per attempt: a per-attempt timer costs a heap push, a context copy and a cancelled handle
left in the loop's heap, which is measurable on healthy calls (benchmarks/overhead.py).
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from dataclasses import dataclass

# How often the sweep runs while attempts are in flight; an overrun attempt ends at most this late.
SWEEP_INTERVAL = 0.05


@dataclass(slots=True)
class Watch:
    """One guarded attempt: its task and loop-time expiry; ``fired`` once the watchdog cancelled it."""

    task: asyncio.Task[object]
    expires_at: float
    fired: bool = False


class _LoopWatchdog:
    """The attempts in flight on one event loop; holds the loop weakly so a finished loop can go."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)
        self._watches: dict[int, Watch] = {}
        self._ids = itertools.count()
        self._armed = False  # a sweep is scheduled (a flag: a handle would hold the loop strongly)

    def add(self, loop: asyncio.AbstractEventLoop, seconds: float) -> tuple[int, Watch]:
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("the attempt watchdog needs a running task")
        watch = Watch(task, loop.time() + seconds)
        key = next(self._ids)
        self._watches[key] = watch
        if not self._armed:
            loop.call_later(SWEEP_INTERVAL, self._sweep)
            self._armed = True
        return key, watch

    def remove(self, key: int) -> None:
        self._watches.pop(key, None)

    def _sweep(self) -> None:
        self._armed = False
        loop = self._loop()
        if loop is None:  # pragma: no cover - the loop runs this callback, so it is alive
            return
        now = loop.time()
        for key, watch in list(self._watches.items()):
            if watch.expires_at <= now:
                del self._watches[key]
                if not watch.task.done():
                    watch.fired = True
                    watch.task.cancel()
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


class AttemptWatchdog:
    """``with AttemptWatchdog(seconds):`` around one attempt's awaits (the current task's), or
    around one wait for the next stream chunk (re-armed per chunk for a few dict operations).

    On expiry the task is cancelled and the ``CancelledError`` that results becomes a
    ``TimeoutError``, as with ``asyncio.timeout``; a cancellation from elsewhere stays one.
    """

    __slots__ = ("_cancelling", "_dog", "_key", "_seconds", "_watch", "_what")

    def __init__(self, seconds: float, what: str = "attempt") -> None:
        self._seconds = seconds
        self._what = what

    def __enter__(self) -> AttemptWatchdog:
        loop = asyncio.get_running_loop()
        dog = self._dog = _watchdog(loop)
        self._key, self._watch = dog.add(loop, self._seconds)
        self._cancelling = self._watch.task.cancelling()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._dog.remove(self._key)
        watch = self._watch
        if watch.fired and exc_type is asyncio.CancelledError and watch.task.uncancel() <= self._cancelling:
            raise TimeoutError(f"{self._what} exceeded {self._seconds:.2f}s") from exc

    @property
    def fired(self) -> bool:
        return self._watch.fired
