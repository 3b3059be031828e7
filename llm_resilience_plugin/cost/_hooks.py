"""The router's side of the cost guard: the :class:`~llm_resilience_plugin.events.AttemptGuard`
hooks (reserve before an attempt, settle or release after it) and the checks a router gets when
it binds the guard (every deployment priced, ``reservation_ttl`` outlasting every deadline).

What an attempt that did not end with an answer costs (docs/spend-semantics.md):

* a failure with an HTTP answer, or refused before sending (``billable=False``): nothing;
* a timeout, a dropped connection or a stream cut after the request was sent, a call cancelled
  in flight (``billable=True``): the usage known so far, else the estimate reserved;
* with ``on_cancel="release"``, a cancel with nothing produced (no answer, no usage, no
  content reached the caller): nothing. A stream that had produced content is never released.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from llm_resilience_plugin.cost._estimate import CostEstimator
from llm_resilience_plugin.cost._operations import PER_IMAGE, PER_UNIT, images_made, reserve_arguments
from llm_resilience_plugin.cost._prices import Candidate, is_number
from llm_resilience_plugin.cost._tickets import Ticket
from llm_resilience_plugin.errors import ConfigError, Failure
from llm_resilience_plugin.events import hidden_params_of

if TYPE_CHECKING:
    from llm_resilience_plugin.events import AttemptInfo, DeploymentInfo
    from llm_resilience_plugin.routing._router import ResilientRouter

SpendAction = Literal["settle", "release"]


def spend_action(
    failure: Failure | None,
    response: Any | None,
    usage: Mapping[str, int] | None,
    *,
    billable: bool,
    produced: bool,
    on_cancel: str,
) -> SpendAction:
    """Settle (to the usage known, else the estimate) or release an attempt's reservation, by
    how it ended (the rules in this module's docstring)."""
    if failure is not None:
        return "settle" if billable or produced else "release"
    if response is None and not usage and not produced and on_cancel == "release":
        return "release"  # cancelled in flight, nothing came back: trusted to cost nothing
    return "settle"


def token_usage(response: Any | None, usage: Mapping[str, int] | None) -> tuple[Any, Any]:
    """``(prompt_tokens, completion_tokens)`` of an attempt: the usage the router read, else the
    response's own ``usage``; None where unknown."""
    if usage:
        return usage.get("prompt_tokens"), usage.get("completion_tokens")
    if response is not None and getattr(response, "usage", None) is not None:
        u = response.usage
        return getattr(u, "prompt_tokens", None), getattr(u, "completion_tokens", None)
    return None, None


def longest_deadline(router: ResilientRouter) -> tuple[float, str]:
    """The longest deadline a call of ``router`` can run under (a group's, or a priority tier's,
    which replaces the group's), and where it is set."""
    longest, where = 0.0, "no group"
    for group in router.model_groups:
        deadline = router.effective_policy(group).deadline
        if deadline > longest:
            longest, where = deadline, f"group {group!r}"
    for name, tier in router.policy.tiers.items():
        if tier.deadline is not None and tier.deadline > longest:
            longest, where = tier.deadline, f"tier {name!r}"
    return longest, where


def check_reservation_ttl(ttl: float, router: ResilientRouter) -> None:
    """``ConfigError`` when a reservation could expire (and be reaped) while its call still
    runs: ``ttl`` shorter than the longest deadline of ``router``."""
    deadline, where = longest_deadline(router)
    if ttl < deadline:
        raise ConfigError(
            "reservation_ttl",
            f"reservation_ttl={ttl:g} s is shorter than the longest deadline a call can run "
            f"({deadline:g} s, {where}): a reservation would expire while its call still runs; "
            f"set reservation_ttl to at least {deadline:g} s or lower the deadline",
        )


class _Guard(Protocol):
    """What :class:`RouterHooks` needs of the guard it is mixed into."""

    estimator: CostEstimator
    on_cancel: str

    @property
    def reservation_ttl(self) -> float: ...

    def candidates_for_deployments(self, deployments: Sequence[DeploymentInfo]) -> list[Candidate]: ...

    def reserve(self, candidates: Sequence[Candidate], **kwargs: Any) -> Ticket: ...

    def settle(self, ticket: Ticket, **kwargs: Any) -> float: ...

    def release(self, ticket: Ticket) -> None: ...


class RouterHooks:
    """The :class:`~llm_resilience_plugin.events.AttemptGuard` protocol of
    :class:`~llm_resilience_plugin.cost.CostGuard`, and what a router checks when it binds it."""

    def bind_router(self: _Guard, router: ResilientRouter) -> None:
        """Price every deployment of ``router`` now (``ConfigError`` for an unknown price under
        ``unknown_model="error"``), refuse a ``reservation_ttl`` shorter than its longest
        deadline (``ConfigError`` naming both), and let the LangChain handler map its group
        names to its deployments."""
        check_reservation_ttl(self.reservation_ttl, router)
        self.estimator.bind_router(router)

    def check_deployments(self: _Guard, deployments: Sequence[DeploymentInfo]) -> None:
        """Price deployments about to join a bound router (``ConfigError`` as :meth:`bind_router`),
        before the router changes; it binds again once they are in."""
        self.estimator.check_deployments(deployments)

    def before_attempt(self: _Guard, info: AttemptInfo) -> Ticket:
        """Reserve the attempt's worst case over the deployments that may serve it."""
        kwargs = info.kwargs
        md = info.metadata
        tags = md.get("tags")
        max_tokens = kwargs.get("max_tokens")
        if max_tokens is None:
            max_tokens = kwargs.get("max_completion_tokens")
        run_id = md.get("run_id") or md.get("root_run_id")
        if info.operation != "completion":  # embeddings, text completions, images, audio, ...
            args = reserve_arguments(
                info.operation,
                info.messages,
                kwargs,
                info.deployments,
                lambda: self.candidates_for_deployments(info.deployments),
            )
            return self.reserve(
                args.pop("candidates"),
                **args,
                metadata=md,
                tags=tags if isinstance(tags, list | tuple) else None,
                request_id=info.call_id,
                run_id=str(run_id) if run_id else None,
                model_group=info.model_group,
            )
        return self.reserve(
            self.candidates_for_deployments(info.deployments),
            messages=info.messages,
            tools=kwargs.get("tools"),
            max_tokens=max_tokens,
            n=kwargs.get("n"),
            metadata=md,
            tags=tags if isinstance(tags, list | tuple) else None,
            request_id=info.call_id,
            run_id=str(run_id) if run_id else None,
            model_group=info.model_group,
        )

    def after_attempt(
        self: _Guard,
        token: Any,
        *,
        deployment_id: str | None,
        response: Any | None,
        usage: Mapping[str, int] | None,
        failure: Failure | None,
        billable: bool = False,
        produced: bool = False,
    ) -> None:
        """Settle the attempt's ticket to its reported cost or usage, else its estimate; release
        it when the attempt cannot have been billed (see :func:`spend_action`)."""
        if not isinstance(token, Ticket):
            return
        action = spend_action(
            failure, response, usage, billable=billable, produced=produced, on_cancel=self.on_cancel
        )
        if action == "release":
            self.release(token)
            return
        reported = (hidden_params_of(response) or {}).get("response_cost")
        pt, ct = token_usage(response, usage)
        if token.fallback_price.source == PER_IMAGE:  # priced per image, not per token
            pt, ct = images_made(response), 0
        elif token.fallback_price.source == PER_UNIT:  # per character/second/query: no tokens
            pt, ct = None, None
        self.settle(
            token,
            cost=reported if is_number(reported) else None,
            prompt_tokens=pt,
            completion_tokens=ct,
            deployment_id=deployment_id,
            model=getattr(response, "model", None) if response is not None else None,
        )


__all__ = [
    "RouterHooks",
    "SpendAction",
    "check_reservation_ttl",
    "longest_deadline",
    "spend_action",
    "token_usage",
]
