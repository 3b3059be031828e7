"""Per-deployment circuit breakers: pybreaker's state machine and storage behind a safe gate.

pybreaker's ``call``/``calling``/``call_async`` are not safe around coroutines (every concurrent
call passes in half-open, stale successes close re-opened breakers, cancellation counts as a
failure). So admission is decided here, synchronously under a lock, and outcomes are recorded
afterwards against the *generation* the call was admitted under: an outcome from an older
generation is ignored.

Where the state lives is a :class:`BreakerBackend`: every state operation (admit, record a
success or a failure, release) is one atomic step of the backend.

* :class:`MemoryBreakerBackend` (the default): pybreaker owns the state, the counters,
  ``opened_at`` and the storage (any ``pybreaker.CircuitBreakerStorage``); this process owns the
  generation and the half-open probe count.
* ``llm_resilience_plugin.shared_state.RedisBreakerBackend``: the same state machine as Lua
  scripts on Redis (pybreaker's state names and ``CircuitRedisStorage`` key names), so every
  process sharing the Redis sees one breaker, one generation and one fleet-wide probe limit.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pybreaker

from llm_resilience_plugin.events import BreakerTransition
from llm_resilience_plugin.policy import BreakerPolicy

CLOSED = pybreaker.STATE_CLOSED
OPEN = pybreaker.STATE_OPEN
HALF_OPEN = pybreaker.STATE_HALF_OPEN
# pybreaker's storages keep ``opened_at`` as a datetime (1 µs): a window is reached when ``now`` is
# within that rounding of its end, so a breaker opened at t reopens for probes at t + window exactly.
_DATETIME_RESOLUTION = 1e-6


@dataclass(frozen=True, slots=True)
class Admission:
    """A ticket for one attempt on one deployment; hand it back with the outcome.

    ``lease`` names a shared backend's half-open probe slot (None otherwise)."""

    deployment_id: str
    generation: int
    probe: bool
    lease: str | None = None


TransitionListener = Callable[[BreakerTransition], None]


@dataclass(frozen=True, slots=True)
class BreakerView:
    """One breaker's state as its backend last knew it (wall-clock seconds for ``opened_at``)."""

    state: str = CLOSED
    generation: int = 0
    fail_counter: int = 0
    success_counter: int = 0
    opened_at: float = 0.0
    probes: int = 0
    open_for: float | None = None  # how long this opening lasts (None: the policy's reset_timeout)
    rate_limited: int = 0  # 429s in a row, where the backend counts them (a shared one)


@dataclass(frozen=True, slots=True)
class Change:
    """A state change a backend made (or saw): the gate turns it into a BreakerTransition."""

    old_state: str
    new_state: str
    fail_counter: int


class BreakerBackend(ABC):
    """Where one breaker's state lives. :class:`DeploymentBreaker` calls every mutating method
    under its lock; each is one atomic step and returns the state changes it made.

    ``view`` must be cheap (it is read several times per routing decision); a remote backend
    serves it from a cache."""

    @abstractmethod
    def view(self) -> BreakerView:
        """The current (or last known) state; no I/O on the request path."""

    @property
    def state(self) -> str:
        return self.view().state

    @property
    def generation(self) -> int:
        return self.view().generation

    @abstractmethod
    def admit(self, now: float) -> tuple[Admission | None, list[Change]]:
        """Admit one attempt (closed: any; open past ``reset_timeout``: move to half-open; half-open:
        up to ``half_open_max_probes`` probes), or refuse with None."""

    @abstractmethod
    def record_success(self, admission: Admission, now: float) -> list[Change]:
        """A success: a probe counts towards closing, anything else resets the fail counter."""

    @abstractmethod
    def record_failure(self, admission: Admission, now: float) -> list[Change]:
        """A failure: a probe re-opens; anything else counts towards ``fail_max``."""

    @abstractmethod
    def release(self, admission: Admission) -> list[Change]:
        """Neither success nor failure: free a probe slot."""

    def success_is_noop(self, admission: Admission) -> bool:
        """True when :meth:`record_success` would change nothing and may be skipped (checked
        without the breaker's lock, so only from state held in this process)."""
        return False

    @property
    def shares_rate_limits(self) -> bool:
        """Does this backend count 429s itself (fleet-wide), through :meth:`record_rate_limited`?"""
        return False

    def record_rate_limited(self, admission: Admission, limit: int, now: float) -> list[Change]:
        """A 429 (only called when :attr:`shares_rate_limits`): ``limit`` in a row open it."""
        raise NotImplementedError

    def has_expired_probe(self, now: float) -> bool:
        """Is a probe slot held by a probe past its lease (so :meth:`admit` would free it)?"""
        return False

    def observed(self) -> list[Change]:
        """Changes made elsewhere (other processes) that this process has seen since the last call."""
        return []

    @property
    def has_observed(self) -> bool:
        return False


