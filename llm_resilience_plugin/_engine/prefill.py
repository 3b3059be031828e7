"""Assistant prefill on the engine: which deployments may continue a broken stream, and what a
refused prefill leaves behind.

A prefill refused with a bad request (400/422) is a verdict on *our* request shape, not on the
caller's request nor on the deployment's health: it never counts against a breaker (bad requests
never do), it is taken out of the call's failures (so the stream can restart from scratch and the
refusal is never raised to the caller), and the deployment is not offered a prefill again for
the engine's (the router's) lifetime.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llm_resilience_plugin.errors import ErrorClass

if TYPE_CHECKING:
    from llm_resilience_plugin._engine.core import CallState
    from llm_resilience_plugin._engine.engine import Engine

_log = logging.getLogger("llm_resilience")


@dataclass(slots=True)
class _PrefillState:
    """One engine's prefill knowledge: what each deployment declares, and who refused."""

    known: dict[str, bool] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)


_STATES: weakref.WeakKeyDictionary[Engine, _PrefillState] = weakref.WeakKeyDictionary()


def _state(engine: Engine) -> _PrefillState:
    state = _STATES.get(engine)
    if state is None:
        state = _STATES[engine] = _PrefillState()
    return state


def can_prefill(engine: Engine, dep: str) -> bool:
    """May ``dep`` be sent an assistant prefill? Its declaration (flag, else LiteLLM's model
    map; read once), unless it has refused one on this engine."""
    state = _state(engine)
    if dep in state.refused:
        return False
    known = state.known.get(dep)
    if known is None:
        info = engine.deployments.get(dep)
        known = state.known[dep] = info is not None and info.supports_prefill
    return known


def fits(engine: Engine, call: CallState, dep: str) -> bool:
    """Can ``dep`` take this call's recovery of a broken stream: a prefill where one is
    required, the replayed model where one is named?"""
    if call.require_prefill and not can_prefill(engine, dep):
        return False
    if call.only_model is not None:
        info = engine.deployments.get(dep)
        return info is not None and info.model == call.only_model
    return True


def refused_prefill(engine: Engine) -> frozenset[str]:
    """The deployments that refused a prefill on this engine (never offered one again)."""
    return frozenset(_state(engine).refused)


def refused_in(engine: Engine, call: CallState) -> frozenset[str]:
    """The deployments that refused this call's prefill (a bad request on a deployment now known
    to refuse one): healthy but for it, so still fit to answer the call from scratch."""
    refused = _state(engine).refused
    return frozenset(
        a.deployment_id
        for a in call.report.attempts
        if a.outcome == "failure" and a.error_class is ErrorClass.BAD_REQUEST and a.deployment_id in refused
    )


@dataclass(frozen=True, slots=True)
class PrefillMark:
    """Where a call stood before a prefill walk: its failure and attempt counts, and the
    deployments it had ruled out."""

    failures: int
    attempts: int
    never_again: frozenset[str]


def mark(call: CallState) -> PrefillMark:
    """Remember where ``call`` stands before sending a prefill (see :func:`settle_refusals`)."""
    return PrefillMark(len(call.failures), len(call.report.attempts), call.never_again)


def settle_refusals(engine: Engine, call: CallState, before: PrefillMark) -> frozenset[str]:
    """After a prefill walk that found no continuation: the deployments that refused the prefill
    with a bad request. Their failures leave the call's (a refusal is not the caller's bad
    request: it must neither stop the restart nor be raised), and they are not offered a prefill
    again. Their attempt records stay in the report, as they happened. A refuser the call had
    not ruled out before is still fit for the request from scratch (the caller decides where)."""
    refusers = {
        a.deployment_id
        for a in call.report.attempts[before.attempts :]
        if a.outcome == "failure" and a.error_class is ErrorClass.BAD_REQUEST and a.deployment_id is not None
    }
    if refusers:
        kept = [f for f in call.failures[before.failures :] if f.error_class is not ErrorClass.BAD_REQUEST]
        call.failures = (*call.failures[: before.failures], *kept)
        state = _state(engine)
        for dep in sorted(refusers - state.refused):
            _log.warning(
                "deployment %s refused an assistant prefill; it will not be asked to continue a "
                "stream again (set model_info.supports_assistant_prefill: false to say so up front)",
                dep,
            )
        state.refused |= refusers
    return frozenset(refusers)
