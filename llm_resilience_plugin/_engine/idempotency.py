"""Idempotency: a key per logical request, and an optional store that returns the stored result
of a completed key within a TTL, so a caller's retry neither pays nor acts twice.

A key is scoped (:func:`scoped_key`): the store and single-flight see it together with the call's
tenant (when one is set), operation and model group, so one tenant's ``order-42`` never answers
another's, nor an embedding a chat. Each stored answer keeps its request's content fingerprint;
the same key with other content is an :class:`IdempotencyConflictError`, never the other answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from llm_resilience_plugin.errors import ConfigError, IdempotencyConflictError

# Arguments that change the answer; the rest (timeouts, metadata, callbacks) do not.
_FINGERPRINT_KEYS = (
    "tools",
    "tool_choice",
    "response_format",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "user",
    # the other endpoints' answer-shaping arguments (transcription, speech, rerank)
    "documents",
    "top_n",
    "rank_fields",
    "return_documents",
    "voice",
    "speed",
    "instructions",
    "language",
    "prompt",
    "timestamp_granularities",
)


def fingerprint(group: str, messages: Any, kwargs: Mapping[str, Any]) -> str:
    """A stable content key: the group, the messages and the answer-shaping arguments."""
    payload = {
        "group": group,
        "messages": messages,
        **{k: kwargs[k] for k in _FINGERPRINT_KEYS if k in kwargs},
    }
    raw = json.dumps(payload, sort_keys=True, default=str, separators=(",", ":"))
    return "fp-" + hashlib.sha256(raw.encode()).hexdigest()[:32]


DEFAULT_SCOPE_KEYS = ("tenant",)


def scope_of(metadata: Any, keys: tuple[str, ...]) -> str:
    """The call's scope: each of ``keys`` found in its metadata (or a ``key:value`` tag)."""
    if not keys or not isinstance(metadata, Mapping):
        return ""
    tags = metadata.get("tags")
    parts = []
    for key in keys:
        value = metadata.get(key)
        if value is None and isinstance(tags, list | tuple):
            value = next(
                (t[len(key) + 1 :] for t in tags if isinstance(t, str) and t.startswith(f"{key}:")), None
            )
        if value is not None:
            parts.append(f"{key}={value}")
    return "&".join(parts)


def scoped_key(scope: str, operation: str, group: str, key: str) -> str:
    """The key the store and single-flight use: the caller's key within its scope, operation and
    model group (hashed: a tenant's name or a caller's key never reaches a store in clear)."""
    raw = json.dumps([scope, operation, group, key], separators=(",", ":"))
    return "idem-" + hashlib.sha256(raw.encode()).hexdigest()[:40]


def check_content(key: str, entry: Mapping[str, Any], content: str) -> None:
    """Refuse to answer from ``entry`` (stored or in flight) a request with other content."""
    if entry.get("fingerprint") != content:
        raise IdempotencyConflictError(key)


class IdempotencyStore(Protocol):
    """Completed results by key, each with an expiry."""

    def get(self, key: str) -> dict[str, Any] | None: ...

    def put(self, key: str, value: dict[str, Any], ttl: float) -> None: ...


class MemoryIdempotencyStore:
    """In-process store (thread-safe), pruned lazily."""

    def __init__(self, clock: Callable[[], float] = time.time, max_entries: int = 10_000) -> None:
        self._clock = clock
        self._data: dict[str, tuple[float, dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._max = max_entries

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            hit = self._data.get(key)
            if hit is None:
                return None
            if hit[0] < self._clock():
                del self._data[key]
                return None
            return hit[1]

    def put(self, key: str, value: dict[str, Any], ttl: float) -> None:
        now = self._clock()
        with self._lock:
            data = self._data
            while data:  # the oldest entries first: expired ones go as new ones come (amortised O(1))
                first = next(iter(data))
                if data[first][0] >= now:
                    break
                del data[first]
            if len(self._data) >= self._max:
                for k in [k for k, (exp, _) in self._data.items() if exp < now] or list(self._data)[:1]:
                    del self._data[k]
            self._data.pop(key, None)  # re-inserted at the end: the order stays oldest first
            self._data[key] = (now + ttl, value)


class SQLiteIdempotencyStore:
    """Persistent store in one SQLite file (WAL), safe across threads and processes."""

    def __init__(self, path: str | Path, clock: Callable[[], float] = time.time) -> None:
        self.path = str(path)
        self._clock = clock
        self._local = threading.local()
        with self._conn() as c:
            c.execute(
                "CREATE TABLE IF NOT EXISTS idempotency "
                "(key TEXT PRIMARY KEY, expires_at REAL NOT NULL, value TEXT NOT NULL)"
            )

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    def get(self, key: str) -> dict[str, Any] | None:
        row = (
            self._conn().execute("SELECT expires_at, value FROM idempotency WHERE key = ?", (key,)).fetchone()
        )
        if row is None or row[0] < self._clock():
            return None
        return json.loads(row[1])  # type: ignore[no-any-return]

    def put(self, key: str, value: dict[str, Any], ttl: float) -> None:
        now = self._clock()
        conn = self._conn()
        conn.execute(
            "INSERT OR REPLACE INTO idempotency (key, expires_at, value) VALUES (?, ?, ?)",
            (key, now + ttl, json.dumps(value, default=str)),
        )
        conn.execute("DELETE FROM idempotency WHERE expires_at < ?", (now,))


def open_store(spec: str | IdempotencyStore | None) -> IdempotencyStore | None:
    """``"memory"``, ``"sqlite:///path.db"``, a store object, or None."""
    if spec is None or not isinstance(spec, str):
        return spec
    if spec == "memory":
        return MemoryIdempotencyStore()
    if spec.startswith("sqlite:///"):
        return SQLiteIdempotencyStore(spec.removeprefix("sqlite:///"))
    raise ConfigError("idempotency_store", "expected 'memory', 'sqlite:///path.db' or a store object")


class SingleFlight:
    """Concurrent calls with one (scoped) key share one upstream request (per event loop); a
    follower whose content differs from the leader's is refused (:func:`check_content`)."""

    def __init__(self) -> None:
        self._inflight: dict[tuple[int, str], tuple[asyncio.Future[Any], str]] = {}

    def join(self, key: str) -> tuple[asyncio.Future[Any], str] | None:
        """The leader's future and its content fingerprint, if a call with ``key`` is in flight."""
        return self._inflight.get((id(asyncio.get_running_loop()), key))

    def lead(self, key: str, content: str) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._inflight[(id(loop), key)] = (fut, content)
        return fut

    def done(self, key: str) -> None:
        self._inflight.pop((id(asyncio.get_running_loop()), key), None)
