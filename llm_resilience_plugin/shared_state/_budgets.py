"""A model group's retry budget kept on Redis: one token bucket shared by the fleet.

Changes are summed locally and applied atomically (Lua, clamped to ``[0, capacity]``) in one
batch every ``sync_interval``; the request path never waits on Redis.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis

from llm_resilience_plugin._lua import read_lua
from llm_resilience_plugin.shared_state._common import KEY_TTL, text

if TYPE_CHECKING:
    from llm_resilience_plugin.shared_state._connection import RedisSharedState

BUCKET_SCRIPTS = {"bucket": read_lua("llm_resilience_plugin.shared_state", "bucket.lua")}


class RedisTokenBucket:
    """A model group's retry-budget bucket on Redis, shared by the fleet.

    ``add`` is local and instant; the background thread applies the summed changes atomically
    every ``sync_interval`` and reads back the fleet's level. ``tokens`` is that level plus this
    process's changes not yet applied, or None while Redis is unreachable (the
    :class:`~llm_resilience_plugin._engine.retry.RetryBudget` then uses its local bucket)."""

    def __init__(self, shared: RedisSharedState, key: str, capacity: float) -> None:
        self.shared = shared
        self.key = key
        self.capacity = float(capacity)
        self._mu = threading.Lock()
        self._pending = 0.0
        self._inflight = 0.0
        self._fleet: float | None = None

    def add(self, delta: float) -> None:
        with self._mu:
            self._pending += delta

    def tokens(self) -> float | None:
        fleet = self._fleet
        if fleet is None or not self.shared.available:
            return None
        return min(self.capacity, max(0.0, fleet + self._inflight + self._pending))

    def sync(self, pipe: Any) -> Callable[[Any], None]:
        with self._mu:
            delta, self._pending = self._pending, 0.0
            self._inflight = delta
        self.shared.queue(pipe, "bucket", [self.key], [repr(delta), repr(self.capacity), KEY_TTL])

        def done(replies: Any) -> None:
            with self._mu:
                self._fleet = float(text(replies[0]))
                self._inflight = 0.0

        return done

    def sync_failed(self) -> None:
        with self._mu:
            self._pending += self._inflight
            self._inflight = 0.0

    def reconnect(self) -> None:
        with self._mu:
            delta, self._pending = self._pending, 0.0
        try:
            value = self.shared.script("bucket")(
                keys=[self.key], args=[repr(delta), repr(self.capacity), KEY_TTL]
            )
        except redis.RedisError:
            with self._mu:
                self._pending += delta
            raise
        with self._mu:
            self._fleet = float(text(value))

    def reconnected(self) -> None:
        pass


__all__ = ["BUCKET_SCRIPTS", "RedisTokenBucket"]
