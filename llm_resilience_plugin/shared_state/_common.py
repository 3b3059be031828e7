"""What every shared-state module uses: the "Redis is unavailable" signal, key lifetimes and the
wire-format helpers (the Lua scripts in ``shared_state/lua/*.lua`` load through ``_lua``)."""

from __future__ import annotations

from typing import Any, Protocol

KEY_TTL = 7 * 86400  # breaker and bucket keys idle this long are forgotten


class SharedStateUnavailable(Exception):
    """Internal: Redis is unreachable (or this process is waiting out ``retry_interval``)."""


class Member(Protocol):
    """Something that keeps state on Redis for a :class:`RedisSharedState`.

    Members may also define ``sync_failed()``: called when a periodic sync did not reach Redis."""

    def sync(self, pipe: Any) -> Any:
        """Queue periodic commands on ``pipe``; return a callback for their replies (or None)."""

    def reconnect(self) -> None:
        """Redis is reachable again; push local state (may raise ``redis.RedisError``)."""

    def reconnected(self) -> None:
        """Requests use Redis again."""


def ms(seconds: float) -> int:
    """Seconds as whole milliseconds (the scripts' time unit)."""
    return round(seconds * 1000.0)


def text(value: Any) -> str:
    """A reply field as ``str`` (redis-py returns ``bytes`` unless ``decode_responses`` is set)."""
    return value.decode() if isinstance(value, bytes) else str(value)


__all__ = ["KEY_TTL", "Member", "SharedStateUnavailable", "ms", "text"]
