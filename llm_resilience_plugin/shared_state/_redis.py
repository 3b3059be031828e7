"""Shared state on Redis: circuit breakers, retry budgets and the cost ledger, one view per fleet.

Every worker process (uvicorn/gunicorn workers, hosts) that points at the same Redis and
namespace shares:

* **breakers** (:class:`RedisBreakerBackend`): pybreaker's state machine as Lua scripts, one
  atomic round trip per admit / success / failure / release, the generation kept in Redis (a
  stale outcome from any process is ignored) and half-open probes counted fleet-wide as leases
  that expire (a crashed worker cannot hold a probe forever). Keys follow pybreaker's
  ``CircuitRedisStorage`` naming (``{ns}:pybreaker:state`` ...), so ``pybreaker`` tooling can read
  them.
* **retry budgets** (:class:`RedisTokenBucket`): one token bucket per model group; changes are
  applied atomically (Lua, clamped to ``[0, capacity]``) in batches every ``sync_interval``.
* **the cost ledger** (:class:`RedisLedger`): reservations, settlements, the spend log and alerts
  with the same windows and scopes as the SQLite ledger; ``reserve``/``settle``/``release`` are
  single Lua scripts and idempotent per reservation id.

The request path never waits on Redis for reads: breaker state is served from a cache that a
background thread refreshes every ``sync_interval`` (and that every write refreshes from its
reply). Writes that must be atomic fleet-wide (a failure, a probe, a reservation, a settlement)
are synchronous calls with a short ``socket_timeout``. After any Redis error the process runs on
local state for ``retry_interval`` seconds without touching the network; the background thread
then reconnects, pushes what happened locally (a breaker tripped, spend settled) and switches back.
See docs/scaling-out.md for the semantics.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import uuid
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from llm_resilience_plugin._engine.breakers import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    Admission,
    BreakerBackend,
    BreakerView,
    Change,
    MemoryBreakerBackend,
)
from llm_resilience_plugin.cost._ledger import (
    BudgetKey,
    KeyUsage,
    Ledger,
    MemoryLedger,
    Reservation,
    SpendEntry,
    from_nano,
    to_nano,
)
from llm_resilience_plugin.errors import BudgetExceededError, ConfigError
from llm_resilience_plugin.policy import BreakerPolicy, SharedStatePolicy

logger = logging.getLogger("llm_resilience.shared_state")

KEY_TTL = 7 * 86400  # breaker and bucket keys idle this long are forgotten
DONE_TTL = 86400  # settled/released reservation ids remembered for idempotent replays
KNOWN_KEYS = 10_000  # budget keys whose last usage a ledger remembers (to seed a local ledger)


class SharedStateUnavailable(Exception):
    """Internal: Redis is unreachable (or this process is waiting out ``retry_interval``)."""


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


class _Member(Protocol):
    """Something that keeps state on Redis for a :class:`RedisSharedState`."""

    def sync(self, pipe: Any) -> Callable[[Any], None] | None:
        """Queue periodic commands on ``pipe``; return a callback for their replies (or None)."""

    def reconnect(self) -> None:
        """Redis is reachable again; push local state (may raise ``redis.RedisError``)."""

    def reconnected(self) -> None:
        """Requests use Redis again."""


def _ms(seconds: float) -> int:
    return round(seconds * 1000.0)


# ------------------------------------------------------------------------------------------------
# Connection, health and the background thread
# ------------------------------------------------------------------------------------------------


class RedisSharedState:
    """One Redis connection pool per process, its health, and the background sync thread.

    Build it with :meth:`get` (one instance per URL, namespace and settings per process, shared by
    every router, budget and ledger that names them) or directly. Thread-safe; survives ``fork``
    (the thread and the connections are re-created in the child on first use).
    """

    _instances: dict[tuple[str, str], RedisSharedState] = {}
    _instances_lock = threading.Lock()

    def __init__(
        self,
        url: str,
        settings: SharedStatePolicy | Mapping[str, Any] | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(
                "redis_url", f"expected redis://host:port/db, rediss://... or unix://..., got {url!r}"
            )
        if settings is None:
            settings = SharedStatePolicy()
        elif not isinstance(settings, SharedStatePolicy):
            try:
                settings = SharedStatePolicy.model_validate(dict(settings))
            except Exception as e:
                raise ConfigError("resilience.shared_state", str(e)) from None
        self.url = url
        self.settings: SharedStatePolicy = settings
        self.namespace = settings.namespace
        self.clock = clock
        self.client = redis.Redis.from_url(
            url,
            socket_timeout=settings.socket_timeout,
            socket_connect_timeout=settings.connect_timeout,
            # redis-py retries 10 times with backoff by default: a slow Redis must not stall calls.
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        self._scripts = {name: self.client.register_script(src) for name, src in _SCRIPTS.items()}
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._members: weakref.WeakSet[Any] = weakref.WeakSet()
        self._available = True
        self._down_until = 0.0
        self._down_reason = ""
        self.down_epoch = 0  # increments every time Redis is found unreachable
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._closed = False

    @classmethod
    def get(cls, url: str, settings: SharedStatePolicy | Mapping[str, Any] | None = None) -> RedisSharedState:
        """The process-wide instance for ``url`` and these settings (created on first use)."""
        pol = (
            settings
            if isinstance(settings, SharedStatePolicy)
            else SharedStatePolicy.model_validate(dict(settings or {}))
        )
        key = (url, pol.model_dump_json())
        with cls._instances_lock:
            inst = cls._instances.get(key)
            if inst is None or inst._closed:
                inst = cls._instances[key] = cls(url, pol)
            return inst

    # -- health ----------------------------------------------------------------------------------

    @property
    def available(self) -> bool:
        """True while requests use Redis; False while they run on local state."""
        return self._available

    @property
    def down_reason(self) -> str:
        return self._down_reason

    def mark_down(self, exc: BaseException) -> None:
        with self._lock:
            self._down_until = time.monotonic() + self.settings.retry_interval
            self._down_reason = f"{type(exc).__name__}: {exc}"
            if self._available:
                self._available = False
                self.down_epoch += 1
                logger.warning(
                    "shared state on %s unavailable (%s): breakers and retry budgets run on local "
                    "state; retrying in %.1fs",
                    _safe_url(self.url),
                    self._down_reason,
                    self.settings.retry_interval,
                )

    def run(self, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run one Lua script (one round trip) or raise :class:`SharedStateUnavailable`."""
        self.ensure_thread()
        if not self._available:
            raise SharedStateUnavailable(self._down_reason)
        try:
            return self._scripts[script](keys=list(keys), args=list(args))
        except redis.RedisError as e:
            self.mark_down(e)
            raise SharedStateUnavailable(self._down_reason) from e

    def script(self, name: str) -> Any:
        return self._scripts[name]

    def queue(self, pipe: Any, name: str, keys: Sequence[str], args: Sequence[Any]) -> None:
        """Queue a script on a pipeline by its SHA only (redis-py's Script objects would add a
        ``SCRIPT EXISTS`` round trip to every pipeline)."""
        pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)

    # -- members and the background thread -------------------------------------------------------

    def register(self, member: Any) -> None:
        self._members.add(member)
        self.ensure_thread()

    def ensure_thread(self) -> None:
        pid = os.getpid()
        if self._pid != pid:  # forked: locks, members' thread and connections are the parent's
            self._pid = pid
            self._lock = threading.Lock()
            self._sync_lock = threading.Lock()
            self._thread = None
            self._stop = threading.Event()
            self.client.connection_pool.reset()
        t = self._thread
        if (t is None or not t.is_alive()) and not self._closed:
            with self._lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(
                        target=self._loop, name="llm-resilience-redis", daemon=True
                    )
                    self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.settings.sync_interval):
            try:
                self.tick()
            except Exception:  # pragma: no cover - never let the thread die
                logger.exception("shared state sync failed")

    def tick(self) -> None:
        """One background step: refresh caches and flush batches, or try to reconnect."""
        members = list(self._members)
        if not self._available:
            if time.monotonic() < self._down_until:
                return
            self._reconnect(members)
            return
        self.sync_members(members)

    def prime(self, members: Sequence[Any]) -> None:
        """Load the current shared state of new members now (one round trip), so a process that
        starts while a breaker is open never sees it closed."""
        self.ensure_thread()
        if self._available:
            self.sync_members(list(members))

    def sync_members(self, members: list[Any]) -> None:
        if not members:
            return
        with self._sync_lock:  # the background thread and prime() never sync concurrently
            self._sync_members(members)

    def _sync_members(self, members: list[Any]) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)
            callbacks = []
            for m in members:
                cb = m.sync(pipe)
                if cb is not None:
                    callbacks.append((cb, len(pipe.command_stack)))
            if not callbacks:
                return
            replies = pipe.execute()
        except redis.exceptions.NoScriptError:
            # A restarted (or flushed) Redis forgot the scripts: load them, sync next tick.
            for m in members:
                failed = getattr(m, "sync_failed", None)
                if failed is not None:
                    failed()
            try:
                for sc in self._scripts.values():
                    self.client.script_load(sc.script)
            except redis.RedisError as e:
                self.mark_down(e)
            return
        except redis.RedisError as e:
            self.mark_down(e)
            for m in members:
                failed = getattr(m, "sync_failed", None)
                if failed is not None:
                    failed()
            return
        start = 0
        for cb, end in callbacks:
            cb(replies[start:end])
            start = end

    def _reconnect(self, members: list[Any]) -> None:
        try:
            # Pooled sockets died with the old server: start from fresh connections.
            self.client.connection_pool.disconnect(inuse_connections=False)
            self.client.ping()
            for m in members:
                m.reconnect()
        except redis.RedisError as e:
            with self._lock:
                self._down_until = time.monotonic() + self.settings.retry_interval
                self._down_reason = f"{type(e).__name__}: {e}"
            return
        with self._lock:
            self._available = True
            self._down_reason = ""
        for m in members:
            m.reconnected()
        logger.warning("shared state on %s available again: resynced", _safe_url(self.url))

    @classmethod
    def close_all(cls) -> None:
        """Close every instance :meth:`get` made in this process (application shutdown, tests)."""
        with cls._instances_lock:
            instances, cls._instances = list(cls._instances.values()), {}
        for inst in instances:
            inst.close()

    def unregister(self, member: Any) -> None:
        self._members.discard(member)

    def release_router(self, release: Callable[[Any], None], sync: Any, members: Sequence[Any]) -> None:
        """A router closed: run its own release, and stop syncing its breakers and budgets."""
        try:
            release(sync)
        finally:
            for m in members:
                self.unregister(m)

    def close(self) -> None:
        """Stop the background thread and close the connections (idempotent)."""
        self._closed = True
        self._stop.set()
        t = self._thread
        if t is not None and t.is_alive() and t is not threading.current_thread():
            t.join(timeout=2)
        self.client.close()

    # -- factories ---------------------------------------------------------------------------

    def breaker_backend(
        self, router_key: str, deployment_id: str, policy: BreakerPolicy, *, lease: float
    ) -> RedisBreakerBackend:
        backend = RedisBreakerBackend(
            self, f"{self.namespace}:{router_key}:{deployment_id}", deployment_id, policy, lease=lease
        )
        self.register(backend)
        return backend

    def token_bucket(self, router_key: str, group: str, capacity: float) -> RedisTokenBucket:
        bucket = RedisTokenBucket(self, f"{self.namespace}:{router_key}:retry_budget:{group}", capacity)
        self.register(bucket)
        return bucket

    def __repr__(self) -> str:
        return f"RedisSharedState({_safe_url(self.url)!r}, namespace={self.namespace!r})"


