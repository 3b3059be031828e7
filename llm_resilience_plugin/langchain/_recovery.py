"""How ``invoke``/``ainvoke`` of a streaming chat model recover a stream broken after content:
they ask again without streaming, as the rest of the same call - inside what is left of its
deadline, and not on a deployment that already failed it while the router has another route
(a deployment that stalled would otherwise be waited on again for a whole attempt timeout)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llm_resilience_plugin.errors import StreamInterruptedError
from llm_resilience_plugin.langchain._requests import RequestDefaults, prepare_request
from llm_resilience_plugin.routing import ResilientRouter


def failed_deployments(exc: StreamInterruptedError) -> set[str]:
    """The deployments whose attempts failed in the interrupted call (the broken stream's too)."""
    report = exc.report
    if report is None:
        return set()
    return {
        a.deployment_id for a in report.attempts if a.outcome == "failure" and a.deployment_id is not None
    }


def has_other_route(router: ResilientRouter, group: str, avoided: set[str]) -> bool:
    """Could a call to ``group`` that avoids ``avoided`` still be answered somewhere?"""
    if any(d.id not in avoided for d in router.deployments(group)):
        return True
    spec = router.spec
    return spec is not None and bool(spec.fallback_chain(group, None))


def reask_kwargs(
    router: ResilientRouter,
    defaults: RequestDefaults,
    kwargs: Mapping[str, Any],
    exc: StreamInterruptedError,
) -> dict[str, Any] | None:
    """The kwargs of the non-stream call that takes over from ``exc``'s broken stream, or None
    when it must not be made (the caller asked for no stream, or the deadline is spent)."""
    if kwargs.get("stream") is False:
        return None
    out: dict[str, Any] = {**kwargs, "stream": False}
    report = exc.report
    if report is None:
        return out
    group, _, deadline = prepare_request(defaults, None, kwargs)
    budget = deadline or router.effective_policy(group).deadline
    left = budget - max(0.0, router.clock.wall() - report.started_at)
    if left <= 0:
        return None
    out["deadline"] = left
    out.pop("timeout", None)  # the deadline above already counts it
    avoided = failed_deployments(exc) | set(kwargs.get("avoid_deployments") or ())
    if avoided and has_other_route(router, group, avoided):
        out["avoid_deployments"] = sorted(avoided)
    return out
