"""A provider's long error body, cut where it enters: at the HTTP transport, before the SDK or
LiteLLM reads it, and only for the plugin's own attempts.

LiteLLM redacts a provider's error text on the event loop several times per error (its exception
mapping, then its failure logging, each over the message and over a traceback that repeats it):
a 100 kB ``400`` echoing its input stalls every call, stream and deadline in the process for
~0.5 s. An error answer (status >= 400) to an attempt made under :func:`bounded` whose body is
longer than :data:`ERROR_BODY_LIMIT` characters is replaced by a shorter one: a JSON body keeps
its structure (each string cut to :data:`STRING_LIMIT` characters, a long list to
:data:`LIST_LIMIT` items, ``error.code``/``type`` intact), any other body keeps its first
:data:`ERROR_BODY_LIMIT` characters; every cut says how much was left out. Status, headers and
``Retry-After`` are kept. Requests made outside :func:`bounded` (a plain Router,
``litellm.acompletion`` of your own) get the body as the provider sent it.
"""

from __future__ import annotations

import contextlib
import json
import weakref
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import httpx

__all__ = [
    "ERROR_BODY_LIMIT",
    "LIST_LIMIT",
    "STRING_LIMIT",
    "bound_text",
    "bound_transport",
    "bounded",
    "is_bounded",
]

ERROR_BODY_LIMIT = 8_192  # characters: a longer error body is cut (a provider's message is shorter)
STRING_LIMIT = 4_096  # characters of each JSON string kept
LIST_LIMIT = 50  # items of each JSON list kept
_DROPPED_HEADERS = frozenset({"content-length", "content-encoding", "transfer-encoding"})

_ACTIVE: ContextVar[bool] = ContextVar("llm_resilience_bounded_error_bodies", default=False)


@contextlib.contextmanager
def bounded() -> Iterator[None]:
    """Cut long error bodies of the requests made in this context (one of the plugin's attempts)."""
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def is_bounded() -> bool:
    """Are error bodies of requests made here cut (inside :func:`bounded`)?"""
    return _ACTIVE.get()


def _left_out(count: int, what: str) -> str:
    return f"... [{count} more {what} not shown]"


def _cut(value: Any) -> Any:
    if isinstance(value, str):
        if len(value) <= STRING_LIMIT:
            return value
        return value[:STRING_LIMIT] + _left_out(len(value) - STRING_LIMIT, "characters")
    if isinstance(value, list):
        kept = [_cut(v) for v in value[:LIST_LIMIT]]
        if len(value) > LIST_LIMIT:
            kept.append(_left_out(len(value) - LIST_LIMIT, "items"))
        return kept
    if isinstance(value, dict):
        return {k: _cut(v) for k, v in value.items()}
    return value


def bound_text(text: str) -> str | None:
    """``text`` cut to a bounded size (see the module), or None when it is short enough as it is."""
    if len(text) <= ERROR_BODY_LIMIT:
        return None
    head = text.lstrip()[:1]
    if head in ("{", "["):
        try:
            doc = json.loads(text)
        except ValueError:
            pass
        else:
            out = json.dumps(_cut(doc), ensure_ascii=False)
            if len(out) <= 4 * ERROR_BODY_LIMIT:  # deeply nested or wide: cut as text below
                return out
    return text[:ERROR_BODY_LIMIT] + _left_out(len(text) - ERROR_BODY_LIMIT, "characters")


async def _bound_response(response: httpx.Response, request: httpx.Request) -> httpx.Response:
    """``response`` (an error answer) as it is, or rebuilt with its body cut."""
    length = response.headers.get("content-length", "")
    if "content-encoding" not in response.headers and length.isdigit() and int(length) <= ERROR_BODY_LIMIT:
        return response  # short: not even read here
    try:
        await response.aread()  # decoded (gzip and the like) and closed; the original is let go
    except BaseException:  # cancelled or cut mid-read: the connection goes back all the same
        await response.aclose()
        raise
    text = response.text
    cut = bound_text(text)
    body = response.content if cut is None else cut.encode(response.encoding or "utf-8", "replace")
    headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _DROPPED_HEADERS]
    return httpx.Response(
        response.status_code,
        headers=headers,
        content=body,
        request=request,
        extensions=response.extensions,
    )


def bound_transport(transport: Any) -> None:
    """Make ``transport`` (an httpx async transport LiteLLM just built) cut the long error bodies
    of requests made under :func:`bounded`; other requests pass as before."""
    ref = weakref.ref(transport)  # the transport's own attribute must not keep it alive
    handle = type(transport).handle_async_request

    async def handle_async_request(request: httpx.Request) -> httpx.Response:
        owner = ref()
        if owner is None:  # pragma: no cover - a request on a collected transport
            raise RuntimeError("the HTTP transport was closed")
        response: httpx.Response = await handle(owner, request)
        if response.status_code < 400 or not _ACTIVE.get():
            return response
        return await _bound_response(response, request)

    transport.handle_async_request = handle_async_request