def _safe_url(url: str) -> str:
    """The URL without a password."""
    if "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def router_key(
    spec_model_list: Sequence[Mapping[str, Any]], deployment_ids: Sequence[tuple[str, str]]
) -> str:
    """A stable name for a router: a hash of its (group, deployment id, model, api_base) list, so
    every worker built from the same config shares state and another config does not."""
    parts = []
    by_id = {str((d.get("model_info") or {}).get("id")): d for d in spec_model_list}
    for group, dep in sorted(deployment_ids):
        params = (by_id.get(dep) or {}).get("litellm_params") or {}
        parts.append([group, dep, str(params.get("model")), str(params.get("api_base"))])
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:12]


def redis_url_from_settings(settings: Mapping[str, Any]) -> str | None:
    """``redis_url``, or LiteLLM's ``redis_host``/``redis_port``/``redis_password``/``redis_db``."""
    url = settings.get("redis_url")
    if url:
        return str(url)
    host = settings.get("redis_host")
    if not host:
        return None
    port = settings.get("redis_port") or 6379
    password = settings.get("redis_password")
    db = settings.get("redis_db") or 0
    auth = f":{password}@" if password else ""
    return f"redis://{auth}{host}:{port}/{db}"


def attach_router(spec: Any, shared_state: Any = None) -> RedisSharedState | None:
    """The shared state a router should use (None: local), from ``shared_state=`` (an instance,
    a URL, or False), else ``router_settings.redis_url`` and ``resilience.shared_state``."""
    pol: SharedStatePolicy = spec.policy.shared_state
    if shared_state is False or (shared_state is None and not pol.enabled):
        return None
    if isinstance(shared_state, RedisSharedState):
        return shared_state
    url = shared_state if isinstance(shared_state, str) else redis_url_from_settings(spec.router_settings)
    if url is None:
        if shared_state is not None:
            raise ConfigError("shared_state", "expected a RedisSharedState, a redis:// URL, or False")
        return None
    return RedisSharedState.get(url, pol)


