"""Open a spend ledger from its spec (``"memory"``, a SQLite path or URL, a Redis URL).

Kept apart from :mod:`~llm_resilience_plugin.cost._ledger` because it picks among the backends that
build on that module; living there made the ledger modules import each other.
"""

from __future__ import annotations

import os

from llm_resilience_plugin.cost import _redis_ledger
from llm_resilience_plugin.cost._ledger import Ledger, MemoryLedger
from llm_resilience_plugin.cost._sqlite_ledger import SQLiteLedger
from llm_resilience_plugin.errors import ConfigError


def open_ledger(spec: Ledger | str | os.PathLike[str] | None) -> Ledger:
    """A ledger from ``None``/``"memory"`` (in memory), ``"sqlite:///path/to/spend.db"``
    (``sqlite:////abs/path`` for an absolute path), a plain ``*.db``/``*.sqlite`` path,
    ``"redis://host:6379/0"`` (:class:`~llm_resilience_plugin.cost.RedisLedger`), or a
    :class:`Ledger` instance."""
    if spec is None:
        return MemoryLedger()
    if isinstance(spec, Ledger):
        return spec
    if isinstance(spec, os.PathLike):
        return SQLiteLedger(spec)
    if not isinstance(spec, str):
        raise ConfigError(
            "ledger",
            f"expected 'memory', 'sqlite:///path.db' or a Ledger instance, got {type(spec).__name__}",
        )
    if spec in ("memory", "memory://", ":memory:"):
        return MemoryLedger()
    if spec.startswith("sqlite:///"):
        return SQLiteLedger(spec[len("sqlite:///") :])
    if spec.startswith(("redis://", "rediss://", "unix://")):
        # Looked up on the module at call time; the Redis ledger needs redis-py only once built.
        return _redis_ledger.RedisLedger(spec)
    if spec.endswith((".db", ".sqlite", ".sqlite3")):
        return SQLiteLedger(spec)
    raise ConfigError(
        "ledger",
        f"unknown ledger {spec!r}; use 'memory', 'sqlite:///path/to/spend.db', 'redis://host:6379' "
        "or a Ledger instance",
    )


__all__ = ["open_ledger"]
