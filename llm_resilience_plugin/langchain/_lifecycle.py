"""``close()``/``aclose()`` and ``with``/``async with`` for the LangChain models that may build their
own router (:class:`ResilientChatModel`, :class:`ResilientEmbeddings`).

A model given ``config=`` (or a ``model_list``) holds a lease on the router of that configuration,
shared with every other model built from the same one; closing the model gives its lease back and
the last lease closes the router (its private loop thread, LiteLLM's hook). A finalizer gives the
lease back if the model is collected unclosed - a safety net, not the way to close: collection
time is unpredictable (never, for a model kept in a reference cycle until the next collection).
A ``router=`` router belongs to the caller and is never closed by the model.
"""

from __future__ import annotations

import asyncio
from typing import Any, Self

__all__ = ["ClosesRouter"]


class ClosesRouter:
    """Context-manager and async-close support around a model's ``close()``."""

    def close(self) -> None:  # pragma: no cover - every model defines its own
        """Give back this model's hold on the router it built (idempotent)."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """:meth:`close` without blocking the caller's event loop (closing a router joins its
        private loop thread)."""
        await asyncio.to_thread(self.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()
