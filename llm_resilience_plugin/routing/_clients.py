"""The router's private loop, closed together with LiteLLM's HTTP clients bound to it.

LiteLLM caches its HTTP clients (an ``AsyncOpenAI`` per deployment, aiohttp sessions) per event
loop, process-wide, for ten minutes. The clients a router's blocking calls create belong to its
private loop; closing that loop alone leaves their connections open, and Python reports each as
an "unclosed transport" ``ResourceWarning`` when they are collected or at exit. Before the loop
stops, :class:`ClosingSyncRunner` closes the clients cached for it (no one else can use them:
only this router's calls run on that loop) and drops them from LiteLLM's cache.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Coroutine
from typing import Any

from llm_resilience_plugin import _litellm
from llm_resilience_plugin._engine.drivers import SyncRunner
from llm_resilience_plugin.routing._shutdown import closed_error

__all__ = ["ClosingSyncRunner", "close_loop_clients"]

_LOOP_THREAD = "llm-resilience-sync"  # the private loop's thread (SyncRunner names it)


async def close_loop_clients() -> int:
    """Close LiteLLM's cached clients bound to the running loop and remove them from its cache;
    returns how many were closed (0 on a LiteLLM without per-loop client keys: capability
    ``client_cache``)."""
    entries, drop = _litellm.loop_clients()
    closed = 0
    for key, client in entries:
        drop(key)
        closer = getattr(client, "aclose", None) or getattr(client, "close", None)
        if not callable(closer):
            continue
        try:
            result = closer()
            if inspect.isawaitable(result):
                await result
            closed += 1
        except Exception:  # a client that cannot close cleanly is left to LiteLLM's exit hook
            continue
    return closed


class ClosingSyncRunner(SyncRunner):
    """The router's :class:`SyncRunner`: on :meth:`close`, what still runs on its loop is
    cancelled and LiteLLM's clients of the loop are closed before it stops (only if a blocking
    call ever ran on it). Once closed it runs nothing more (no new loop thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.used = False
        self.closed = False

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the private loop (see :meth:`SyncRunner.run`)."""
        if self.closed:
            coro.close()  # never started: no "coroutine was never awaited" warning
            raise closed_error()
        self.used = True
        try:
            return super().run(coro)
        except (asyncio.CancelledError, concurrent.futures.CancelledError):
            if self.closed:  # cancelled by close() (a sync stream read while the router closed)
                raise closed_error() from None
            raise

    def close(self) -> None:
        """Cancel what runs on the private loop, close LiteLLM's clients of it, then the loop
        (idempotent)."""
        self.closed = True
        if self.used and threading.current_thread().name != _LOOP_THREAD:
            self.used = False
            try:
                super().run(self._wind_down())  # itself the task: wait_for's would be cancelled below
            except (Exception, asyncio.CancelledError):  # closing must not fail: the loop still stops
                pass
        super().close()

    async def _wind_down(self) -> None:
        """On the private loop: cancel what still runs there (a stream being read), then close
        LiteLLM's clients, so nothing in flight meets a closed client (a ``connection`` error)."""
        here = asyncio.current_task()
        left = [t for t in asyncio.all_tasks() if t is not here and not t.done()]
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left, timeout=1.0)
        await asyncio.wait_for(close_loop_clients(), 2.0)