# ------------------------------------------------------------------------------------------------
# Lua scripts
# ------------------------------------------------------------------------------------------------

# Breaker keys (KEYS): 1 state, 2 fail_counter, 3 success_counter, 4 opened_at (whole seconds, as
# pybreaker's CircuitRedisStorage writes it), 5 generation, 6 probes (ZSET lease -> expiry ms),
# 7 opened_at_ms. Times are the caller's wall clock in ms (so injected clocks work).
_BREAKER_LIB = """
local function view(now)
  local st = redis.call('GET', KEYS[1]) or 'closed'
  return {st, tonumber(redis.call('GET', KEYS[5]) or '0'),
          tonumber(redis.call('GET', KEYS[2]) or '0'), tonumber(redis.call('GET', KEYS[3]) or '0'),
          tonumber(redis.call('GET', KEYS[7]) or '0'),
          redis.call('ZCOUNT', KEYS[6], '(' .. now, '+inf')}
end
local function touch(ttl)
  for i = 1, 7 do redis.call('EXPIRE', KEYS[i], ttl) end
end
local function trip(now)
  redis.call('SET', KEYS[1], 'open')
  redis.call('SET', KEYS[7], now)
  redis.call('SET', KEYS[4], math.floor(now / 1000))
  redis.call('INCR', KEYS[5])
  redis.call('SET', KEYS[3], 0)
  redis.call('DEL', KEYS[6])
end
"""

# ARGV: now_ms, reset_ms, max_probes, lease_ms, lease_id, ttl -> {admitted, probe, before, view...}
_ADMIT = (
    _BREAKER_LIB
    + """
local now = tonumber(ARGV[1])
local before = redis.call('GET', KEYS[1]) or 'closed'
if before == 'closed' then return {1, 0, before, unpack(view(now))} end
if before == 'open' then
  local oa = tonumber(redis.call('GET', KEYS[7]) or '0')
  if now < oa + tonumber(ARGV[2]) then return {0, 0, before, unpack(view(now))} end
  redis.call('SET', KEYS[1], 'half-open')
  redis.call('INCR', KEYS[5])
  redis.call('SET', KEYS[3], 0)
  redis.call('DEL', KEYS[6])
end
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now)
if redis.call('ZCARD', KEYS[6]) >= tonumber(ARGV[3]) then
  if before == 'open' then touch(tonumber(ARGV[6])) end
  return {0, 0, before, unpack(view(now))}
end
redis.call('ZADD', KEYS[6], now + tonumber(ARGV[4]), ARGV[5])
touch(tonumber(ARGV[6]))
return {1, 1, before, unpack(view(now))}
"""
)

