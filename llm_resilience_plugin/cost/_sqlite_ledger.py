"""The SQLite ledger: WAL and ``BEGIN IMMEDIATE`` make reserve/settle atomic across threads and
processes on one machine, and spend survives restarts - including the spend of a process that
died mid-call: its expired reservations are settled at their estimate by the next reserve."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llm_resilience_plugin.cost._ledger import (
    REAPED_MEMORY,
    BudgetKey,
    KeyUsage,
    Ledger,
    Reservation,
    SpendEntry,
    SpendReport,
    from_nano,
    log_reaped,
    reaped_entry,
    refusal,
    to_nano,
)
from llm_resilience_plugin.errors import BudgetExceededError, ConfigError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS budget_keys (
    id TEXT PRIMARY KEY,
    budget TEXT NOT NULL,
    scope TEXT NOT NULL,
    win TEXT NOT NULL,
    limit_nano INTEGER NOT NULL,
    spent_nano INTEGER NOT NULL DEFAULT 0,
    reserved_nano INTEGER NOT NULL DEFAULT 0,
    expires_at REAL
);
CREATE INDEX IF NOT EXISTS budget_keys_budget ON budget_keys (budget, win);
CREATE TABLE IF NOT EXISTS reservations (
    id TEXT PRIMARY KEY,
    keys TEXT NOT NULL,
    amount_nano INTEGER NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    entry TEXT
);
CREATE INDEX IF NOT EXISTS reservations_expiry ON reservations (expires_at);
CREATE TABLE IF NOT EXISTS reaped (
    id TEXT PRIMARY KEY,
    keys TEXT NOT NULL,
    amount_nano INTEGER NOT NULL,
    spend_seq INTEGER,
    reaped_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS reaped_at ON reaped (reaped_at);
CREATE TABLE IF NOT EXISTS spend (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    day TEXT NOT NULL,
    month TEXT NOT NULL,
    cost_nano INTEGER NOT NULL,
    model TEXT,
    model_group TEXT,
    deployment_id TEXT,
    scopes TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    request_id TEXT,
    estimated INTEGER NOT NULL DEFAULT 0,
    reaped INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS spend_ts ON spend (ts);
CREATE TABLE IF NOT EXISTS alerts (
    key_id TEXT NOT NULL,
    threshold REAL NOT NULL,
    PRIMARY KEY (key_id, threshold)
);
"""

# Columns added since the first schema: (table, column, declaration), added to older files on open.
_ADDED_COLUMNS = (
    ("reservations", "entry", "TEXT"),
    ("spend", "reaped", "INTEGER NOT NULL DEFAULT 0"),
)

