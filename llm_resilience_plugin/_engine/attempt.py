"""One attempt's context: the deployment filter's choice, its breaker ticket, its guard tokens."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llm_resilience_plugin._engine.breakers import Admission, DeploymentBreaker
from llm_resilience_plugin._engine.core import CallState
from llm_resilience_plugin._engine.pacing import Grant
from llm_resilience_plugin._engine.prefill import can_prefill
from llm_resilience_plugin.errors import CircuitOpenError, Failure
from llm_resilience_plugin.events import AttemptGuard

if TYPE_CHECKING:
    from llm_resilience_plugin._engine.engine import Engine

ATTEMPT_IDS = itertools.count()


_SPEND_FLAGS: dict[type, bool] = {}


def _takes_spend_flags(guard: Any) -> bool:
    """Does ``guard.after_attempt`` accept ``billable``/``produced`` (checked once per class)?"""
    cls = type(guard)
    known = _SPEND_FLAGS.get(cls)
    if known is None:
        try:
            params = inspect.signature(guard.after_attempt).parameters
        except (TypeError, ValueError):
            params = {}  # type: ignore[assignment]
        known = _SPEND_FLAGS[cls] = ("billable" in params and "produced" in params) or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
        )
    return known


def deployment_id_of(d: Mapping[str, Any]) -> str:
    """The id of one of LiteLLM's deployment dicts."""
    return str((d.get("model_info") or {}).get("id"))


@dataclass(slots=True)
class AttemptContext:
    """One attempt in flight: where it may go, where it went, its breaker ticket and guard tokens."""

    engine: Engine
    call: CallState
    group: str
    exclude: frozenset[str] = frozenset()
    token: str = ""  # names this attempt to the dispatcher's hooks
    hedged: bool = False  # a hedge must know its deployment while the request is in flight
    timeout_s: float = 0.0  # this attempt's time limit (to the first chunk for a stream)
    number: int = 0  # the call's attempt number when this one opened (a hedge race runs two at once)
    admission: Admission | None = None
    # The breaker generation of each candidate the filter let through; None until it runs (most
    # attempts never filter: no dict, no GC-tracked object per attempt).
    generations: dict[str, int] | None = None
    picked: str | None = None
    sent: bool = False
    # LiteLLM's hidden params of the answer ``send`` returned, when the dispatcher read them
    # (so the engine's record does not read them again); None otherwise.
    hidden: dict[str, Any] | None = None
    # (guard, token) per guard consulted; an empty tuple until the first guard is consulted.
    guard_tokens: Sequence[tuple[AttemptGuard, Any]] = ()
    # What the dispatcher holds for this attempt (hooks, registrations), let go once the engine
    # has accounted for the outcome; None until the first (most attempts hold nothing).
    cleanups: list[Callable[[], None]] | None = None
    # The rate-limit slot this attempt took (see _engine.pacing); None when nothing is paced.
    grant: Grant | None = None

    def on_clean_up(self, fn: Callable[[], None]) -> None:
        """Have :meth:`clean_up` call ``fn`` (once)."""
        if self.cleanups is None:
            self.cleanups = [fn]
        else:
            self.cleanups.append(fn)

    def clean_up(self) -> None:
        """Run and forget the dispatcher's cleanups (each once)."""
        cleanups, self.cleanups = self.cleanups, None
        if cleanups:
            for fn in cleanups:
                fn()

    def settle_guards(
        self,
        response: Any | None,
        usage: Mapping[str, int] | None,
        failure: Failure | None,
        *,
        billable: bool = False,
        produced: bool = False,
    ) -> None:
        """Tell every guard how the attempt ended (once). ``billable``: it failed or was cut
        short after the request was sent, so the provider may bill it; ``produced``: content
        reached the caller. Guards that do not take these keywords are called without them."""
        tokens, self.guard_tokens = self.guard_tokens, ()
        for guard, token in tokens:
            extra = {"billable": billable, "produced": produced} if _takes_spend_flags(guard) else {}
            try:
                guard.after_attempt(
                    token,
                    deployment_id=self.picked,
                    response=response,
                    usage=usage,
                    failure=failure,
                    **extra,
                )
            except Exception:
                import logging

                logging.getLogger("llm_resilience").exception("attempt guard failed to settle")

    def select(self, healthy: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Choose which of LiteLLM's candidates may be picked (the deployment filter)."""
        if self.admission is not None:  # LiteLLM asked twice for one attempt: keep the ticket
            kept = [d for d in healthy if deployment_id_of(d) == self.admission.deployment_id]
            if kept:
                return kept
        breakers = self.engine.breakers
        call = self.call
        if not call.failed and not self.exclude and not call.require_prefill and self.engine.all_clear():
            # Fast path: every breaker closed, nothing held: LiteLLM's candidates stand as they are.
            if len(healthy) == 1:
                self.pick(deployment_id_of(healthy[0]))
            return healthy
        now = self.engine.clock.wall()
        preferred: list[dict[str, Any]] = []
        fallback: list[dict[str, Any]] = []
        probes: list[tuple[DeploymentBreaker, dict[str, Any]]] = []
        blocked: list[str] = []
        for d in healthy:
            dep = deployment_id_of(d)
            if call.require_prefill and not can_prefill(self.engine, dep):
                continue  # cannot continue the stream: not a candidate (nor a breaker's doing)
            b = breakers.get(dep)
            if b is None:
                preferred.append(d)
                continue
            if dep in call.never_again or dep in self.exclude:
                blocked.append(dep)
                continue
            state = b.state
            if state != "closed":
                if b.could_admit(now) and dep not in call.failed:
                    probes.append((b, d))
                else:
                    blocked.append(dep)
                continue
            if dep in call.failed or b.held_for(now) > 0:
                fallback.append(d)
            else:
                preferred.append(d)
        # A recovering deployment gets its probe first, so it is tested promptly.
        for b, d in probes:
            adm = b.admit()
            if adm is not None:
                self.admission = adm
                self.picked = b.deployment_id
                return [d]
        pool = preferred or fallback
        if not pool:
            raise CircuitOpenError(self.group, blocked or [deployment_id_of(d) for d in healthy])
        generations = self.generations
        if generations is None:
            generations = self.generations = {}
        for d in pool:
            dep = deployment_id_of(d)
            b = breakers.get(dep)
            if b is not None:
                generations[dep] = b.generation
        if len(pool) == 1:
            self.pick(deployment_id_of(pool[0]))
        return pool

    def learn(self, dep: str | None, epoch: int) -> None:
        """A non-precise attempt's deployment, read back after it ended. Every breaker was closed
        when it started (router epoch ``epoch``), so its ticket is the closed one, unless that
        breaker has changed since: then, like any stale ticket, its outcome counts for nothing."""
        if self.picked is not None or dep is None:  # the pick hook saw it (another attempt's)
            return
        if self.engine.changed_at.get(dep, -1) <= epoch:
            self.pick(dep)
        else:
            self.picked = dep

    def pick(self, dep: str) -> None:
        """Record that this attempt goes to ``dep`` (with the breaker ticket it was admitted on)."""
        if self.picked is not None and self.admission is not None:
            return
        self.picked = dep
        b = self.engine.breakers.get(dep)
        if b is not None:  # its shared ticket for the generation the filter saw, or the current one
            self.admission = b.ticket(self.generations.get(dep) if self.generations is not None else None)
