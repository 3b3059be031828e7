"""The Redis connection a process shares between its routers, budgets and ledgers: health, the
background sync thread, the registered Lua scripts, and how a router finds its Redis.

The request path never waits on Redis for reads: members (breakers, buckets, ledgers) serve
from caches that the background thread refreshes every ``sync_interval``. Writes that must be
atomic fleet-wide are synchronous script calls with a short ``socket_timeout``. After any Redis
error the process runs on local state for ``retry_interval`` seconds without touching the
network; the background thread then reconnects, lets every member push what happened locally
and switches back. See docs/scaling-out.md for the semantics.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.policy import BreakerPolicy, SharedStatePolicy
from llm_resilience_plugin.shared_state._breakers import BREAKER_SCRIPTS, RedisBreakerBackend
from llm_resilience_plugin.shared_state._budgets import BUCKET_SCRIPTS, RedisTokenBucket
from llm_resilience_plugin.shared_state._common import Member, SharedStateUnavailable

logger = logging.getLogger("llm_resilience.shared_state")

T = TypeVar("T")


class RedisSharedState:
    """One Redis connection pool per process, its health, and the background sync thread.

    Build it with :meth:`get` (one instance per URL, namespace and settings per process, shared by
    every router, budget and ledger that names them) or directly. Thread-safe; survives ``fork``
    (the thread and the connections are re-created in the child on first use).
    """

    # Raised by :meth:`run` and :meth:`command` while Redis is unreachable. Members in higher
    # layers (the cost ledger) catch it through this attribute, so they need not import redis-py.
    Unavailable: ClassVar[type[SharedStateUnavailable]] = SharedStateUnavailable

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
        self._lock = threading.Lock()
        self._scripts: dict[str, Any] = {}
        self.load_scripts({**BREAKER_SCRIPTS, **BUCKET_SCRIPTS})
        self._sync_lock = threading.Lock()
        self._members: weakref.WeakSet[Member] = weakref.WeakSet()
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
        """Why Redis was last found unreachable ("" while it is available)."""
        return self._down_reason

    @property
    def redacted_url(self) -> str:
        """The URL without its password, for logs and reprs."""
        return _safe_url(self.url)

    def mark_down(self, exc: BaseException) -> None:
        """Switch to local state for ``retry_interval`` seconds after a Redis error."""
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

    def command(self, fn: Callable[[redis.Redis], T]) -> T:
        """Run ``fn(client)`` now (plain commands or a pipeline) or raise
        :class:`SharedStateUnavailable`: at once while Redis is down, else after a Redis error
        (which marks it down)."""
        self.ensure_thread()
        if not self._available:
            raise SharedStateUnavailable(self._down_reason or "reconnecting")
        try:
            return fn(self.client)
        except redis.RedisError as e:
            self.mark_down(e)
            raise SharedStateUnavailable(self._down_reason) from e

    def script(self, name: str) -> Any:
        """The registered script ``name`` (a redis-py ``Script``: calling it raises Redis errors)."""
        return self._scripts[name]

    def load_scripts(self, scripts: Mapping[str, str]) -> None:
        """Register Lua scripts by name (no round trip; a member in another layer, such as the
        cost ledger, brings its own). Reloaded with the others when Redis forgets them."""
        with self._lock:
            added = dict(self._scripts)  # copy on write: the background thread may be iterating
            for name, src in scripts.items():
                known = added.get(name)
                if known is None:
                    added[name] = self.client.register_script(src)
                elif known.script != src:
                    raise ValueError(f"another Lua script is already registered as {name!r}")
            self._scripts = added

    def queue(self, pipe: Any, name: str, keys: Sequence[str], args: Sequence[Any]) -> None:
        """Queue a script on a pipeline by its SHA only (redis-py's Script objects would add a
        ``SCRIPT EXISTS`` round trip to every pipeline)."""
        pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)

    # -- members and the background thread -------------------------------------------------------

    def register(self, member: Member) -> None:
        """Keep ``member`` in sync from the background thread (held weakly)."""
        self._members.add(member)
        self.ensure_thread()

    def ensure_thread(self) -> None:
        """Start the background thread if it is not running (again after a ``fork``)."""
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

    def prime(self, members: Sequence[Member]) -> None:
        """Load the current shared state of new members now (one round trip), so a process that
        starts while a breaker is open never sees it closed."""
        self.ensure_thread()
        if self._available:
            self.sync_members(list(members))

    def sync_members(self, members: list[Member]) -> None:
        """One periodic sync of ``members`` in a single pipeline (never two at once)."""
        if not members:
            return
        with self._sync_lock:  # the background thread and prime() never sync concurrently
            self._sync_members(members)

    def _sync_members(self, members: list[Member]) -> None:
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

    def _reconnect(self, members: list[Member]) -> None:
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

    def unregister(self, member: Member) -> None:
        """Stop syncing ``member``."""
        self._members.discard(member)

    def release_router(self, release: Callable[[Any], None], sync: Any, members: Sequence[Member]) -> None:
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
        """A deployment's breaker on Redis, synced from now on."""
        backend = RedisBreakerBackend(
            self, f"{self.namespace}:{router_key}:{deployment_id}", deployment_id, policy, lease=lease
        )
        self.register(backend)
        return backend

    def token_bucket(self, router_key: str, group: str, capacity: float) -> RedisTokenBucket:
        """A model group's retry-budget bucket on Redis, synced from now on."""
        bucket = RedisTokenBucket(self, f"{self.namespace}:{router_key}:retry_budget:{group}", capacity)
        self.register(bucket)
        return bucket

    def pace(self, router_key: str, deployment_id: str, *, fail_closed: bool = False) -> Any:
        """A deployment's rate limit on Redis, shared by the fleet (see ``_pacing.RedisPace``)."""
        from llm_resilience_plugin.shared_state._pacing import RedisPace

        return RedisPace(self, f"{self.namespace}:{router_key}:pace:{deployment_id}", fail_closed=fail_closed)

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


__all__ = ["RedisSharedState", "attach_router", "redis_url_from_settings", "router_key"]