class MemoryBreakerBackend(BreakerBackend):
    """One process's breaker: pybreaker's ``CircuitBreaker`` over any pybreaker storage.

    Generation and probe count are this process's (so with pybreaker's own
    ``CircuitRedisStorage`` the state is shared but the probe limit is not; use the Redis backend
    for that)."""

    # Plain attributes, not properties: every attempt reads them (through its breaker's ticket).
    generation: int = 0
    has_observed: bool = False  # nothing changes elsewhere

    def __init__(
        self,
        name: str,
        policy: BreakerPolicy,
        *,
        storage: pybreaker.CircuitBreakerStorage | None = None,
        generation: int = 0,
        probe_lease: float | None = None,
    ) -> None:
        """``probe_lease``: seconds after which a half-open probe that never reported back (a
        stream the caller dropped, a task that vanished) frees its slot; None keeps it until then."""
        self.policy = policy
        self.generation = generation
        self._probe_lease = probe_lease
        self._streak = 0  # trips in a row without closing: each one doubles how long it stays open
        self._probe_started: list[float] = []  # when each probe in flight was admitted
        # Kept here as well as handed to pybreaker (which keeps it in its private _state_storage).
        self._storage = storage or pybreaker.CircuitMemoryStorage(CLOSED)
        self._cb = pybreaker.CircuitBreaker(
            fail_max=policy.fail_max,
            reset_timeout=policy.reset_timeout,
            success_threshold=policy.success_threshold,
            state_storage=self._storage,
            name=name,
            throw_new_error_on_trip=False,
        )
        # pybreaker's in-memory storage: counters can be read without I/O (see success_is_noop).
        self._local_storage = type(self._storage) is pybreaker.CircuitMemoryStorage

    @classmethod
    def from_view(cls, name: str, policy: BreakerPolicy, view: BreakerView) -> MemoryBreakerBackend:
        """A local copy of ``view`` (state, counters, ``opened_at``) at ``view.generation``."""
        backend = cls(
            name, policy, storage=pybreaker.CircuitMemoryStorage(view.state), generation=view.generation
        )
        s = backend._storage
        for _ in range(max(0, view.fail_counter)):
            s.increment_counter()
        for _ in range(max(0, view.success_counter)):
            s.increment_success_counter()
        if view.state != CLOSED:
            s.opened_at = datetime.fromtimestamp(view.opened_at, UTC)
        return backend

    def _opened_at(self) -> float:
        opened = self._storage.opened_at
        return opened.timestamp() if opened is not None else 0.0

    @property
    def state(self) -> str:
        return self._cb.current_state

    def view(self) -> BreakerView:
        return BreakerView(
            state=self._cb.current_state,
            generation=self.generation,
            fail_counter=self._storage.counter,
            success_counter=self._storage.success_counter,
            opened_at=self._opened_at(),
            probes=len(self._probe_started),
            open_for=self.policy.window(max(1, self._streak)),
        )

    def admit(self, now: float) -> tuple[Admission | None, list[Change]]:
        changes: list[Change] = []
        name = self._cb.name or ""
        state = self._cb.current_state
        if state == CLOSED:
            return Admission(name, self.generation, probe=False), changes
        if state == OPEN:
            if now + _DATETIME_RESOLUTION < self._opened_at() + self.policy.window(self._streak):
                return None, changes
            self._transition(self._cb.half_open, changes)
        lease = self._probe_lease
        if lease is not None:  # a probe that never reported back within its lease is gone
            self._probe_started = [t for t in self._probe_started if now - t < lease]
        if len(self._probe_started) >= self.policy.half_open_max_probes:
            return None, changes
        self._probe_started.append(now)
        return Admission(name, self.generation, probe=True), changes

    def success_is_noop(self, admission: Admission) -> bool:
        # The common healthy case: a closed-state success with no failure counted. A failure
        # racing this check is ordered after the success, which is a valid order.
        return (
            self._local_storage
            and not admission.probe
            and (admission.generation != self.generation or self._storage.counter == 0)
        )

    def record_success(self, admission: Admission, now: float) -> list[Change]:
        changes: list[Change] = []
        if admission.generation != self.generation:
            return changes  # admitted under an older state: its outcome says nothing about now
        if admission.probe:
            self._free_probe()
            self._storage.increment_success_counter()
            if self._storage.success_counter >= self.policy.success_threshold:
                self._transition(self._cb.close, changes)
                self._streak = 0
        else:
            self._storage.reset_counter()
        return changes

    def record_failure(self, admission: Admission, now: float) -> list[Change]:
        changes: list[Change] = []
        if admission.generation != self.generation:
            return changes
        if admission.probe:
            self._free_probe()
            self._trip(now, changes)
            return changes
        self._storage.increment_counter()
        if self._storage.counter >= self.policy.fail_max:
            self._trip(now, changes)
        return changes

    def release(self, admission: Admission) -> list[Change]:
        if admission.probe and admission.generation == self.generation:
            self._free_probe()
        return []

    def has_expired_probe(self, now: float) -> bool:
        lease = self._probe_lease
        return lease is not None and any(now - t >= lease for t in self._probe_started)

    def _free_probe(self) -> None:
        if self._probe_started:
            self._probe_started.pop(0)

    def _trip(self, now: float, changes: list[Change]) -> None:
        self._streak += 1
        self._transition(self._cb.open, changes)
        # pybreaker stamps datetime.now(); use our clock so fake clocks and stores agree.
        self._storage.opened_at = datetime.fromtimestamp(now, UTC)

    def _transition(self, action: Callable[[], object], changes: list[Change]) -> None:
        old = self._cb.current_state
        action()
        self.generation += 1
        self._probe_started = []
        new = self._cb.current_state
        if old != new:
            changes.append(Change(old, new, self._storage.counter))


