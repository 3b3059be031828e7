"""A deployment's circuit breaker kept on Redis, shared by every process of the fleet.

pybreaker's state machine runs as Lua scripts (``shared_state/lua/``): one atomic round trip per
admit / success / failure / release, the generation kept in Redis (a stale outcome from any
process is ignored) and half-open probes counted fleet-wide as leases that expire (a crashed
worker cannot hold a probe forever). Keys follow pybreaker's ``CircuitRedisStorage`` naming
(``{ns}:pybreaker:state`` ...), so ``pybreaker`` tooling can read them.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import redis

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
from llm_resilience_plugin._lua import read_lua
from llm_resilience_plugin.policy import BreakerPolicy
from llm_resilience_plugin.shared_state._common import KEY_TTL, SharedStateUnavailable, ms, text

if TYPE_CHECKING:
    from llm_resilience_plugin.shared_state._connection import RedisSharedState

# The breaker scripts by name; each starts with the shared helpers (view, touch, trip).
BREAKER_SCRIPTS = {
    name: read_lua("llm_resilience_plugin.shared_state", "breaker_lib.lua", f"{name}.lua")
    for name in ("admit", "success", "failure", "release", "view", "merge", "ratelimited")
}

_STATES = {CLOSED, OPEN, HALF_OPEN}
_LOCAL_GEN_BASE = -(2**40)  # local-state generations are negative: never equal to a Redis one


def _view_of(reply: Sequence[Any], offset: int, policy: BreakerPolicy) -> BreakerView:
    """The :class:`BreakerView` in a script's reply, starting at ``offset``."""
    st = text(reply[offset])
    return BreakerView(
        state=st if st in _STATES else CLOSED,
        generation=int(reply[offset + 1]),
        fail_counter=int(reply[offset + 2]),
        success_counter=int(reply[offset + 3]),
        opened_at=int(reply[offset + 4]) / 1000.0,
        probes=int(reply[offset + 5]),
        open_for=policy.window(max(1, int(reply[offset + 6]))),
        rate_limited=int(reply[offset + 7]),
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
                "streak",
                "rate_limited",
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
        self._local_rate_limited = 0  # 429s in a row counted here while Redis is unreachable

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
                        ms(now),
                        ms(min(self.policy.min_reset_timeout, self.policy.reset_timeout)),
                        self.policy.half_open_max_probes,
                        ms(self.lease),
                        lease_id,
                        KEY_TTL,
                        ms(self._longest_open()),
                    ],
                )
            except SharedStateUnavailable:
                pass
            else:
                view = _view_of(r, 3, self.policy)
                changes = self._apply(text(r[2]), view)
                if not int(r[0]):
                    return None, changes
                probe = bool(int(r[1]))
                return Admission(self.name, view.generation, probe, lease_id if probe else None), changes
        local = self._local_backend()
        adm, changes = local.admit(now)
        return adm, self._local_changes(changes)

    def _longest_open(self) -> float:
        """The cap of the growing open window: ``reset_timeout``, or ``probe_interval`` if shorter."""
        pol = self.policy
        return pol.reset_timeout if pol.probe_interval is None else min(pol.reset_timeout, pol.probe_interval)

    @property
    def shares_rate_limits(self) -> bool:
        return True

    def record_rate_limited(self, admission: Admission, limit: int, now: float) -> list[Change]:
        """A 429, counted fleet-wide: ``limit`` in a row (no success between, from any process)
        open the breaker; fewer only free the probe slot. On local state (Redis down) it counts
        in this process until Redis is back."""
        if admission.generation < 0 or not self.shared.available:
            self._local_rate_limited += 1
            if self._local_rate_limited < limit:
                return self.release(admission)
            self._local_rate_limited = 0
            changes: list[Change] = []
            for _ in range(self.policy.fail_max):  # enough failures to trip it
                changes = self.record_failure(admission, now)
                if changes:
                    break
            return changes
        try:
            r = self._call(
                "ratelimited",
                [admission.generation, int(admission.probe), admission.lease or "", limit, ms(now), KEY_TTL],
            )
        except SharedStateUnavailable:
            return []
        return self._apply(text(r[1]), _view_of(r, 2, self.policy))

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
                    ms(now),
                    KEY_TTL,
                ],
            )
        except SharedStateUnavailable:
            return []
        return self._apply(text(r[1]), _view_of(r, 2, self.policy))

    def record_success(self, admission: Admission, now: float) -> list[Change]:
        if (
            not admission.probe
            and admission.generation >= 0
            and self._cache.fail_counter == 0
            and self._cache.rate_limited == 0
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
            r = self._call("release", [admission.lease, ms(self.shared.clock())])
        except SharedStateUnavailable:
            return []
        return self._apply(text(r[1]), _view_of(r, 2, self.policy))

    # -- background ----------------------------------------------------------------------------

    def sync(self, pipe: Any) -> Callable[[Any], None]:
        seq = self._seq
        self.shared.queue(pipe, "view", self.keys, [ms(self.shared.clock())])

        def done(replies: Any) -> None:
            r = replies[0]
            view = _view_of(r, 2, self.policy)
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
                keys=self.keys, args=[ms(lv.opened_at), ms(self.shared.clock()), KEY_TTL]
            )

    def reconnected(self) -> None:
        with self._mu:
            self._local = None
            self._seq += 1
        # Refresh now rather than at the next tick, so routing sees the merged state at once.
        try:
            r = self.shared.script("view")(keys=self.keys, args=[ms(self.shared.clock())])
        except redis.RedisError as e:
            self.shared.mark_down(e)
            return
        view = _view_of(r, 2, self.policy)
        with self._mu:
            self._cache = view
            if view.state != self._known:
                self._observed.append(Change(self._known, view.state, view.fail_counter))
                self._known = view.state


__all__ = ["BREAKER_SCRIPTS", "RedisBreakerBackend"]