# ARGV: generation, probe(0/1), lease, success_threshold, now_ms, ttl -> {applied, before, view...}
_SUCCESS = (
    _BREAKER_LIB
    + """
local now = tonumber(ARGV[5])
local before = redis.call('GET', KEYS[1]) or 'closed'
if ARGV[2] == '1' then redis.call('ZREM', KEYS[6], ARGV[3]) end
if tonumber(redis.call('GET', KEYS[5]) or '0') ~= tonumber(ARGV[1]) then
  return {0, before, unpack(view(now))}
end
if ARGV[2] == '1' then
  if before == 'half-open' and redis.call('INCR', KEYS[3]) >= tonumber(ARGV[4]) then
    redis.call('SET', KEYS[1], 'closed')
    redis.call('SET', KEYS[2], 0)
    redis.call('SET', KEYS[3], 0)
    redis.call('INCR', KEYS[5])
    redis.call('DEL', KEYS[6])
  end
elseif before == 'closed' then
  redis.call('SET', KEYS[2], 0)
end
touch(tonumber(ARGV[6]))
return {1, before, unpack(view(now))}
"""
)

# ARGV: generation, probe(0/1), lease, fail_max, now_ms, ttl -> {applied, before, view...}
_FAILURE = (
    _BREAKER_LIB
    + """
local now = tonumber(ARGV[5])
local before = redis.call('GET', KEYS[1]) or 'closed'
if ARGV[2] == '1' then redis.call('ZREM', KEYS[6], ARGV[3]) end
if tonumber(redis.call('GET', KEYS[5]) or '0') ~= tonumber(ARGV[1]) then
  return {0, before, unpack(view(now))}
end
if ARGV[2] == '1' then
  if before == 'half-open' then trip(now) end
elseif before == 'closed' then
  if redis.call('INCR', KEYS[2]) >= tonumber(ARGV[4]) then trip(now) end
end
touch(tonumber(ARGV[6]))
return {1, before, unpack(view(now))}
"""
)

# ARGV: lease, now_ms -> {1, before, view...}
_RELEASE = (
    _BREAKER_LIB
    + """
redis.call('ZREM', KEYS[6], ARGV[1])
local before = redis.call('GET', KEYS[1]) or 'closed'
return {1, before, unpack(view(tonumber(ARGV[2])))}
"""
)

# ARGV: now_ms -> {1, before, view...}
_VIEW = (
    _BREAKER_LIB
    + """
local before = redis.call('GET', KEYS[1]) or 'closed'
return {1, before, unpack(view(tonumber(ARGV[1])))}
"""
)

# After an outage: a breaker this process tripped locally opens the shared one too, unless the
# fleet has already opened it since. ARGV: local_opened_at_ms, now_ms, ttl -> {merged, before, view}
_MERGE = (
    _BREAKER_LIB
    + """
local now = tonumber(ARGV[2])
local before = redis.call('GET', KEYS[1]) or 'closed'
local oa = tonumber(redis.call('GET', KEYS[7]) or '0')
if before == 'closed' or (before == 'half-open' and oa < tonumber(ARGV[1])) then
  trip(tonumber(ARGV[1]))
  touch(tonumber(ARGV[3]))
  return {1, before, unpack(view(now))}
end
return {0, before, unpack(view(now))}
"""
)

# Retry budget bucket. ARGV: delta, capacity, ttl -> tokens (string: Lua numbers become integers)
_BUCKET = """
local cap = tonumber(ARGV[2])
local t = tonumber(redis.call('GET', KEYS[1]) or ARGV[2]) + tonumber(ARGV[1])
if t > cap then t = cap end
if t < 0 then t = 0 end
redis.call('SET', KEYS[1], tostring(t), 'EX', tonumber(ARGV[3]))
return tostring(t)
"""

# Ledger. KEYS[1] is the prefix (string, not a key); data keys are derived from it:
#   {p}:k:{id} HASH budget scope win limit spent reserved exp   (money in integer nano-dollars)
#   {p}:keys SET of key ids; {p}:kexp ZSET id -> expires_at
#   {p}:r:{rid} HASH keys(json) amount exp; {p}:rexp ZSET rid -> expires_at
#   {p}:done:{rid} 'settled'|'released' (TTL) - makes settle/release replays idempotent
#   {p}:log ZSET ts -> "{rid}|{json entry}"; {p}:a:{id} SET of alert thresholds fired
_LEDGER_LIB = """
local P = KEYS[1]
local function drop(rid)
  local r = P .. ':r:' .. rid
  local ids = redis.call('HGET', r, 'keys')
  if not ids then redis.call('ZREM', P .. ':rexp', rid) return 0 end
  local amount = tonumber(redis.call('HGET', r, 'amount'))
  for _, id in ipairs(cjson.decode(ids)) do
    local k = P .. ':k:' .. id
    if redis.call('EXISTS', k) == 1 then
      local left = tonumber(redis.call('HGET', k, 'reserved') or '0') - amount
      if left < 0 then left = 0 end
      redis.call('HSET', k, 'reserved', left)
    end
  end
  redis.call('DEL', r)
  redis.call('ZREM', P .. ':rexp', rid)
  return 1
end
local function reap(now, limit)
  for _, rid in ipairs(redis.call('ZRANGEBYSCORE', P .. ':rexp', '-inf', now, 'LIMIT', 0, limit)) do
    drop(rid)
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. ':kexp', '-inf', now, 'LIMIT', 0, limit)) do
    local k = P .. ':k:' .. id
    if tonumber(redis.call('HGET', k, 'reserved') or '0') <= 0 then
      redis.call('DEL', k, P .. ':a:' .. id)
      redis.call('SREM', P .. ':keys', id)
      redis.call('ZREM', P .. ':kexp', id)
    end
  end
end
-- upsert one key from ARGV[i..i+5]: id budget scope win limit exp('' = none)
local function upsert(i)
  local id = ARGV[i]
  local k = P .. ':k:' .. id
  local exp = ARGV[i + 5]
  if redis.call('EXISTS', k) == 0 then
    redis.call('HSET', k, 'budget', ARGV[i + 1], 'scope', ARGV[i + 2], 'win', ARGV[i + 3],
               'limit', ARGV[i + 4], 'spent', 0, 'reserved', 0, 'exp', exp)
    redis.call('SADD', P .. ':keys', id)
  else
    local old = redis.call('HGET', k, 'exp') or ''
    if exp ~= '' and old ~= '' and tonumber(old) > tonumber(exp) then exp = old end
    redis.call('HSET', k, 'limit', ARGV[i + 4], 'exp', exp)
  end
  if exp == '' then redis.call('ZREM', P .. ':kexp', id) else redis.call('ZADD', P .. ':kexp', exp, id) end
  return k
end
local function row(k)
  return redis.call('HMGET', k, 'budget', 'scope', 'win', 'spent', 'reserved', 'limit')
end
"""

