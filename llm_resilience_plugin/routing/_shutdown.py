"""A router's shutdown: new calls refused, calls in flight drained up to a grace period, then
cancelled as ``cancelled`` (a cancelled attempt counts against no breaker, locally or on Redis).

Closing LiteLLM's HTTP clients under requests in flight turns them into ``connection`` errors
that would be retried and counted, so the clients close only once nothing of this router runs.
Each call registers its task while it runs (:meth:`Shutdown.enter` / :meth:`Shutdown.leave`);
the grace is real time, not the router's clock (a shutdown is wall-clock bound). A stream is
watched from its opening to its end (:class:`StreamWatch`): the shutdown waits for streams being
read like for calls, then cuts them (the read in progress, or the next one, raises
:class:`RouterClosedError`; the report says ``cancelled``).
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from llm_resilience_plugin.errors import RouterClosedError

__all__ = ["DEFAULT_GRACE", "Shutdown", "StreamWatch", "closed_error", "cut_error"]

DEFAULT_GRACE = 10.0  # seconds close()/aclose() wait for calls in flight before cancelling them
_SETTLE = 2.0  # seconds to wait for cancelled calls to wind down (they only unwind)
_POLL = 0.005


def closed_error() -> RouterClosedError:
    """What a call made after close gets (nothing was sent)."""
    return RouterClosedError(
        "the router is closed (close()/aclose() was called): nothing was sent; build a new router"
    )


def cut_error(report: Any) -> RouterClosedError:
    """What a call or stream the shutdown cancelled raises (its report published as cancelled)."""
    return RouterClosedError(
        "the router was closed while this call was in flight: cancelled after the shutdown's "
        "grace period (it counts against no deployment)",
        report,
    )


class StreamWatch:
    """One stream of the router from its opening to its end (end of its chunks, ``aclose()``,
    an error, a cut, or being collected unread). ``reader``: the task reading a chunk right now;
    ``owner``: who read last (that task, or the thread of a blocking reader), which cannot read
    on while it is the one waiting for the shutdown. ``release`` runs once, at the end (the
    call's own credentials, held for scrubbing while the stream can still fail)."""

    __slots__ = ("__weakref__", "_release", "_stream", "blocking", "cut", "ended", "loop", "owner", "reader")

    def __init__(
        self,
        stream: Any,
        loop: asyncio.AbstractEventLoop,
        release: Callable[[], None] | None = None,
    ) -> None:
        self.loop = loop
        self.reader: asyncio.Task[Any] | None = None
        self.owner: object = None
        self.blocking = False  # read through a blocking iterator (owner: its thread)
        self.cut = False
        self.ended = False
        self._stream = weakref.ref(stream)  # not kept alive by the shutdown
        self._release = weakref.finalize(stream, release) if release is not None else None

    def reading(self, task: asyncio.Task[Any] | None) -> None:
        """A read starts in ``task`` (on :attr:`loop`)."""
        self.reader = task
        if not self.blocking:
            self.owner = task

    def end(self) -> None:
        """The stream ended (idempotent): the shutdown no longer waits for it."""
        self.ended = True
        self.reader = None
        if self._release is not None:
            self._release()

    def sever(self) -> None:
        """On :attr:`loop`: cancel the read in progress, or close the stream now (its next read
        raises :class:`RouterClosedError`)."""
        if self.ended:
            return
        self.cut = True
        reader = self.reader
        if reader is not None and not reader.done():
            reader.cancel()
            return
        stream = self._stream()
        if stream is None:
            self.end()
            return
        closing = self.loop.create_task(stream.aclose())
        closing.add_done_callback(lambda _: self.end())
        _CLOSING.add(closing)
        closing.add_done_callback(_CLOSING.discard)


_CLOSING: set[asyncio.Task[Any]] = set()  # cut streams being closed (a task needs a reference)


class Shutdown:
    """The calls of one router in flight, and whether it is closed."""

    def __init__(self) -> None:
        self.closed = False
        self._tasks: dict[asyncio.Task[Any], None] = {}
        self._cut: set[asyncio.Task[Any]] = set()  # cancelled by the shutdown, not by their caller
        self._streams: weakref.WeakSet[StreamWatch] = weakref.WeakSet()
        self._cutting = False  # the grace is over: what opens now is cut at once
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

    def watch(self, stream: Any, release: Callable[[], None] | None = None) -> StreamWatch:
        """Watch a stream just opened on the running loop (a shutdown already cutting cuts it)."""
        watch = StreamWatch(stream, asyncio.get_running_loop(), release)
        with self._lock:
            self._streams.add(watch)
            cutting = self._cutting
        if cutting:
            watch.sever()
        return watch

    def was_cut(self, task: asyncio.Task[Any] | None) -> bool:
        """Was ``task`` cancelled by the shutdown? Then its cancellation is taken back (the call
        raises :class:`RouterClosedError` instead; the caller's own task is not left cancelled)."""
        if task is None or task not in self._cut:
            return False
        task.uncancel()
        return True

    def _waited_for(self, here: asyncio.AbstractEventLoop | None, me: object = None) -> list[Any]:
        """The calls and streams in flight that can finish while we wait: not those on the loop we
        block, nor a stream whose reader is the one waiting (``me``: a task or a thread id)."""
        with self._lock:
            left: list[Any] = [t for t in self._tasks if t.get_loop() is not here and not t.done()]
            left.extend(
                w
                for w in self._streams
                if not w.ended
                and w.loop is not here
                and not w.loop.is_closed()
                and (w.reader is not None or w.owner is None or w.owner != me)
            )
        return left

    def _cancel_all(self) -> None:
        with self._lock:
            self._cutting = True
            tasks = [t for t in self._tasks if not t.done()]
            self._cut.update(tasks)
            streams = [w for w in self._streams if not w.ended]
        for task in tasks:
            loop = task.get_loop()
            if not loop.is_closed():
                loop.call_soon_threadsafe(task.cancel)
        for watch in streams:
            if not watch.loop.is_closed():
                watch.loop.call_soon_threadsafe(watch.sever)

    def drain(self, grace: float) -> None:
        """Blocking: close, wait up to ``grace`` seconds for the calls in flight, cancel the rest
        and wait for them to unwind. Calls on the caller's own running loop cannot progress while
        it blocks: they are cancelled at once (use ``aclose()`` there)."""
        self.closed = True
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        me = threading.get_ident()
        end = time.monotonic() + grace
        while self._waited_for(here, me) and time.monotonic() < end:
            time.sleep(_POLL)
        self._cancel_all()
        end = time.monotonic() + _SETTLE
        while self._waited_for(here, me) and time.monotonic() < end:
            time.sleep(_POLL)

    async def adrain(self, grace: float) -> None:
        """The async twin of :meth:`drain`: the calls on this loop go on while it waits."""
        self.closed = True
        await self._await_gone(grace)
        self._cancel_all()
        await self._await_gone(_SETTLE)

    async def _await_gone(self, seconds: float) -> None:
        me = asyncio.current_task()
        end = time.monotonic() + seconds
        while True:
            if not self._waited_for(None, me) or time.monotonic() >= end:
                return
            await asyncio.sleep(_POLL)
