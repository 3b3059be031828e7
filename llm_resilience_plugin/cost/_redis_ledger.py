"""The cost ledger on Redis: one set of budgets that every worker of a fleet reserves and settles
against, with the same windows and scopes as the SQLite ledger.

``reserve``/``settle``/``release`` are single Lua scripts (``cost/lua/*.lua``), atomic over all
the keys of a call and idempotent per reservation id. ``reserve`` reaps expired reservations
first: each becomes spend at its reserved amount, logged as a reaped entry (a worker that died
mid-call does not lose its spend); a late settle or release replaces that estimate. The ledger
runs on shared_state's connection layer
(:class:`~llm_resilience_plugin.shared_state.RedisSharedState`: health, background thread,
reconnection), which is imported only when a ledger is built, so ``llm_resilience_plugin.cost``
works without redis-py (the ``redis`` extra).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from llm_resilience_plugin._lua import read_lua
from llm_resilience_plugin.cost._ledger import (
    BudgetKey,
    KeyUsage,
    Ledger,
    MemoryLedger,
    Reservation,
    SpendEntry,
    from_nano,
    logger,
    reaped_entry,
    refusal,
    to_nano,
)
from llm_resilience_plugin.errors import BudgetExceededError, ConfigError
from llm_resilience_plugin.policy import SharedStatePolicy

if TYPE_CHECKING:
    from llm_resilience_plugin.shared_state import RedisSharedState

T = TypeVar("T")

DONE_TTL = 86400  # settled/released reservation ids remembered for idempotent replays
KNOWN_KEYS = 10_000  # budget keys whose last usage a ledger remembers (to seed a local ledger)
_FIELDS = ("budget", "scope", "win", "spent", "reserved", "limit")  # one key's row, as the scripts return it


# The ledger scripts by name; each starts with the shared helpers (drop, reap, upsert, row).
LEDGER_SCRIPTS = {
    f"ledger_{name}": read_lua("llm_resilience_plugin.cost", "ledger_lib.lua", f"{file}.lua")
    for name, file in (
        ("reserve", "reserve"),
        ("settle", "settle"),
        ("release", "release_reservation"),
        ("prune", "prune"),
    )
}


class LedgerUnavailableError(BudgetExceededError):
    """The shared cost ledger is unreachable and budgets fail closed: the attempt is refused
    before any request is sent (a :class:`BudgetExceededError`, so it is never retried on the
    same group and never counts against a deployment)."""

    def __init__(self, reason: str) -> None:
        super().__init__("shared ledger", 0.0, 0.0, 0.0)
        self.reason = reason
        self.args = (
            f"cost ledger on Redis unavailable ({reason}); metered calls are refused until it "
            "is back (resilience.shared_state.ledger_on_error='fail_closed'; 'local' spends on a "
            "local ledger and reconciles instead)",
        )

    def __str__(self) -> str:
        return str(self.args[0])


def _shared_state(
    target: str | RedisSharedState, settings: SharedStatePolicy | Mapping[str, Any] | None
) -> RedisSharedState:
    """The connection layer for ``target`` (a URL or an instance), imported on first use."""
    try:
        from llm_resilience_plugin.shared_state import RedisSharedState
    except ImportError as e:
        raise ConfigError(
            "ledger", f"a Redis ledger needs redis-py: pip install 'llm-resilience-plugin[redis]' ({e})"
        ) from None
    if isinstance(target, RedisSharedState):
        return target
    if isinstance(target, str):
        return RedisSharedState.get(target, settings)
    raise ConfigError("ledger", "expected a redis:// URL or a RedisSharedState")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _key_args(k: BudgetKey) -> list[Any]:
    return [
        k.id,
        k.budget,
        k.scope,
        k.window,
        to_nano(k.limit),
        "" if k.expires_at is None else repr(k.expires_at),
    ]


def _usage_rows(flat: Sequence[Any], keys: Sequence[BudgetKey]) -> list[KeyUsage]:
    out = []
    for j, k in enumerate(keys):
        budget, scope, win, spent, reserved, limit = flat[j * 6 : j * 6 + 6]
        out.append(
            KeyUsage(
                budget=_text(budget) if budget is not None else k.budget,
                scope=_text(scope) if scope is not None else k.scope,
                window=_text(win) if win is not None else k.window,
                spent=from_nano(int(spent or 0)),
                reserved=from_nano(int(reserved or 0)),
                limit=from_nano(int(limit)) if limit is not None else k.limit,
            )
        )
    return out


def _entry_json(entry: SpendEntry) -> str:
    d = entry.to_dict()
    d["cost_nano"] = to_nano(entry.cost)
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def _entry_from(member: str) -> SpendEntry:
    return SpendEntry.from_dict(json.loads(member.split("|", 1)[1]))


def _log_reaped_remote(count: int, units: int) -> None:
    """Log that a reserve reaped ``count`` expired reservations of the fleet into spend."""
    logger.warning(
        "reservation_reaped",
        extra={
            "llm_event_name": "reservation_reaped",
            "llm_event": {"reservations": count, "amount": from_nano(units)},
        },
    )


@dataclass(slots=True)
class _Op:
    kind: str  # "settle" | "release"
    reservation: Reservation
    actual: float = 0.0
    entry: SpendEntry | None = None


class RedisLedger(Ledger):
    """The cost guard's ledger on Redis: every worker reserves and settles against one set of
    budgets. ``reserve``/``settle``/``release`` are each one Lua script (atomic over all keys)
    and idempotent per reservation id, so a replay after a lost reply never double counts.

    Redis unreachable (``on_error``, default from ``resilience.shared_state.ledger_on_error``):

    * ``"fail_closed"`` (default): ``reserve`` raises :class:`LedgerUnavailableError` (a
      ``BudgetExceededError``: the attempt is refused before anything is sent);
    * ``"local"``: reserve against a local ledger seeded with the last usage this process saw
      (each process may then spend up to the remaining budget on its own: bounded overspend).

    Either way ``settle``/``release`` never raise and never lose spend: they are journaled in
    memory and replayed (idempotently) as soon as Redis answers again, before new reservations
    are allowed. A process that dies while Redis is down loses its journal (and its unsettled
    reservations expire after ``reservation_ttl``).

    Needs a single Redis primary (the scripts derive key names, so Redis Cluster is not supported).
    Use a persistent Redis (AOF, ``appendfsync everysec`` or ``always``) for money.
    """

    def __init__(
        self,
        redis_url: str | RedisSharedState,
        *,
        namespace: str | None = None,
        on_error: str | None = None,
        settings: SharedStatePolicy | Mapping[str, Any] | None = None,
        done_ttl: float = DONE_TTL,
    ) -> None:
        shared = _shared_state(redis_url, settings)
        mode = on_error or shared.settings.ledger_on_error
        if mode not in ("fail_closed", "local"):
            raise ConfigError("on_error", f"expected 'fail_closed' or 'local', got {mode!r}")
        self.shared = shared
        self.on_error = mode
        self.prefix = f"{namespace or shared.namespace}:ledger"
        self.done_ttl = int(done_ttl)
        self._lock = threading.Lock()
        self._journal: deque[_Op] = deque()
        # key id -> (spent, reserved) as last seen, for the local ledger's seed (bounded LRU)
        self._known: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._local: MemoryLedger | None = None
        self._seeded: set[str] = set()
        # reservations made on the local ledger: our id -> (that ledger, its reservation)
        self._local_res: dict[str, tuple[MemoryLedger, Reservation]] = {}
        shared.load_scripts(LEDGER_SCRIPTS)
        shared.register(self)

    # -- helpers -----------------------------------------------------------------------------

    def _run(self, script: str, args: Sequence[Any]) -> Any:
        return self.shared.run(script, [self.prefix], args)

    def _remember_key(self, key_id: str, spent: int, reserved: int) -> None:
        known = self._known
        known[key_id] = (spent, reserved)
        known.move_to_end(key_id)
        while len(known) > KNOWN_KEYS:
            known.popitem(last=False)

    def _remember(self, usages: Sequence[KeyUsage], keys: Sequence[BudgetKey]) -> None:
        for k, u in zip(keys, usages, strict=False):
            self._remember_key(k.id, to_nano(u.spent), to_nano(u.reserved))

    @property
    def journal_size(self) -> int:
        """Settlements/releases waiting for Redis."""
        return len(self._journal)

    # -- Ledger ------------------------------------------------------------------------------

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
        res = Reservation(uuid.uuid4().hex, tuple(keys), from_nano(units), now, now + ttl)
        if self.shared.available and not self._journal:
            args: list[Any] = [res.id, units, repr(now), repr(res.expires_at), len(keys)]
            for k in keys:
                args.extend(_key_args(k))
            if_reaped = reaped_entry(res, entry)  # what the log says if this one is reaped in turn
            args += [f"{res.id}|{_entry_json(if_reaped)}", repr(if_reaped.ts), self.done_ttl]
            try:
                r = self._run("ledger_reserve", args)
            except self.shared.Unavailable:
                # The reply may have been lost after Redis applied it: make sure it is dropped.
                self._journal.append(_Op("release", res))
            else:
                status = _text(r[0])
                if status == "refused":
                    k = keys[int(r[1]) - 1]
                    spent, reserved = int(r[2]), int(r[3])
                    self._remember_key(k.id, spent, reserved)
                    raise refusal(k, spent, reserved, units)
                if status == "ok" and len(r) > 1 and int(r[1]):
                    _log_reaped_remote(int(r[1]), int(r[2]))
                return res
        if self.on_error == "fail_closed":
            raise LedgerUnavailableError(self.shared.down_reason or "reconnecting")
        return self._reserve_local(keys, res, now, ttl, entry)

    def _reserve_local(
        self, keys: Sequence[BudgetKey], res: Reservation, now: float, ttl: float, entry: SpendEntry | None
    ) -> Reservation:
        with self._lock:
            local = self._local
            if local is None:
                local = self._local = MemoryLedger()
                self._seeded = set()
            for k in keys:
                if k.id not in self._seeded:
                    self._seeded.add(k.id)
                    spent, reserved = self._known.get(k.id, (0, 0))
                    if spent + reserved:  # what the fleet had spent or held when Redis went away
                        seed = Reservation(f"seed-{k.id}", (k,), 0.0, now, now)
                        local.settle(seed, from_nano(spent + reserved))
        got = local.reserve(keys, res.amount, now=now, ttl=ttl, entry=entry)
        with self._lock:
            self._local_res[res.id] = (local, got)
        return Reservation(res.id, got.keys, got.amount, got.created_at, got.expires_at)

    def settle(
        self, reservation: Reservation, actual: float, entry: SpendEntry | None = None
    ) -> list[KeyUsage]:
        units = to_nano(actual)
        local_usage: list[KeyUsage] | None = None
        with self._lock:
            held = self._local_res.pop(reservation.id, None)
        if held is not None:
            local_usage = held[0].settle(held[1], actual)
        if self.shared.available and not self._journal:
            try:
                return self._settle_remote(reservation, units, entry)
            except self.shared.Unavailable:
                pass
        self._journal.append(_Op("settle", reservation, actual, entry))
        if local_usage is not None:
            return local_usage
        out = []
        for k in reservation.keys:
            spent, reserved = self._known.get(k.id, (0, 0))
            spent += units
            self._remember_key(k.id, spent, reserved)
            out.append(KeyUsage(k.budget, k.scope, k.window, from_nano(spent), from_nano(reserved), k.limit))
        return out

    def _settle_remote(
        self, reservation: Reservation, units: int, entry: SpendEntry | None
    ) -> list[KeyUsage]:
        ts = "" if entry is None else repr(entry.ts)
        member = "" if entry is None else f"{reservation.id}|{_entry_json(entry)}"
        args: list[Any] = [reservation.id, units, self.done_ttl, ts, member, len(reservation.keys)]
        for k in reservation.keys:
            args.extend(_key_args(k))
        r = self._run("ledger_settle", args)
        rows = _usage_rows(r[1:], reservation.keys)
        self._remember(rows, reservation.keys)
        return rows

    def release(self, reservation: Reservation) -> None:
        with self._lock:
            held = self._local_res.pop(reservation.id, None)
        if held is not None:
            held[0].release(held[1])
            return  # never reached Redis
        if self.shared.available and not self._journal:
            try:
                self._run("ledger_release", [reservation.id, self.done_ttl])
                return
            except self.shared.Unavailable:
                pass
        self._journal.append(_Op("release", reservation))

    def _read(self, fn: Callable[[Any], T]) -> T:
        """Run read commands now, or raise :class:`LedgerUnavailableError` (Redis unreachable)."""
        try:
            return self.shared.command(fn)
        except self.shared.Unavailable as e:
            raise LedgerUnavailableError(self.shared.down_reason or "reconnecting") from e.__cause__

    def usage(self, keys: Sequence[BudgetKey]) -> list[KeyUsage]:
        def read(client: Any) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for k in keys:
                pipe.hmget(f"{self.prefix}:k:{k.id}", *_FIELDS)
            return list(pipe.execute())

        rows = self._read(read)
        out = []
        for k, row in zip(keys, rows, strict=True):
            if row[0] is None:
                out.append(KeyUsage(k.budget, k.scope, k.window, 0.0, 0.0, k.limit))
            else:
                out.extend(_usage_rows(row, [k]))
        return out

    def list_usage(self, budget: str | None = None, window: str | None = None) -> list[KeyUsage]:
        def read(client: Any) -> list[Any]:
            ids = sorted(_text(i) for i in client.smembers(f"{self.prefix}:keys"))
            pipe = client.pipeline(transaction=False)
            for i in ids:
                pipe.hmget(f"{self.prefix}:k:{i}", *_FIELDS)
            return list(pipe.execute())

        rows = self._read(read)
        out = []
        for row in rows:
            if row[0] is None or row[5] is None:
                continue
            u = _usage_rows(row, [BudgetKey("", "", "", 0.0)])[0]
            if (budget is None or u.budget == budget) and (window is None or u.window == window):
                out.append(u)
        return out

    def entries(self, since: float | None = None, until: float | None = None) -> list[SpendEntry]:
        lo = "-inf" if since is None else repr(since)
        hi = "+inf" if until is None else f"({until!r}"
        members = self._read(lambda client: client.zrangebyscore(f"{self.prefix}:log", lo, hi))
        return [_entry_from(_text(m)) for m in members]

    def mark_alert(self, key: BudgetKey, threshold: float) -> bool:
        if not self.shared.available:
            return False  # checked again at the next settlement, once Redis answers
        try:
            return bool(
                self.shared.command(
                    lambda client: client.sadd(f"{self.prefix}:a:{key.id}", repr(float(threshold)))
                )
            )
        except self.shared.Unavailable:
            return False

    def prune(self, now: float) -> None:
        try:
            self._run("ledger_prune", [repr(now), self.done_ttl])
        except self.shared.Unavailable:
            pass

    def close(self) -> None:
        """Nothing to close: the connection pool belongs to the shared state (journaled
        settlements are still replayed while the process lives)."""

    # -- reconnection --------------------------------------------------------------------------

    def _replay(self) -> None:
        """Apply the journal in order (idempotent); stops at the first Redis error."""
        while True:
            with self._lock:
                if not self._journal:
                    return
                op = self._journal[0]
            res = op.reservation
            if op.kind == "settle":
                ts = "" if op.entry is None else repr(op.entry.ts)
                member = "" if op.entry is None else f"{res.id}|{_entry_json(op.entry)}"
                args: list[Any] = [res.id, to_nano(op.actual), self.done_ttl, ts, member, len(res.keys)]
                for k in res.keys:
                    args.extend(_key_args(k))
                self.shared.script("ledger_settle")(keys=[self.prefix], args=args)
            else:
                self.shared.script("ledger_release")(keys=[self.prefix], args=[res.id, self.done_ttl])
            with self._lock:
                if self._journal and self._journal[0] is op:
                    self._journal.popleft()

    def sync(self, pipe: Any) -> None:
        if self._journal:
            try:
                self.shared.command(lambda _client: self._replay())
            except self.shared.Unavailable:
                pass  # marked down: replayed on reconnection
        return None

    def reconnect(self) -> None:
        self._replay()

    def reconnected(self) -> None:
        with self._lock:
            self._local = None  # its reservations settle straight to Redis from now on

    def __repr__(self) -> str:
        url = self.shared.redacted_url
        return f"RedisLedger({url!r}, prefix={self.prefix!r}, on_error={self.on_error!r})"


__all__ = ["DONE_TTL", "KNOWN_KEYS", "LEDGER_SCRIPTS", "LedgerUnavailableError", "RedisLedger"]
