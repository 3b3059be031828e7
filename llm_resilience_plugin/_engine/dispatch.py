"""The dispatch seam: how the engine sends one attempt, like an httpx transport.

The engine decides where and when; a :class:`Dispatcher` makes exactly one attempt and reports
which deployment served it. Today's dispatcher is the wrapped ``litellm.Router``
(:mod:`llm_resilience_plugin.routing`); tests and other endpoints plug in their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from llm_resilience_plugin._engine.attempt import AttemptContext
    from llm_resilience_plugin.events import CallReport


class Dispatcher(Protocol):
    """Sends one attempt and wraps what comes back; never retries, never falls back."""

    async def send(
        self,
        attempt: AttemptContext,
        messages: list[dict[str, Any]],
        kwargs: dict[str, Any],
        *,
        timeout_s: float,
        bound: float,
    ) -> Any:
        """One request for ``attempt.group`` within ``timeout_s`` (hard ``bound``); sets
        ``attempt.picked`` to the deployment that served it, raises the provider's error."""
        ...

    def wrap_stream(
        self,
        attempt: AttemptContext,
        level: int,
        prefetched: Any,
        started_wall: float,
        latency: float,
        wait_before: float,
        messages: list[dict[str, Any]],
        kwargs: dict[str, Any],
    ) -> Any:
        """The caller's stream over a prefetched one (its end is reported back to the engine)."""
        ...

    def static_stream(self, response: Any, attempt_call: Any) -> Any:
        """A configured static answer delivered as a stream."""
        ...

    def annotate(self, report: CallReport, result: Any, usage: dict[str, int] | None) -> None:
        """Fill ``report`` from an answer (model, cost, usage) and attach it where ``get_report``
        finds it; a live stream reports when it ends."""
        ...

    async def discard(self, result: Any) -> None:
        """Close a result nobody will read (the loser of a hedge)."""
        ...
