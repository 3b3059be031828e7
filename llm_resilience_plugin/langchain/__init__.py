"""LangChain surface: :class:`ResilientChatModel`, :class:`ResilientEmbeddings`, :func:`resilient` /
:class:`ResilientRunnable` and the cost-guard and structured-log callback handlers.

``ResilientChatModel`` is a ``BaseChatModel`` over one model group of a
:class:`~llm_resilience_plugin.ResilientRouter`; ``resilient(runnable)`` puts the same error
taxonomy, tenacity retries, a circuit breaker and a deadline around any other Runnable.
Retries show up as ``on_retry`` callbacks and ``llm_resilience.*`` custom events.
"""

from __future__ import annotations

from llm_resilience_plugin import _env  # noqa: F401  (before litellm is imported)
from llm_resilience_plugin.langchain._bridge import EVENT_PREFIX
from llm_resilience_plugin.langchain._callbacks import CostGuardCallbackHandler, StructuredLogCallbackHandler
from llm_resilience_plugin.langchain._chat_model import ResilientChatModel
from llm_resilience_plugin.langchain._embeddings import ResilientEmbeddings
from llm_resilience_plugin.langchain._resilient import ResilientChatRunnable, resilient
from llm_resilience_plugin.langchain._runnable import ResilientRunnable

__all__ = [
    "EVENT_PREFIX",
    "CostGuardCallbackHandler",
    "ResilientChatModel",
    "ResilientChatRunnable",
    "ResilientEmbeddings",
    "ResilientRunnable",
    "StructuredLogCallbackHandler",
    "resilient",
]