class DeploymentBreaker:
    """The gate for one deployment: admit, then record success, failure, or release."""

    def __init__(
        self,
        deployment_id: str,
        model_group: str,
        policy: BreakerPolicy,
        *,
        clock: Callable[[], float] = time.time,
        on_transition: TransitionListener | None = None,
        storage: pybreaker.CircuitBreakerStorage | None = None,
        backend: BreakerBackend | None = None,
        probe_lease: float | None = None,
    ) -> None:
        self.deployment_id = deployment_id
        self.model_group = model_group
        self.policy = policy
        self._clock = clock
        self._on_transition = on_transition
        self._lock = threading.Lock()
        self._hold_until = 0.0
        self._rate_limited = 0  # 429s in a row since the last success
        self._rate_limited_since = 0.0  # when the first of them came
        self._ticket: Admission | None = None  # the plain ticket of the last generation seen
        if backend is not None and storage is not None:
            raise ValueError("pass a pybreaker storage or a backend, not both")
        self.backend: BreakerBackend = backend or MemoryBreakerBackend(
            deployment_id, policy, storage=storage, probe_lease=probe_lease
        )

    # -- reading -------------------------------------------------------------------------------

    def _drain(self) -> None:
        if self.backend.has_observed:
            with self._lock:
                self._emit(self.backend.observed())

    def _view(self) -> BreakerView:
        self._drain()
        return self.backend.view()

    @property
    def state(self) -> str:
        """'closed', 'open' or 'half-open' as stored (a shared backend: as last synced)."""
        self._drain()
        return self.backend.state

    @property
    def generation(self) -> int:
        self._drain()
        return self.backend.generation

    def ticket(self, generation: int | None = None) -> Admission:
        """The plain (non-probe) ticket of ``generation`` (default: the current one): one
        immutable object per generation, shared by the attempts admitted under it."""
        if generation is None:  # the ``generation`` property, inline (every attempt asks)
            backend = self.backend
            if backend.has_observed:
                with self._lock:
                    self._emit(backend.observed())
            gen = backend.generation
        else:
            gen = generation
        t = self._ticket
        if t is None or t.generation != gen:
            t = Admission(self.deployment_id, gen, probe=False)
            if generation is None:
                self._ticket = t
        return t

    def retry_at(self) -> float | None:
        """When an open breaker will admit a probe (wall-clock seconds), else None."""
        v = self._view()
        if v.state != OPEN:
            return None
        return v.opened_at + self._open_for(v)

    def _open_for(self, v: BreakerView) -> float:
        return v.open_for if v.open_for is not None else self.policy.reset_timeout

    def could_admit(self, now: float | None = None) -> bool:
        """Would :meth:`admit` succeed now? (No side effects.)"""
        if not self.policy.enabled:
            return True
        self._drain()
        if self.backend.state == CLOSED:
            return True
        now = self._clock() if now is None else now
        v = self.backend.view()
        if v.state == CLOSED:
            return True
        if v.state == OPEN:
            return now + _DATETIME_RESOLUTION >= v.opened_at + self._open_for(v)
        return v.probes < self.policy.half_open_max_probes or self.backend.has_expired_probe(now)

    def hold(self, seconds: float) -> None:
        """Ask the router to avoid this deployment for ``seconds`` (a Retry-After), if it can."""
        with self._lock:
            self._hold_until = max(self._hold_until, self._clock() + seconds)

    def held_for(self, now: float | None = None) -> float:
        now = self._clock() if now is None else now
        return max(0.0, self._hold_until - now)

    def snapshot(self) -> dict[str, Any]:
        v = self._view()
        return {
            "deployment_id": self.deployment_id,
            "model_group": self.model_group,
            "state": v.state,
            "fail_counter": v.fail_counter,
            "generation": v.generation,
            "probes_in_flight": v.probes,
            "retry_at": v.opened_at + self._open_for(v) if v.state == OPEN else None,
        }

    # -- admission -----------------------------------------------------------------------------

    def admit(self) -> Admission | None:
        """Admit one attempt now, or return None (open, or half-open with its probes taken)."""
        if not self.policy.enabled:
            return Admission(self.deployment_id, self.generation, probe=False)
        with self._lock:
            self._emit(self.backend.observed())
            adm, changes = self.backend.admit(self._clock())
            self._emit(changes)
        if adm is not None and adm.deployment_id != self.deployment_id:
            adm = Admission(self.deployment_id, adm.generation, adm.probe, adm.lease)
        return adm

    def record_success(self, admission: Admission) -> None:
        if self._rate_limited:
            self._rate_limited = 0
        if not self.policy.enabled or self.backend.success_is_noop(admission):
            return
        with self._lock:
            self._emit(self.backend.observed())
            self._emit(self.backend.record_success(admission, self._clock()))

    def record_failure(self, admission: Admission) -> None:
        if not self.policy.enabled:
            return
        with self._lock:
            self._emit(self.backend.observed())
            self._emit(self.backend.record_failure(admission, self._clock()))

    def record_rate_limited(self, admission: Admission) -> None:
        """A 429: not an outage. The breaker opens only for a deployment that has answered
        nothing but 429s - at least ``rate_limit_fail_max`` in a row over at least
        ``rate_limit_open_after`` seconds (an exhausted quota); any answer ends the streak."""
        limit = self.policy.rate_limit_fail_max
        now = self._clock()
        if not self._rate_limited:
            self._rate_limited_since = now
        self._rate_limited += 1
        if (
            limit is None
            or not self.policy.enabled
            or self._rate_limited < limit
            or now - self._rate_limited_since < self.policy.rate_limit_open_after
        ):
            self.release(admission)
            return
        self._rate_limited = 0
        if self.backend.shares_rate_limits:
            with self._lock:  # the fleet's breaker: this process's streak is the evidence
                self._emit(self.backend.observed())
                self._emit(self.backend.record_rate_limited(admission, 1, now))
            return
        with self._lock:
            self._emit(self.backend.observed())
            for _ in range(self.policy.fail_max):  # enough failures to trip it, whatever the backend
                changes = self.backend.record_failure(admission, now)
                self._emit(changes)
                if changes:
                    break

    def release(self, admission: Admission) -> None:
        """Neither success nor failure (cancelled, or the caller's own error)."""
        if not self.policy.enabled:
            return
        with self._lock:
            self._emit(self.backend.observed())
            self._emit(self.backend.release(admission))

    # -- transitions (lock held) ---------------------------------------------------------------

    def _emit(self, changes: list[Change]) -> None:
        if not changes or self._on_transition is None:
            return
        at = self._clock()
        for c in changes:
            self._on_transition(
                BreakerTransition(
                    self.deployment_id, self.model_group, c.old_state, c.new_state, at, c.fail_counter
                )
            )


class BreakerRegistry(dict[str, DeploymentBreaker]):
    """All breakers of one router, keyed by deployment id (a dict, so the lookup every attempt
    makes is no Python call); iterating it gives the breakers.

    ``retired``: the breakers of deployments taken out of the model list. Only ``registry[id]``
    still finds one (an attempt in flight there reports its outcome); ``in``, ``get``, iteration
    and :meth:`snapshot` see the live breakers only."""

    def __init__(self, *args: Any, retired: dict[str, DeploymentBreaker] | None = None) -> None:
        super().__init__(*args)
        self.retired: dict[str, DeploymentBreaker] = retired if retired is not None else {}

    def __missing__(self, deployment_id: str) -> DeploymentBreaker:
        return self.retired[deployment_id]

    def add(self, breaker: DeploymentBreaker) -> None:
        self[breaker.deployment_id] = breaker

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.values())

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {k: b.snapshot() for k, b in self.items()}
