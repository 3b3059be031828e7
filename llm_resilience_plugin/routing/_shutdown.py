"""A router's shutdown: new calls refused, calls in flight drained up to a grace period, then
cancelled as ``cancelled`` (a cancelled attempt counts against no breaker, locally or on Redis).

Closing LiteLLM's HTTP clients under requests in flight turns them into ``connection`` errors
that would be retried and counted, so the clients close only once nothing of this router runs.
Each call registers its task while it runs (:meth:`Shutdown.enter` / :meth:`Shutdown.leave`);
the grace is real time, not the router's clock (a shutdown is wall-clock bound).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from llm_resilience_plugin.errors import RouterClosedError

__all__ = ["DEFAULT_GRACE", "Shutdown", "closed_error"]

DEFAULT_GRACE = 10.0  # seconds close()/aclose() wait for calls in flight before cancelling them
_SETTLE = 2.0  # seconds to wait for cancelled calls to wind down (they only unwind)
_POLL = 0.005


def closed_error() -> RouterClosedError:
    """What a call made after close gets (nothing was sent)."""
    return RouterClosedError(
        "the router is closed (close()/aclose() was called): nothing was sent; build a new router"
    )


class Shutdown:
    """The calls of one router in flight, and whether it is closed."""

    def __init__(self) -> None:
        self.closed = False
        self._tasks: dict[asyncio.Task[Any], None] = {}
        self._cut: set[asyncio.Task[Any]] = set()  # cancelled by the shutdown, not by their caller
        self._lock = threading.Lock()

    def enter(self) -> asyncio.Task[Any] | None:
        """Register the running call's task (``RouterClosedError`` once closed)."""
        if self.closed:
            raise closed_error()
        task = asyncio.current_task()
        if task is not None:
            with self._lock:
                self._tasks[task] = None
        return task

    def leave(self, task: asyncio.Task[Any] | None) -> None:
        """The call ended (any way)."""
        if task is not None:
            with self._lock:
                self._tasks.pop(task, None)
                self._cut.discard(task)

    def loops(self) -> set[asyncio.AbstractEventLoop]:
        """The event loops the calls in flight run on."""
        with self._lock:
            return {task.get_loop() for task in self._tasks}

    def was_cut(self, task: asyncio.Task[Any] | None) -> bool:
        """Was ``task`` cancelled by the shutdown? Then its cancellation is taken back (the call
        raises :class:`RouterClosedError` instead; the caller's own task is not left cancelled)."""
        if task is None or task not in self._cut:
            return False
        task.uncancel()
        return True

    def _waited_for(self, here: asyncio.AbstractEventLoop | None) -> list[asyncio.Task[Any]]:
        """The calls in flight that can finish while we wait (not those on the loop we block)."""
        with self._lock:
            return [t for t in self._tasks if t.get_loop() is not here and not t.done()]

    def _cancel_all(self) -> None:
        with self._lock:
            tasks = [t for t in self._tasks if not t.done()]
            self._cut.update(tasks)
        for task in tasks:
            loop = task.get_loop()
            if not loop.is_closed():
                loop.call_soon_threadsafe(task.cancel)

    def drain(self, grace: float) -> None:
        """Blocking: close, wait up to ``grace`` seconds for the calls in flight, cancel the rest
        and wait for them to unwind. Calls on the caller's own running loop cannot progress while
        it blocks: they are cancelled at once (use ``aclose()`` there)."""
        self.closed = True
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        end = time.monotonic() + grace
        while self._waited_for(here) and time.monotonic() < end:
            time.sleep(_POLL)
        self._cancel_all()
        end = time.monotonic() + _SETTLE
        while self._waited_for(here) and time.monotonic() < end:
            time.sleep(_POLL)

    async def adrain(self, grace: float) -> None:
        """The async twin of :meth:`drain`: the calls on this loop go on while it waits."""
        self.closed = True
        await self._await_gone(grace)
        self._cancel_all()
        await self._await_gone(_SETTLE)

    async def _await_gone(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            if not self._waited_for(None) or time.monotonic() >= end:
                return
            await asyncio.sleep(_POLL)
