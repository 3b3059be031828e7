"""Per-deployment circuit breakers: pybreaker's state machine and storage behind a safe gate.

pybreaker's ``call``/``calling``/``call_async`` are not safe around coroutines (every concurrent
call passes in half-open, stale successes close re-opened breakers, cancellation counts as a
failure). So admission is decided here, synchronously under a lock, and outcomes are recorded
afterwards against the *generation* the call was admitted under: an outcome from an older
generation is ignored. pybreaker still owns the state, the counters, ``opened_at``, the storage
(memory or Redis) and the listener notifications.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pybreaker

from llm_resilience_plugin.config import BreakerPolicy

CLOSED = pybreaker.STATE_CLOSED
OPEN = pybreaker.STATE_OPEN
HALF_OPEN = pybreaker.STATE_HALF_OPEN


@dataclass(frozen=True, slots=True)
class Admission:
    """A ticket for one attempt on one deployment; hand it back with the outcome."""

    deployment_id: str
    generation: int
    probe: bool


@dataclass(frozen=True, slots=True)
class BreakerTransition:
    """A breaker changed state (emitted once per transition)."""

    deployment_id: str
    model_group: str
    old_state: str
    new_state: str
    at: float
    fail_counter: int


TransitionListener = Callable[[BreakerTransition], None]


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
    ) -> None:
        self.deployment_id = deployment_id
        self.model_group = model_group
        self.policy = policy
        self._clock = clock
        self._on_transition = on_transition
        self._lock = threading.Lock()
        self._generation = 0
        self._probes = 0
        self._hold_until = 0.0
        self._cb = pybreaker.CircuitBreaker(
            fail_max=policy.fail_max,
            reset_timeout=policy.reset_timeout,
            success_threshold=policy.success_threshold,
            state_storage=storage or pybreaker.CircuitMemoryStorage(CLOSED),
            name=deployment_id,
            throw_new_error_on_trip=False,
        )
        self._storage = self._cb._state_storage

    # -- reading -------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """'closed', 'open' or 'half-open' as stored."""
        return self._cb.current_state

    @property
    def generation(self) -> int:
        return self._generation

    def _opened_at(self) -> float:
        opened = self._storage.opened_at
        return opened.timestamp() if opened is not None else 0.0

    def retry_at(self) -> float | None:
        """When an open breaker will admit a probe (wall-clock seconds), else None."""
        if self.state != OPEN:
            return None
        return self._opened_at() + self.policy.reset_timeout

    def could_admit(self, now: float | None = None) -> bool:
        """Would :meth:`admit` succeed now? (No side effects.)"""
        if not self.policy.enabled:
            return True
        now = self._clock() if now is None else now
        state = self.state
        if state == CLOSED:
            return True
        if state == OPEN:
            return now >= self._opened_at() + self.policy.reset_timeout
        return self._probes < self.policy.half_open_max_probes

    def hold(self, seconds: float) -> None:
        """Ask the router to avoid this deployment for ``seconds`` (a Retry-After), if it can."""
        with self._lock:
            self._hold_until = max(self._hold_until, self._clock() + seconds)

    def held_for(self, now: float | None = None) -> float:
        now = self._clock() if now is None else now
        return max(0.0, self._hold_until - now)

    def snapshot(self) -> dict[str, Any]:
        retry_at = self.retry_at()
        return {
            "deployment_id": self.deployment_id,
            "model_group": self.model_group,
            "state": self.state,
            "fail_counter": self._storage.counter,
            "generation": self._generation,
            "probes_in_flight": self._probes,
            "retry_at": retry_at,
        }

    # -- admission -----------------------------------------------------------------------------

    def admit(self) -> Admission | None:
        """Admit one attempt now, or return None (open, or half-open with its probes taken)."""
        if not self.policy.enabled:
            return Admission(self.deployment_id, self._generation, probe=False)
        with self._lock:
            state = self.state
            if state == CLOSED:
                return Admission(self.deployment_id, self._generation, probe=False)
            if state == OPEN:
                if self._clock() < self._opened_at() + self.policy.reset_timeout:
                    return None
                self._transition(self._cb.half_open)
                state = HALF_OPEN
            if self._probes >= self.policy.half_open_max_probes:
                return None
            self._probes += 1
            return Admission(self.deployment_id, self._generation, probe=True)

    def record_success(self, admission: Admission) -> None:
        if not self.policy.enabled:
            return
        with self._lock:
            if admission.generation != self._generation:
                return  # admitted under an older state: its outcome says nothing about now
            if admission.probe:
                self._probes = max(0, self._probes - 1)
                self._storage.increment_success_counter()
                if self._storage.success_counter >= self.policy.success_threshold:
                    self._transition(self._cb.close)
            else:
                self._storage.reset_counter()

    def record_failure(self, admission: Admission) -> None:
        if not self.policy.enabled:
            return
        with self._lock:
            if admission.generation != self._generation:
                return
            if admission.probe:
                self._probes = max(0, self._probes - 1)
                self._trip()
                return
            self._storage.increment_counter()
            if self._storage.counter >= self.policy.fail_max:
                self._trip()

    def release(self, admission: Admission) -> None:
        """Neither success nor failure (cancelled, or the caller's own error)."""
        if not self.policy.enabled:
            return
        with self._lock:
            if admission.probe and admission.generation == self._generation:
                self._probes = max(0, self._probes - 1)

    # -- transitions (lock held) ---------------------------------------------------------------

    def _trip(self) -> None:
        self._transition(self._cb.open)
        # pybreaker stamps datetime.now(); use our clock so fake clocks and stores agree.
        self._storage.opened_at = datetime.fromtimestamp(self._clock(), UTC)

    def _transition(self, action: Callable[[], object]) -> None:
        old = self.state
        action()
        self._generation += 1
        self._probes = 0
        new = self.state
        if self._on_transition is not None and old != new:
            self._on_transition(
                BreakerTransition(
                    self.deployment_id,
                    self.model_group,
                    old,
                    new,
                    self._clock(),
                    self._storage.counter,
                )
            )


class BreakerRegistry:
    """All breakers of one router, keyed by deployment id."""

    def __init__(self) -> None:
        self._breakers: dict[str, DeploymentBreaker] = {}

    def add(self, breaker: DeploymentBreaker) -> None:
        self._breakers[breaker.deployment_id] = breaker

    def get(self, deployment_id: str) -> DeploymentBreaker | None:
        return self._breakers.get(deployment_id)

    def __getitem__(self, deployment_id: str) -> DeploymentBreaker:
        return self._breakers[deployment_id]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._breakers.values())

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {k: b.snapshot() for k, b in self._breakers.items()}