_INSERT_SPEND = (
    "INSERT INTO spend (ts, day, month, cost_nano, model, model_group, deployment_id, scopes,"
    " prompt_tokens, completion_tokens, request_id, estimated, reaped)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def _spend_row(entry: SpendEntry) -> tuple[Any, ...]:
    """``entry`` as the values of :data:`_INSERT_SPEND`."""
    return (
        entry.ts,
        entry.day,
        entry.month,
        to_nano(entry.cost),
        entry.model,
        entry.model_group,
        entry.deployment_id,
        json.dumps(dict(entry.scopes), sort_keys=True),
        int(entry.prompt_tokens),
        int(entry.completion_tokens),
        entry.request_id,
        int(entry.estimated),
        int(entry.reaped),
    )


class SQLiteLedger(Ledger):
    """A ledger in a SQLite file: WAL journal, every write in a ``BEGIN IMMEDIATE`` transaction.

    Reserve is atomic across the threads of this process and across processes sharing the file
    (on one machine; SQLite locking over network filesystems is unreliable). Each thread gets its
    own connection; a forked child opens new ones. ``busy_timeout`` is how long a writer waits
    for another process's transaction before ``sqlite3.OperationalError``.
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 30.0) -> None:
        if not isinstance(path, str | os.PathLike):
            raise ConfigError("ledger", f"expected a SQLite file path, got {type(path).__name__}")
        if isinstance(busy_timeout, bool) or not isinstance(busy_timeout, int | float):
            raise ConfigError("busy_timeout", "must be a number of seconds")
        self.path = str(path)
        if self.path != ":memory:":
            parent = Path(self.path).expanduser().resolve().parent
            if not parent.is_dir():
                raise ConfigError("ledger", f"directory {str(parent)!r} for the SQLite ledger does not exist")
        self.busy_timeout = float(busy_timeout)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._next_reap = 0.0
        self._conn()  # create the schema now: a bad path fails at configuration time

    # connections ---------------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        pid = os.getpid()
        if conn is not None and getattr(self._local, "pid", None) == pid:
            return conn
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        with _immediate(conn):
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            for table, column, decl in _ADDED_COLUMNS:
                if column not in {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
        self._local.conn = conn
        self._local.pid = pid
        with self._all_lock:
            self._all.append(conn)
        return conn

    def close(self) -> None:
        with self._all_lock:
            conns, self._all = self._all, []
        for c in conns:
            try:
                c.close()
            except sqlite3.Error:  # pragma: no cover - closing from another thread
                pass
        self._local = threading.local()

    # operations ----------------------------------------------------------------------------

    @staticmethod
    def _upsert(conn: sqlite3.Connection, key: BudgetKey) -> tuple[int, int]:
        conn.execute(
            "INSERT INTO budget_keys (id, budget, scope, win, limit_nano, expires_at)"
            " VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET limit_nano = excluded.limit_nano,"
            " expires_at = CASE WHEN excluded.expires_at IS NULL OR expires_at IS NULL"
            " THEN excluded.expires_at ELSE max(expires_at, excluded.expires_at) END",
            (key.id, key.budget, key.scope, key.window, to_nano(key.limit), key.expires_at),
        )
        row = conn.execute(
            "SELECT spent_nano, reserved_nano FROM budget_keys WHERE id = ?", (key.id,)
        ).fetchone()
        return int(row[0]), int(row[1])

    def reserve(
        self,
        keys: Sequence[BudgetKey],
        amount: float,
        *,
        now: float,
        ttl: float,
        entry: SpendEntry | None = None,
    ) -> Reservation:
        units = to_nano(amount)
        conn = self._conn()
        refused: BudgetExceededError | None = None
        with _immediate(conn):  # one transaction, committed even when the reservation is refused
            if now >= self._next_reap:
                self._reap(conn, now)  # (the reaping stands either way)
            for k in keys:
                spent, reserved = self._upsert(conn, k)
                if spent + reserved + units > to_nano(k.limit):
                    refused = refusal(k, spent, reserved, units)
                    break
            if refused is None:
                conn.executemany(
                    "UPDATE budget_keys SET reserved_nano = reserved_nano + ? WHERE id = ?",
                    [(units, k.id) for k in keys],
                )
                res = Reservation(uuid.uuid4().hex, tuple(keys), from_nano(units), now, now + ttl)
                conn.execute(
                    "INSERT INTO reservations (id, keys, amount_nano, created_at, expires_at, entry)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        res.id,
                        json.dumps([k.id for k in keys]),
                        units,
                        now,
                        res.expires_at,
                        None if entry is None else json.dumps(entry.to_dict(), sort_keys=True),
                    ),
                )
        if refused is not None:
            raise refused
        return res

    @staticmethod
    def _drop(conn: sqlite3.Connection, rid: str) -> bool:
        row = conn.execute("SELECT keys, amount_nano FROM reservations WHERE id = ?", (rid,)).fetchone()
        if row is None:
            return False
        conn.execute("DELETE FROM reservations WHERE id = ?", (rid,))
        conn.executemany(
            "UPDATE budget_keys SET reserved_nano = max(0, reserved_nano - ?) WHERE id = ?",
            [(int(row[1]), kid) for kid in json.loads(row[0])],
        )
        return True

    def _reap(self, conn: sqlite3.Connection, now: float) -> None:
        """Settle every expired reservation at its reserved amount (logged as reaped); forget
        idle keys and reaped reservations older than ``REAPED_MEMORY``."""
        self._next_reap = now + 1.0
        expired = conn.execute(
            "SELECT id, keys, amount_nano, created_at, expires_at, entry FROM reservations"
            " WHERE expires_at <= ?",
            (now,),
        ).fetchall()
        for rid, keys, units, created, expires, raw in expired:
            self._drop(conn, rid)
            kids = json.loads(keys)
            conn.executemany(
                "UPDATE budget_keys SET spent_nano = spent_nano + ? WHERE id = ?",
                [(int(units), kid) for kid in kids],
            )
            given = SpendEntry.from_dict(json.loads(raw)) if raw else None
            res = Reservation(rid, (), from_nano(int(units)), created, expires)
            seq = conn.execute(_INSERT_SPEND, _spend_row(reaped_entry(res, given))).lastrowid
            conn.execute(
                "INSERT OR REPLACE INTO reaped (id, keys, amount_nano, spend_seq, reaped_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (rid, keys, int(units), seq, now),
            )
            log_reaped(rid, res.amount, given, (kid.replace("\x1f", " ") for kid in kids))
        conn.execute("DELETE FROM reaped WHERE reaped_at <= ?", (now - REAPED_MEMORY,))
        conn.execute(
            "DELETE FROM budget_keys WHERE expires_at IS NOT NULL AND expires_at <= ? AND reserved_nano = 0",
            (now,),
        )

    @staticmethod
    def _unreap(conn: sqlite3.Connection, rid: str) -> int:
        """Take back a reaped reservation's spend-log row; returns the units it was settled at."""
        row = conn.execute("SELECT amount_nano, spend_seq FROM reaped WHERE id = ?", (rid,)).fetchone()
        if row is None:
            return 0
        conn.execute("DELETE FROM reaped WHERE id = ?", (rid,))
        conn.execute("DELETE FROM spend WHERE seq = ?", (row[1],))
        return int(row[0])

    def settle(
        self, reservation: Reservation, actual: float, entry: SpendEntry | None = None
    ) -> list[KeyUsage]:
        units = to_nano(actual)
        conn = self._conn()
        with _immediate(conn):
            self._drop(conn, reservation.id)
            delta = units - self._unreap(conn, reservation.id)
            for k in reservation.keys:
                self._upsert(conn, k)
            conn.executemany(
                "UPDATE budget_keys SET spent_nano = max(0, spent_nano + ?) WHERE id = ?",
                [(delta, k.id) for k in reservation.keys],
            )
            if entry is not None:
                conn.execute(_INSERT_SPEND, _spend_row(entry))
            return self._select(conn, [k.id for k in reservation.keys])

    def release(self, reservation: Reservation) -> None:
        conn = self._conn()
        with _immediate(conn):
            self._drop(conn, reservation.id)
            back = self._unreap(conn, reservation.id)
            if back:
                conn.executemany(
                    "UPDATE budget_keys SET spent_nano = max(0, spent_nano - ?) WHERE id = ?",
                    [(back, k.id) for k in reservation.keys],
                )

    @staticmethod
    def _rows(conn: sqlite3.Connection, ids: Sequence[str]) -> dict[str, KeyUsage]:
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        return {
            r[0]: _key_usage(r)
            for r in conn.execute(
                "SELECT id, budget, scope, win, spent_nano, reserved_nano, limit_nano"
                f" FROM budget_keys WHERE id IN ({marks})",
                list(ids),
            )
        }

    @classmethod
    def _select(cls, conn: sqlite3.Connection, ids: Sequence[str]) -> list[KeyUsage]:
        rows = cls._rows(conn, ids)
        return [rows[i] for i in ids if i in rows]

    def usage(self, keys: Sequence[BudgetKey]) -> list[KeyUsage]:
        found = self._rows(self._conn(), [k.id for k in keys])
        return [found.get(k.id) or KeyUsage(k.budget, k.scope, k.window, 0.0, 0.0, k.limit) for k in keys]

    def list_usage(self, budget: str | None = None, window: str | None = None) -> list[KeyUsage]:
        sql = (
            "SELECT id, budget, scope, win, spent_nano, reserved_nano, limit_nano FROM budget_keys WHERE 1=1"
        )
        args: list[Any] = []
        if budget is not None:
            sql += " AND budget = ?"
            args.append(budget)
        if window is not None:
            sql += " AND win = ?"
            args.append(window)
        return [_key_usage(r) for r in self._conn().execute(sql + " ORDER BY id", args)]

    def entries(self, since: float | None = None, until: float | None = None) -> list[SpendEntry]:
        sql = (
            "SELECT ts, day, month, cost_nano, model, model_group, deployment_id, scopes,"
            " prompt_tokens, completion_tokens, request_id, estimated, reaped FROM spend WHERE 1=1"
        )
        args: list[Any] = []
        if since is not None:
            sql += " AND ts >= ?"
            args.append(since)
        if until is not None:
            sql += " AND ts < ?"
            args.append(until)
        return [
            SpendEntry(
                ts=r[0],
                day=r[1],
                month=r[2],
                cost=from_nano(r[3]),
                model=r[4],
                model_group=r[5],
                deployment_id=r[6],
                scopes=json.loads(r[7]),
                prompt_tokens=r[8],
                completion_tokens=r[9],
                request_id=r[10],
                estimated=bool(r[11]),
                reaped=bool(r[12]),
            )
            for r in self._conn().execute(sql + " ORDER BY ts, seq", args)
        ]

    def report(self, since: float | None = None, until: float | None = None) -> SpendReport:
        """Aggregated in SQL (the spend log may hold millions of rows)."""
        where, args = "WHERE 1=1", []
        if since is not None:
            where += " AND ts >= ?"
            args.append(since)
        if until is not None:
            where += " AND ts < ?"
            args.append(until)
        conn = self._conn()
        rep = SpendReport()
        total, calls, pt, ct, reaped = conn.execute(
            "SELECT coalesce(sum(cost_nano), 0), count(*), coalesce(sum(prompt_tokens), 0),"
            f" coalesce(sum(completion_tokens), 0), coalesce(sum(reaped), 0) FROM spend {where}",
            args,
        ).fetchone()
        rep.total, rep.calls, rep.prompt_tokens, rep.completion_tokens = (
            from_nano(int(total)), int(calls), int(pt), int(ct)
        )  # fmt: skip
        rep.reaped = int(reaped)

        def grouped(column: str) -> dict[str, float]:
            rows = conn.execute(
                f"SELECT {column}, sum(cost_nano) FROM spend {where} AND {column} IS NOT NULL"
                f" GROUP BY {column} ORDER BY {column}",
                args,
            )
            return {str(k): from_nano(int(v)) for k, v in rows}

        rep.by_day = grouped("day")
        rep.by_month = grouped("month")
        rep.by_model = grouped("model")
        rep.by_model_group = grouped("model_group")
        rep.by_deployment = grouped("deployment_id")
        rep.by_scope = {
            str(k): from_nano(int(v))
            for k, v in conn.execute(
                "SELECT j.key || '=' || j.value AS scope, sum(spend.cost_nano)"
                f" FROM spend, json_each(spend.scopes) AS j {where} GROUP BY scope ORDER BY scope",
                args,
            )
        }
        return rep

    def mark_alert(self, key: BudgetKey, threshold: float) -> bool:
        conn = self._conn()
        with _immediate(conn):
            cur = conn.execute(
                "INSERT OR IGNORE INTO alerts (key_id, threshold) VALUES (?, ?)",
                (key.id, float(threshold)),
            )
            return cur.rowcount == 1

    def prune(self, now: float) -> None:
        conn = self._conn()
        with _immediate(conn):
            self._reap(conn, now)
            conn.execute("DELETE FROM alerts WHERE key_id NOT IN (SELECT id FROM budget_keys)")

    def __repr__(self) -> str:
        return f"SQLiteLedger({self.path!r})"


def _key_usage(r: Sequence[Any]) -> KeyUsage:
    return KeyUsage(
        budget=r[1],
        scope=r[2],
        window=r[3],
        spent=from_nano(int(r[4])),
        reserved=from_nano(int(r[5])),
        limit=from_nano(int(r[6])),
    )


class _immediate:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on any exception)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.conn.execute("COMMIT")
        else:
            self.conn.execute("ROLLBACK")