# ARGV: rid, units, now, expires_at, n, then n x (id budget scope win limit exp)
# -> {'ok'} | {'dup'} | {'refused', index, spent, reserved}
_RESERVE = (
    _LEDGER_LIB
    + """
local rid, units, now, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
if redis.call('EXISTS', P .. ':r:' .. rid) == 1 or redis.call('EXISTS', P .. ':done:' .. rid) == 1 then
  return {'dup'}
end
reap(now, 50)
local keys, ids = {}, {}
for j = 1, n do
  local i = 6 + (j - 1) * 6
  local k = upsert(i)
  local spent = tonumber(redis.call('HGET', k, 'spent') or '0')
  local reserved = tonumber(redis.call('HGET', k, 'reserved') or '0')
  if spent + reserved + units > tonumber(ARGV[i + 4]) then
    return {'refused', j, spent, reserved}
  end
  keys[j] = k
  ids[j] = ARGV[i]
end
for j = 1, n do redis.call('HINCRBY', keys[j], 'reserved', units) end
local r = P .. ':r:' .. rid
redis.call('HSET', r, 'keys', cjson.encode(ids), 'amount', units, 'exp', ARGV[4])
redis.call('ZADD', P .. ':rexp', ARGV[4], rid)
return {'ok'}
"""
)

# ARGV: rid, units, done_ttl, entry ts ('' = no entry), entry member, n, n x (id budget scope win limit exp)
# -> {applied(1|0), rows...} with 6 fields per key
_SETTLE = (
    _LEDGER_LIB
    + """
local rid, units, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[6])
local done = P .. ':done:' .. rid
local applied = 1
if redis.call('GET', done) == 'settled' then
  applied = 0
else
  drop(rid)
end
local out = {applied}
for j = 1, n do
  local i = 7 + (j - 1) * 6
  local k = upsert(i)
  if applied == 1 then redis.call('HINCRBY', k, 'spent', units) end
  for _, v in ipairs(row(k)) do out[#out + 1] = v end
end
if applied == 1 then
  if ARGV[4] ~= '' then redis.call('ZADD', P .. ':log', ARGV[4], ARGV[5]) end
  redis.call('SET', done, 'settled', 'EX', tonumber(ARGV[3]))
end
return out
"""
)

# ARGV: rid, done_ttl -> 1 if a reservation was dropped
_RELEASE_RES = (
    _LEDGER_LIB
    + """
local done = P .. ':done:' .. ARGV[1]
if redis.call('EXISTS', done) == 1 then return 0 end
local dropped = drop(ARGV[1])
redis.call('SET', done, 'released', 'EX', tonumber(ARGV[2]))
return dropped
"""
)

# ARGV: now
_PRUNE = (
    _LEDGER_LIB
    + """
local now = tonumber(ARGV[1])
local before = -1
while before ~= 0 do
  before = redis.call('ZCOUNT', P .. ':rexp', '-inf', now)
           + redis.call('ZCOUNT', P .. ':kexp', '-inf', now)
  reap(now, 1000)
  local after = redis.call('ZCOUNT', P .. ':rexp', '-inf', now)
                + redis.call('ZCOUNT', P .. ':kexp', '-inf', now)
  if after >= before then break end
end
return 1
"""
)

_SCRIPTS = {
    "admit": _ADMIT,
    "success": _SUCCESS,
    "failure": _FAILURE,
    "release": _RELEASE,
    "view": _VIEW,
    "merge": _MERGE,
    "bucket": _BUCKET,
    "reserve": _RESERVE,
    "settle": _SETTLE,
    "release_res": _RELEASE_RES,
    "prune": _PRUNE,
}


# ------------------------------------------------------------------------------------------------
# Breakers
# ------------------------------------------------------------------------------------------------

_STATES = {CLOSED, OPEN, HALF_OPEN}
_LOCAL_GEN_BASE = -(2**40)  # local-state generations are negative: never equal to a Redis one


