"""The dispatch seam: how the engine sends one attempt, like an httpx transport.

The engine decides where and when; a :class:`Dispatcher` makes exactly one attempt and reports
which deployment served it. There are three: through the wrapped ``litellm.Router``, straight
through LiteLLM's module functions for groups proven equivalent (both in
:mod:`llm_resilience_plugin.routing`), and one ``invoke``/``stream`` of a wrapped LangChain
Runnable (:mod:`llm_resilience_plugin.langchain`); tests plug in their own.

**Operations.** A call is one *operation* (``CallState.operation``), named after LiteLLM's
function without the ``a``: ``"completion"`` (chat, the default), ``"embedding"``,
``"text_completion"``, ``"image_generation"``, ``"responses"``, ``"transcription"``, ``"speech"``,
``"moderation"`` or ``"rerank"``. The engine is the same for all of them: what it calls
``messages`` is the operation's payload, sent as the keyword ``PAYLOAD_KEYS[operation]``
(``messages``, ``input``, ``prompt``, ``file`` or ``query``; a rerank's ``documents`` ride in its
kwargs). A dispatcher sends an
attempt with LiteLLM's function for ``attempt.call.operation`` (``Router.aembedding`` for
``"embedding"``, ``litellm.aembedding`` for a direct dispatcher) and raises a ConfigError for an
operation it cannot send. ``STREAMING_OPERATIONS`` are the ones whose ``stream=True`` LiteLLM
streams.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

# The operations and the keyword that carries each one's payload (the engine's ``messages``).
PAYLOAD_KEYS: dict[str, str] = {
    "completion": "messages",
    "embedding": "input",
    "text_completion": "prompt",
    "image_generation": "prompt",
    "responses": "input",
    "transcription": "file",
    "speech": "input",
    "moderation": "input",
    "rerank": "query",
}
CHAT = "completion"
STREAMING_OPERATIONS = frozenset({"completion", "text_completion", "responses"})

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


@runtime_checkable
class SyncDispatcher(Dispatcher, Protocol):
    """A dispatcher that can also send an attempt on the caller's thread (the sync driver's
    seam: LangChain sync runnables, whose attempts must run where the caller runs)."""

    def send_sync(
        self,
        attempt: AttemptContext,
        messages: list[dict[str, Any]],
        kwargs: dict[str, Any],
        *,
        timeout_s: float,
        bound: float,
    ) -> Any:
        """The blocking twin of :meth:`Dispatcher.send`."""
        ...
