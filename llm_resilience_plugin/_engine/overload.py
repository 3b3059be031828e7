"""Two questions a group's retry loop asks the engine after a failure: is a healthy deployment of
the group free for this call (then the retry goes there at once, no backoff), and are the group's
Retry-After holds our own load (a 429 storm: fail over, do not queue)? See _engine.holds."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llm_resilience_plugin._engine.core import CallState
from llm_resilience_plugin._engine.retry import RetryAfterHeld
from llm_resilience_plugin.errors import ErrorClass, Failure

if TYPE_CHECKING:
    from llm_resilience_plugin._engine.engine import Engine


def fresh_elsewhere(engine: Engine, call: CallState, group: str) -> bool:
    """Is some deployment of ``group`` free for this call right now: one it has not failed on,
    whose breaker is closed and which holds no Retry-After? A retry there needs no backoff: the
    backoff gives the deployment that failed time, and the next pick prefers the fresh one."""
    now = engine.clock.wall()
    for dep in engine.group_deployments[group]:
        if dep in call.failed or dep in call.never_again or engine.breaker_state(dep) != "closed":
            continue
        if engine.breakers[dep].held_for(now) <= 0:
            return True
    return False


def overloaded(engine: Engine, call: CallState, group: str) -> bool:
    """Are ``group``'s Retry-After holds our own load (among the deployments this call may use)?
    Yes when every held one is saturated (it refused several of our concurrent requests while
    answering others), or when two or more are held and their holds refused requests of more
    than one of our calls at once (the whole group refusing our concurrent demand together: the
    router spreads it evenly; one call refused by each in turn is not load). Waiting for such a
    hold cannot help: the call fails over."""
    now = engine.clock.wall()
    holds = engine.hold_queue
    held = [d for d in engine.admissible(call, group, now) if engine.breakers[d].held_for(now) > 0]
    if not held:
        return False
    if len(held) >= 2:
        if any(holds.crowded(d) for d in held):
            return True
        callers = {holds.refused_first(d) for d in held}
        if None not in callers and len(callers) >= 2:
            return True
    return all(holds.saturated(d) for d in held)


def held_back(engine: Engine, call: CallState, group: str) -> Failure | None:
    """A skip instead of a request when every deployment of ``group`` this call may use holds
    a ``Retry-After`` (the hold rules, with pacing off): the provider asked not to be sent to
    before then, so the call waits out the hold on this group (within ``max_wait_with_fallback``
    and the deadline) or fails over, and nothing is sent. None when some deployment is free (or
    nothing is admissible: the breakers decide). Cheap while no hold is pending."""
    hold = engine.hold_until
    if not hold or engine.clock.wall() >= hold:
        return None
    free_in = engine.earliest_free(call, group)
    if free_in <= 0:
        return None
    why = f"every deployment of {group!r} holds a Retry-After ({free_in:.2f} s left): nothing sent"
    return Failure(ErrorClass.RATE_LIMIT, None, why, free_in, RetryAfterHeld(group, free_in))