def _str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _view_of(reply: Sequence[Any], offset: int) -> BreakerView:
    st = _str(reply[offset])
    return BreakerView(
        state=st if st in _STATES else CLOSED,
        generation=int(reply[offset + 1]),
        fail_counter=int(reply[offset + 2]),
        success_counter=int(reply[offset + 3]),
        opened_at=int(reply[offset + 4]) / 1000.0,
        probes=int(reply[offset + 5]),
    )


class RedisBreakerBackend(BreakerBackend):
    """One deployment's breaker state on Redis (see the module docstring).

    While Redis is unreachable the breaker runs on a local :class:`MemoryBreakerBackend` seeded
    from the last state seen (so an open breaker stays open); its generations are negative, so
    outcomes are never applied across the switch. When Redis is back, a breaker this process
    tripped meanwhile is opened fleet-wide (unless the fleet already did), then the shared state
    is used again.
    """

    def __init__(
        self, shared: RedisSharedState, prefix: str, name: str, policy: BreakerPolicy, *, lease: float
    ) -> None:
        self.shared = shared
        self.prefix = prefix
        self.name = name
        self.policy = policy
        self.lease = lease
        self.keys = [
            f"{prefix}:pybreaker:{k}"
            for k in (
                "state",
                "fail_counter",
                "success_counter",
                "opened_at",
                "generation",
                "probes",
                "opened_at_ms",
            )
        ]
        self._mu = threading.Lock()
        self._cache = BreakerView()
        self._seq = 0  # bumped by every write; a sync read started before it is discarded
        self._known = CLOSED  # the last state this process has emitted (or started from)
        self._primed = False
        self._observed: list[Change] = []
        self._local: MemoryBreakerBackend | None = None
        self._local_epoch = -1
        self._local_gens = 0

    # -- reads -------------------------------------------------------------------------------

    def _active_local(self) -> MemoryBreakerBackend | None:
        """The local breaker while Redis is unavailable (created on first use), else None."""
        if self.shared.available:
            return None
        local = self._local
        if local is not None and self._local_epoch == self.shared.down_epoch:
            return local
        return self._local_backend()

    def view(self) -> BreakerView:
        local = self._active_local()
        return local.view() if local is not None else self._cache

    @property
    def state(self) -> str:
        local = self._active_local()
        return local.state if local is not None else self._cache.state

    @property
    def generation(self) -> int:
        local = self._active_local()
        return local.generation if local is not None else self._cache.generation

    @property
    def has_observed(self) -> bool:
        return bool(self._observed)

    def observed(self) -> list[Change]:
        if not self._observed:
            return []
        with self._mu:
            out, self._observed = self._observed, []
        return out

    # -- the shared path ---------------------------------------------------------------------

    def _apply(self, before: str, view: BreakerView) -> list[Change]:
        """Cache a write's reply; the changes since what this process last knew."""
        with self._mu:
            self._seq += 1
            self._cache = view
            if not self._primed:
                self._primed = True
                self._known = before
            changes, self._observed = self._observed, []
            if self._known != before:
                changes.append(Change(self._known, before, view.fail_counter))
            if before != view.state:
                changes.append(Change(before, view.state, view.fail_counter))
            self._known = view.state
            return changes

    def _call(self, script: str, args: Sequence[Any]) -> Any:
        return self.shared.run(script, self.keys, args)

    def _local_backend(self) -> MemoryBreakerBackend:
        """The local breaker for this outage (created from the last shared view)."""
        epoch = self.shared.down_epoch
        with self._mu:
            if self._local is None or self._local_epoch != epoch:
                self._local_gens += 1
                seed = self._cache
                gen = _LOCAL_GEN_BASE + self._local_gens * 2**20
                if seed.state == HALF_OPEN:  # our probes' leases are on Redis: start over as open
                    seed = BreakerView(OPEN, gen, seed.fail_counter, 0, seed.opened_at, 0)
                self._local = MemoryBreakerBackend.from_view(
                    self.name,
                    self.policy,
                    BreakerView(seed.state, gen, seed.fail_counter, 0, seed.opened_at, 0),
                )
                self._local_epoch = epoch
                if self._primed and seed.state != self._known:  # keep the emitted chain unbroken
                    self._observed.append(Change(self._known, seed.state, seed.fail_counter))
                self._known = seed.state
                self._primed = True
            return self._local

    def _local_changes(self, changes: list[Change]) -> list[Change]:
        """A local operation's changes, after any observed ones still pending (in order)."""
        with self._mu:
            pending, self._observed = self._observed, []
            if changes:
                self._known = changes[-1].new_state
            return pending + changes

    def admit(self, now: float) -> tuple[Admission | None, list[Change]]:
        if self.shared.available:
            lease_id = uuid.uuid4().hex
            try:
                r = self._call(
                    "admit",
                    [
                        _ms(now),
                        _ms(self.policy.reset_timeout),
                        self.policy.half_open_max_probes,
                        _ms(self.lease),
                        lease_id,
                        KEY_TTL,
                    ],
                )
            except SharedStateUnavailable:
                pass
            else:
                view = _view_of(r, 3)
                changes = self._apply(_str(r[2]), view)
                if not int(r[0]):
                    return None, changes
                probe = bool(int(r[1]))
                return Admission(self.name, view.generation, probe, lease_id if probe else None), changes
        local = self._local_backend()
        adm, changes = local.admit(now)
        return adm, self._local_changes(changes)

    def _outcome(self, script: str, admission: Admission, threshold: int, now: float) -> list[Change]:
        if admission.generation < 0:  # admitted on local state
            local = self._active_local()
            if local is None:
                return []
            op = local.record_success if script == "success" else local.record_failure
            return self._local_changes(op(admission, now))
        if not self.shared.available:
            return []  # admitted on shared state: its lease expires on Redis by itself
        try:
            r = self._call(
                script,
                [
                    admission.generation,
                    int(admission.probe),
                    admission.lease or "",
                    threshold,
                    _ms(now),
                    KEY_TTL,
                ],
            )
        except SharedStateUnavailable:
            return []
        return self._apply(_str(r[1]), _view_of(r, 2))

    def record_success(self, admission: Admission, now: float) -> list[Change]:
        if (
            not admission.probe
            and admission.generation >= 0
            and self._cache.fail_counter == 0
            and self._cache.generation == admission.generation
            and self.shared.available
        ):
            return []  # nothing to reset (as far as the last sync knows): no round trip
        return self._outcome("success", admission, self.policy.success_threshold, now)

    def record_failure(self, admission: Admission, now: float) -> list[Change]:
        return self._outcome("failure", admission, self.policy.fail_max, now)

    def release(self, admission: Admission) -> list[Change]:
        if not admission.probe:
            return []
        if admission.generation < 0:
            local = self._active_local()
            return self._local_changes(local.release(admission)) if local is not None else []
        if not self.shared.available or admission.lease is None:
            return []
        try:
            r = self._call("release", [admission.lease, _ms(self.shared.clock())])
        except SharedStateUnavailable:
            return []
        return self._apply(_str(r[1]), _view_of(r, 2))

    # -- background ----------------------------------------------------------------------------

    def sync(self, pipe: Any) -> Callable[[Any], None]:
        seq = self._seq
        self.shared.queue(pipe, "view", self.keys, [_ms(self.shared.clock())])

        def done(replies: Any) -> None:
            r = replies[0]
            view = _view_of(r, 2)
            with self._mu:
                if self._seq != seq:
                    return  # a write's reply is fresher than this read
                self._cache = view
                if not self._primed:  # a new process takes the state as it finds it
                    self._primed = True
                    self._known = view.state
                elif view.state != self._known:
                    self._observed.append(Change(self._known, view.state, view.fail_counter))
                    self._known = view.state

        return done

    def reconnect(self) -> None:
        local = self._local
        if local is None or self._local_epoch != self.shared.down_epoch:
            return
        lv = local.view()
        if lv.state != CLOSED and lv.opened_at > self._cache.opened_at:
            self.shared.script("merge")(
                keys=self.keys, args=[_ms(lv.opened_at), _ms(self.shared.clock()), KEY_TTL]
            )

    def reconnected(self) -> None:
        with self._mu:
            self._local = None
            self._seq += 1
        # Refresh now rather than at the next tick, so routing sees the merged state at once.
        try:
            r = self.shared.script("view")(keys=self.keys, args=[_ms(self.shared.clock())])
        except redis.RedisError as e:
            self.shared.mark_down(e)
            return
        view = _view_of(r, 2)
        with self._mu:
            self._cache = view
            if view.state != self._known:
                self._observed.append(Change(self._known, view.state, view.fail_counter))
                self._known = view.state


