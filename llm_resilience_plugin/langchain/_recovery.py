"""How ``invoke``/``ainvoke`` of a streaming chat model recover a stream broken after content.

LangChain aggregates the chunks of the stream it opens for ``invoke`` and has already handed
them to its callbacks, so they cannot be taken back. The stream is therefore opened with
``recover_streams="answer"``: the engine answers the rest of the *same* call without streaming
(one deadline, one report, the broken deployment avoided), and the stream ends with that whole
answer in its :class:`StreamRestart` marker. The relay raises :class:`AnsweredAgain` to end
LangChain's streamed run, and ``invoke`` hands the answer to a new run through :func:`handed_over`
(no request is sent again).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from llm_resilience_plugin.errors import StreamInterruptedError
from llm_resilience_plugin.events import CallReport, StreamRestart

_HANDOFF: ContextVar[Any] = ContextVar("llm_resilience_answer", default=None)


class AnsweredAgain(StreamInterruptedError):
    """The stream an ``invoke`` aggregates broke after content and the call was answered again
    whole (``response``); ``invoke`` catches it and makes that answer the run's result.
    ``request`` says which request it answers (group, messages, parameters)."""

    def __init__(self, marker: StreamRestart, report: CallReport | None, request: tuple[Any, ...]) -> None:
        super().__init__(
            "the stream broke after content; the call was answered again without streaming",
            marker.discarded_text,
            ConnectionError(f"stream broken ({marker.error_class})"),
            report,
        )
        self.response = marker.response
        self.request = request


@contextlib.contextmanager
def handed_over(exc: AnsweredAgain, router: object) -> Iterator[None]:
    """While this runs, the next non-stream request to ``router`` that is the same request as
    ``exc``'s (group, messages, parameters) returns ``exc``'s answer instead of calling the
    router (see :func:`take_answer`); any other request made meanwhile (by a model called from a
    callback, say) is sent as usual."""
    token = _HANDOFF.set((router, exc.request, exc.response))
    try:
        yield
    finally:
        _HANDOFF.reset(token)


def take_answer(router: object, request: tuple[Any, ...]) -> Any:
    """The answer handed over for this ``request`` to ``router`` (once), or None."""
    handed = _HANDOFF.get()
    if handed is None or handed[0] is not router or handed[1] != request:
        return None
    _HANDOFF.set(None)
    return handed[2]


def handed_answer() -> Any:
    """The answer being handed over right now (without taking it), or None: a cost handler
    reads it to carry the broken call's reservation to the run that delivers the answer."""
    handed = _HANDOFF.get()
    return None if handed is None else handed[2]


def new_run(config: Any) -> Any:
    """``config`` for the run that delivers the answer: the same, but never the caller's
    ``run_id`` (it named the streamed run, which has ended; a tracer must not see it twice)."""
    if isinstance(config, Mapping) and "run_id" in config:
        return {k: v for k, v in config.items() if k != "run_id"}
    return config
