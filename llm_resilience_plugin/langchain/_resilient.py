"""``resilient(runnable)``: a :class:`ResilientRunnable` around a Runnable or a function, and
around a chat model a :class:`ResilientChatRunnable`, which keeps the chat model's surface
(``bind_tools``, ``with_structured_output``, ``with_config``) so it can replace the model in an
agent."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import Runnable, RunnableBinding, RunnableConfig

from llm_resilience_plugin._engine.clock import Clock
from llm_resilience_plugin.events import Listener
from llm_resilience_plugin.langchain._runnable import Input, Output, ResilientRunnable, RetryOn
from llm_resilience_plugin.policy import ResiliencePolicy


def chat_model_of(runnable: Runnable[Any, Any]) -> BaseChatModel | None:
    """The chat model ``runnable`` is, or binds (``model.bind_tools(...)``, ``with_config``)."""
    while isinstance(runnable, RunnableBinding):
        runnable = runnable.bound
    return runnable if isinstance(runnable, BaseChatModel) else None


class ResilientChatRunnable(ResilientRunnable[Input, Output]):
    """``resilient()`` over a chat model: it keeps the chat model's surface. ``bind_tools``,
    ``with_structured_output`` and ``with_config`` return wrappers of the bound model that share
    this one's breaker, retry budget, policy and listeners (an agent binding its tools on every
    turn keeps one breaker), and ``profile`` is the model's."""

    def rebound(self, bound: Runnable[Any, Any]) -> ResilientChatRunnable[Any, Any]:
        """This wrapper (same step, engine and options) around ``bound`` instead."""
        twin = copy.copy(self)
        twin.bound = bound
        return twin

    @property
    def profile(self) -> Any:
        """The wrapped chat model's ``profile`` (context window, tool calling, ...)."""
        model = chat_model_of(self.bound)
        return model.profile if model is not None else None

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ResilientChatRunnable[Any, Any]:
        """The model's ``bind_tools``, wrapped the same way."""
        return self.rebound(cast(Any, self.bound).bind_tools(tools, **kwargs))

    def with_structured_output(self, schema: Any, **kwargs: Any) -> ResilientChatRunnable[Any, Any]:
        """The model's ``with_structured_output`` chain, wrapped the same way (a reply that does
        not parse is not retried: its error is not a provider failure)."""
        return self.rebound(cast(Any, self.bound).with_structured_output(schema, **kwargs))

    def with_config(
        self, config: RunnableConfig | None = None, **kwargs: Any
    ) -> ResilientChatRunnable[Any, Any]:
        """The model with ``config`` bound (its runs get the tags, callbacks, ...), wrapped the same way."""
        return self.rebound(self.bound.with_config(config, **kwargs))


def resilient(
    runnable: Runnable[Input, Output] | Callable[..., Any],
    *,
    policy: ResiliencePolicy | Mapping[str, Any] | None = None,
    retry_on: RetryOn | None = None,
    max_retries: int | None = None,
    deadline: float | None = None,
    attempt_timeout: float | None = None,
    first_chunk_timeout: float | None = None,
    name: str | None = None,
    clock: Clock | None = None,
    seed: int | None = None,
    listener: Listener | None = None,
    emit_events: bool = True,
    enforce_sync_timeout: bool = False,
) -> ResilientRunnable[Input, Output]:
    """Wrap ``runnable`` (or a function, made a ``RunnableLambda``) with the router's resilience.

    Args:
        policy: a :class:`ResiliencePolicy` (or mapping): ``deadline``, ``attempt_timeout``,
            ``backoff``, ``breaker``, ``retry_budget`` and the per-class actions and retry
            counts; ``groups.<name>`` overrides apply to a step called ``name``.
        retry_on: exception classes (or a predicate) retried in addition to the taxonomy's
            retryable classes; other ``unknown`` exceptions are never retried.
        max_retries: retries per error class (overrides the policy's counts; default for
            ``retry_on`` matches: 2).
        deadline: total seconds per call, every attempt and sleep included.
        attempt_timeout / first_chunk_timeout: seconds per attempt / to a stream's first chunk.
            Enforced on the async paths; sync attempts (and a sync stream's wait for each chunk)
            run inline and cannot be interrupted unless ``enforce_sync_timeout=True`` (each then
            runs on a helper thread, abandoned when it overruns).
        name: the step's name: breaker id, run name ``Resilient[<name>]``, event model_group.
        clock / seed: for tests (``FakeClock`` makes backoff sleeps instant).
        listener: receives every event (also via :meth:`ResilientRunnable.subscribe`).
        emit_events: dispatch ``llm_resilience.*`` custom events to LangChain callbacks.

    Over a chat model (or a binding of one) the wrapper is a :class:`ResilientChatRunnable`:
    ``bind_tools``, ``with_structured_output`` and ``with_config`` keep it resilient.
    """
    if not isinstance(runnable, Runnable):
        if not callable(runnable):
            raise TypeError("resilient() wraps a Runnable or a callable")
        from langchain_core.runnables import RunnableLambda

        runnable = cast(Runnable[Input, Output], RunnableLambda(runnable))
    wrapper = ResilientChatRunnable if chat_model_of(runnable) is not None else ResilientRunnable
    return wrapper(
        runnable,
        policy=policy,
        retry_on=retry_on,
        max_retries=max_retries,
        deadline=deadline,
        attempt_timeout=attempt_timeout,
        first_chunk_timeout=first_chunk_timeout,
        name=name,
        clock=clock,
        seed=seed,
        listener=listener,
        emit_events=emit_events,
        enforce_sync_timeout=enforce_sync_timeout,
    )


__all__ = ["ResilientChatRunnable", "chat_model_of", "resilient"]