# ------------------------------------------------------------------------------------------------
# Retry budgets
# ------------------------------------------------------------------------------------------------


class RedisTokenBucket:
    """A model group's retry-budget bucket on Redis, shared by the fleet.

    ``add`` is local and instant; the background thread applies the summed changes atomically
    every ``sync_interval`` and reads back the fleet's level. ``tokens`` is that level plus this
    process's changes not yet applied, or None while Redis is unreachable (the
    :class:`~llm_resilience_plugin.retry.RetryBudget` then uses its local bucket)."""

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
                self._fleet = float(_str(replies[0]))
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
            self._fleet = float(_str(value))

    def reconnected(self) -> None:
        pass


# ------------------------------------------------------------------------------------------------
# The cost ledger
# ------------------------------------------------------------------------------------------------


def _refusal(key: BudgetKey, spent: int, reserved: int, amount: int) -> BudgetExceededError:
    """The same refusal the SQLite and memory ledgers raise."""
    err = BudgetExceededError(key.label, from_nano(spent + reserved), from_nano(amount), float(key.limit))
    err.budget_name = key.budget  # type: ignore[attr-defined]
    err.scope = key.scope  # type: ignore[attr-defined]
    err.window = key.window  # type: ignore[attr-defined]
    err.settled = from_nano(spent)  # type: ignore[attr-defined]
    err.in_flight = from_nano(reserved)  # type: ignore[attr-defined]
    return err


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
                budget=_str(budget) if budget is not None else k.budget,
                scope=_str(scope) if scope is not None else k.scope,
                window=_str(win) if win is not None else k.window,
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
    d = json.loads(member.split("|", 1)[1])
    return SpendEntry(
        ts=d["ts"],
        day=d["day"],
        month=d["month"],
        cost=from_nano(int(d["cost_nano"])),
        model=d.get("model"),
        model_group=d.get("model_group"),
        deployment_id=d.get("deployment_id"),
        scopes=d.get("scopes") or {},
        prompt_tokens=int(d.get("prompt_tokens") or 0),
        completion_tokens=int(d.get("completion_tokens") or 0),
        request_id=d.get("request_id"),
        estimated=bool(d.get("estimated")),
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
        if isinstance(redis_url, RedisSharedState):
            shared = redis_url
        elif isinstance(redis_url, str):
            shared = RedisSharedState.get(redis_url, settings)
        else:
            raise ConfigError("ledger", "expected a redis:// URL or a RedisSharedState")
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

    def reserve(self, keys: Sequence[BudgetKey], amount: float, *, now: float, ttl: float) -> Reservation:
        units = to_nano(amount)
        res = Reservation(uuid.uuid4().hex, tuple(keys), from_nano(units), now, now + ttl)
        if self.shared.available and not self._journal:
            args: list[Any] = [res.id, units, repr(now), repr(res.expires_at), len(keys)]
            for k in keys:
                args.extend(_key_args(k))
            try:
                r = self._run("reserve", args)
            except SharedStateUnavailable:
                # The reply may have been lost after Redis applied it: make sure it is dropped.
                self._journal.append(_Op("release", res))
            else:
                status = _str(r[0])
                if status == "refused":
                    k = keys[int(r[1]) - 1]
                    spent, reserved = int(r[2]), int(r[3])
                    self._remember_key(k.id, spent, reserved)
                    raise _refusal(k, spent, reserved, units)
                return res
        if self.on_error == "fail_closed":
            raise LedgerUnavailableError(self.shared.down_reason or "reconnecting")
        return self._reserve_local(keys, res, now, ttl)

    def _reserve_local(
        self, keys: Sequence[BudgetKey], res: Reservation, now: float, ttl: float
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
        got = local.reserve(keys, res.amount, now=now, ttl=ttl)
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
            except SharedStateUnavailable:
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
        r = self._run("settle", args)
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
                self._run("release_res", [reservation.id, self.done_ttl])
                return
            except SharedStateUnavailable:
                pass
        self._journal.append(_Op("release", reservation))

    def _require(self) -> None:
        self.shared.ensure_thread()
        if not self.shared.available:
            raise LedgerUnavailableError(self.shared.down_reason or "reconnecting")

    def usage(self, keys: Sequence[BudgetKey]) -> list[KeyUsage]:
        self._require()
        try:
            pipe = self.shared.client.pipeline(transaction=False)
            for k in keys:
                pipe.hmget(f"{self.prefix}:k:{k.id}", "budget", "scope", "win", "spent", "reserved", "limit")
            rows = pipe.execute()
        except redis.RedisError as e:
            self.shared.mark_down(e)
            raise LedgerUnavailableError(self.shared.down_reason) from e
        out = []
        for k, row in zip(keys, rows, strict=True):
            if row[0] is None:
                out.append(KeyUsage(k.budget, k.scope, k.window, 0.0, 0.0, k.limit))
            else:
                out.extend(_usage_rows(row, [k]))
        return out

    def list_usage(self, budget: str | None = None, window: str | None = None) -> list[KeyUsage]:
        self._require()
        try:
            ids = sorted(_str(i) for i in self.shared.client.smembers(f"{self.prefix}:keys"))
            pipe = self.shared.client.pipeline(transaction=False)
            for i in ids:
                pipe.hmget(f"{self.prefix}:k:{i}", "budget", "scope", "win", "spent", "reserved", "limit")
            rows = pipe.execute()
        except redis.RedisError as e:
            self.shared.mark_down(e)
            raise LedgerUnavailableError(self.shared.down_reason) from e
        out = []
        for row in rows:
            if row[0] is None or row[5] is None:
                continue
            u = _usage_rows(row, [BudgetKey("", "", "", 0.0)])[0]
            if (budget is None or u.budget == budget) and (window is None or u.window == window):
                out.append(u)
        return out

    def entries(self, since: float | None = None, until: float | None = None) -> list[SpendEntry]:
        self._require()
        lo = "-inf" if since is None else repr(since)
        hi = "+inf" if until is None else f"({until!r}"
        try:
            members = self.shared.client.zrangebyscore(f"{self.prefix}:log", lo, hi)
        except redis.RedisError as e:
            self.shared.mark_down(e)
            raise LedgerUnavailableError(self.shared.down_reason) from e
        return [_entry_from(_str(m)) for m in members]

    def mark_alert(self, key: BudgetKey, threshold: float) -> bool:
        if not self.shared.available:
            return False  # checked again at the next settlement, once Redis answers
        try:
            return bool(self.shared.client.sadd(f"{self.prefix}:a:{key.id}", repr(float(threshold))))
        except redis.RedisError as e:
            self.shared.mark_down(e)
            return False

    def prune(self, now: float) -> None:
        try:
            self._run("prune", [repr(now)])
        except SharedStateUnavailable:
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
                self.shared.script("settle")(keys=[self.prefix], args=args)
            else:
                self.shared.script("release_res")(keys=[self.prefix], args=[res.id, self.done_ttl])
            with self._lock:
                if self._journal and self._journal[0] is op:
                    self._journal.popleft()

    def sync(self, pipe: Any) -> None:
        if self._journal:
            try:
                self._replay()
            except redis.RedisError as e:
                self.shared.mark_down(e)
        return None

    def reconnect(self) -> None:
        self._replay()

    def reconnected(self) -> None:
        with self._lock:
            self._local = None  # its reservations settle straight to Redis from now on

    def __repr__(self) -> str:
        url = _safe_url(self.shared.url)
        return f"RedisLedger({url!r}, prefix={self.prefix!r}, on_error={self.on_error!r})"


__all__ = [
    "LedgerUnavailableError",
    "RedisBreakerBackend",
    "RedisLedger",
    "RedisSharedState",
    "RedisTokenBucket",
    "attach_router",
    "redis_url_from_settings",
    "router_key",
]
