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
import inspect
import threading
from collections.abc import Coroutine
from typing import Any

from llm_resilience_plugin import _litellm
from llm_resilience_plugin._engine.drivers import SyncRunner

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
    """The router's :class:`SyncRunner`: on :meth:`close`, LiteLLM's clients of its loop are
    closed before the loop stops (only if a blocking call ever ran on it)."""

    def __init__(self) -> None:
        super().__init__()
        self.used = False

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the private loop (see :meth:`SyncRunner.run`)."""
        self.used = True
        return super().run(coro)

    def close(self) -> None:
        """Close LiteLLM's clients of the private loop, then the loop (idempotent)."""
        if self.used and threading.current_thread().name != _LOOP_THREAD:
            self.used = False
            try:
                super().run(asyncio.wait_for(close_loop_clients(), 2.0))
            except Exception:  # closing must not fail: the loop still stops
                pass
        super().close()
