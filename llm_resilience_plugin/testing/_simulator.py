"""A fault-injecting, OpenAI-compatible chat-completions server for tests, demos and benchmarks.

:class:`ProviderSimulator` runs an aiohttp web server on ``127.0.0.1`` in its own event loop on a
background daemon thread, so synchronous code and asyncio code (on any other loop) can both talk
to it over real HTTP.  Point LiteLLM at it with an ``openai/`` model and the simulator's
``api_base``; every *deployment* (any name you choose) is scripted independently::

    import llm_resilience_plugin  # sets LiteLLM's offline env before litellm is imported
    import litellm
    from llm_resilience_plugin.simulator import Fault, ProviderSimulator

    with ProviderSimulator() as sim:  # port 0: a free port is picked
        sim.script("primary", Fault.rate_limit(retry_after=1), Fault.reset())
        sim.set_default("primary", Fault.ok(text="fine now"))
        litellm.completion(
            model="openai/gpt-4o-mini",
            api_base=sim.api_base("primary"),  # http://127.0.0.1:<port>/primary/v1
            api_key="sk-sim",
            messages=[{"role": "user", "content": "hi"}],
            max_retries=0,  # otherwise the OpenAI SDK retries on its own
        )
        assert sim.count("primary") == 1

Running it standalone: ``python -m llm_resilience_plugin.simulator --port 8900 --deployments a,b``
prints each deployment's ``api_base`` and serves until Ctrl-C.

Server API
----------
``ProviderSimulator(host="127.0.0.1", port=0)``
    ``start()`` (blocks until the socket is bound; returns the simulator), ``stop()`` (cancels
    in-flight handlers, including ones holding a connection open, and returns promptly), or use
    it as a context manager.  After ``stop()`` it can be started again on the same port.
``port`` / ``base_url`` / ``api_base(deployment)``
    ``api_base`` is ``http://127.0.0.1:{port}/{deployment}/v1``.
``script(deployment, *behaviors)``
    Queue behaviours, consumed one per request in FIFO order.
``set_default(deployment, behavior)``
    What a deployment does once its queue is empty (initially ``Fault.ok()``).
``outage(deployment, seconds, behavior=Fault.server_error(503))``
    Every request within the next ``seconds`` (monotonic clock, from the call) gets ``behavior``.
``token_bucket(deployment, rate, burst, retry_after=None)``
    A bucket of ``burst`` tokens (initially full) refilled at ``rate`` tokens/second; a request
    finding it empty gets a 429 (with ``Retry-After`` when ``retry_after`` is given).
``set_context_window(deployment, tokens)``
    A prompt whose estimate (below) exceeds ``tokens`` gets OpenAI's context-length 400.
    ``None`` removes the limit.
``requests(deployment=None)`` / ``count(deployment=None)``
    The request log in arrival order, as frozen :class:`RequestRecord` snapshots.
``clear_log()`` / ``reset()``
    ``reset`` clears the log *and* every script, default, outage, bucket, window and RNG.

For each chat request the first matching rule wins: **outage window > token bucket > context
window > scripted queue > default**.  Requests rejected by an outage, the bucket or the window
do not consume the scripted queue.

Endpoints: ``POST /{deployment}/v1/chat/completions`` (the deployment is the first path
segment), ``POST /v1/chat/completions`` and ``POST /chat/completions`` (the deployment is the
body's ``model``), ``POST /{deployment}/chat/completions``, ``GET /{deployment}/v1/models``,
``GET /v1/models`` and ``GET /health``.  Only chat requests are logged.  A body that is not a JSON
object with a ``messages`` list gets a plain 400 (logged with behavior ``"bad_request"``) without
consuming any script.  Every chat response carries ``x-simulator-deployment: <deployment>``.

Fault kinds (constructors on :class:`Fault`, all returning a frozen :class:`Behavior`)
---------------------------------------------------------------------------------------
``ok(text=None, latency=0, ttft=0, chunk_delay=0)``
    Success.  Non-stream: the response is sent after ``latency + ttft`` seconds.  Stream:
    ``latency`` delays the response headers, ``ttft`` delays the first chunk after the headers,
    ``chunk_delay`` separates consecutive content chunks.  ``text`` replaces the generated
    reply (and disables tool calls / structured output for that request).
``http_error(status, message=None, retry_after=None, code=None, type=None)``
    An OpenAI-shaped error body ``{"error": {"message", "type", "param": null, "code"}}``.
    ``retry_after`` becomes a ``Retry-After`` header: a number is sent as seconds (``2``,
    ``0.5``), a string as is (for example an HTTP-date).  Shorthands: ``rate_limit()`` (429,
    type and code ``rate_limit_exceeded``), ``server_error(status=500)``, ``overloaded()``
    (529, Anthropic-style ``overloaded_error`` / ``"Overloaded"``), ``auth()`` (401
    ``invalid_api_key``), ``context_length(limit=8192)`` (400 ``context_length_exceeded`` with
    OpenAI's "This model's maximum context length is ..." message), ``content_filter()`` (400
    ``content_filter`` with Azure's "... content management policy ..." message) and
    ``not_found()`` (404 ``model_not_found``).
``reset()``
    Read the request, then abort the TCP connection with an RST (``SO_LINGER {1, 0}``) before
    any response byte.
``silence(max_hold=60)``
    Send nothing until the client goes away or ``max_hold`` passes (then RST).
``slow_first_token(seconds)``
    ``ok`` with ``ttft=seconds`` (so a non-stream response is also ``seconds`` late).
``stream_cut(after_chunks=2)``
    Stream: headers and ``after_chunks`` content chunks, then the connection is closed in the
    middle of the chunked body (FIN, after the chunks are flushed: no final chunk, no
    ``[DONE]``).  Non-stream: like ``reset``.
``stream_stall(after_chunks=2, seconds=60)``
    Stream: ``after_chunks`` chunks, then silence for ``seconds`` (then RST).  Non-stream: like
    ``silence(seconds)``.
``malformed_chunk(after_chunks=1)``
    Stream: after ``after_chunks`` good chunks, one ``data:`` event with invalid JSON, then the
    rest of the normal stream.  Non-stream: a 200 whose JSON body is truncated.
``no_done()``
    Stream: every chunk (content, finish, usage if requested), then a clean end of the body and
    connection close without ``data: [DONE]``.  Non-stream: ordinary ``ok``.
``flaky(p, fault, seed=None)``
    With probability ``p`` apply ``fault``, else ``ok``.  Draws come from a per-deployment RNG
    seeded with ``seed`` (or a stable hash of the deployment name), so runs are repeatable.

``after_chunks`` counts content chunks (the first of which also carries ``role``); a value
beyond the reply length applies the fault after the last content chunk.  Invalid arguments
(negative seconds or counts, ``p`` outside [0, 1], a status outside 100-599) raise
``ValueError`` naming the argument.

``RequestRecord.behavior`` names what was applied: ``"ok"``, ``"http_error:<status>"``,
``"reset"``, ``"silence"``, ``"stream_cut"``, ``"stream_stall"``, ``"malformed_chunk"``,
``"no_done"``, ``"flaky:<applied>"`` (``<applied>`` is the inner fault's name or ``"ok"``),
``"outage:<name>"``, ``"token_bucket:429"``, ``"context_window"`` or ``"bad_request"``.

Replies
-------
Responses follow OpenAI's wire format (``chat.completion`` / ``chat.completion.chunk`` with
``data: [DONE]``; ``stream_options.include_usage`` adds a final ``"choices": []`` chunk with
``usage``).  Streams split the content into word chunks (a word plus its trailing whitespace).

* Text: ``"Hello from <deployment>. You said: <first 12 words of the last user message>."``.
* ``max_tokens`` / ``max_completion_tokens`` truncate to that many word chunks (finish
  ``"length"``); ``stop`` cuts the text before the first stop sequence.
* Tools: if the request has ``tools``, ``tool_choice`` is not ``"none"`` and the last message is
  not a ``tool`` message, the reply is one tool call (finish ``"tool_calls"``) to the function
  named by ``tool_choice``, else the tool whose name occurs first in the last user message,
  else the first tool.  Arguments are generated from the JSON schema: integers and numbers take
  the numbers found in the last user message in order (else ``1`` / ``1.0``), strings the
  phrases quoted ('x', "x" or `x`) in that message in order (else ``"example"``; an ``enum``
  gives its first value), booleans ``true``, arrays ``[]`` (``minItems``
  items when required), objects recursively; ``anyOf``/``oneOf`` use the first non-null branch
  and ``$ref`` is resolved.  After a ``tool`` message the text is
  ``"The tool returned: <content>."``.
* ``response_format`` ``json_schema``: the content is an instance generated from the schema as
  above, strings being ``"example <property name>"``.  ``json_object``: an object whose keys are
  the identifiers quoted ('x', "x" or `x`) in the system messages and the last user message,
  else ``{"answer": ...}``.

How LiteLLM surfaces each fault
-------------------------------
Observed with LiteLLM 1.110 (``openai/`` model, ``max_retries=0``), sync and async alike; the
class is from ``litellm.exceptions``, then ``status_code``:

* 429 (any, incl. token bucket): ``RateLimitError`` 429 (``e.response.headers["retry-after"]``
  carries ``Retry-After``); 500: ``InternalServerError`` 500; 502: ``BadGatewayError`` 502;
  503: ``ServiceUnavailableError`` 503; 504: ``Timeout`` 504; 529 ``overloaded()`` and 403:
  plain ``APIError`` 529 / 403; 401: ``AuthenticationError``; 404: ``NotFoundError``;
  ``context_length()``: ``ContextWindowExceededError`` 400; ``content_filter()``: plain
  ``BadRequestError`` 400 (not ``ContentPolicyViolationError`` for ``openai/``); 408 and 422:
  ``Timeout`` 408 and ``BadRequestError`` 422.  Streams raise the same before the first chunk.
* ``reset()`` (and a refused connection): ``InternalServerError`` **500**, message ending
  ``"Connection error."`` -- the only way to tell it from a real 500 is that message or the
  ``openai.APIConnectionError`` in the ``__cause__`` chain.
* ``silence()`` / ``stream_stall()``: ``Timeout`` 408 (``"APITimeoutError - Request timed
  out."``); on a stream the read timeout also fires *during iteration*, for a stall or a
  ``ttft`` longer than the timeout, because the headers arrived in time.
* ``stream_cut()`` / ``malformed_chunk()`` on a stream: ``MidStreamFallbackError`` 500 raised
  while iterating (``generated_content`` holds the text received so far,
  ``is_pre_first_chunk`` whether any arrived, ``original_exception`` is an
  ``APIConnectionError``).  It subclasses ``ServiceUnavailableError`` and is not exported as
  ``litellm.MidStreamFallbackError``.  Non-stream ``malformed_chunk()``: ``InternalServerError``
  500 with the JSON decode error as message.  ``no_done()`` is accepted silently.

Token estimate (deterministic, no tokenizer)
--------------------------------------------
``estimate_tokens(text) = ceil(len(text) / 4)``.  ``prompt_tokens`` (see
:func:`estimate_prompt_tokens`) is the sum over messages of ``4 + estimate_tokens(text)`` plus
85 per image part, plus 2; ``text`` is the string content or the concatenated text parts.
``completion_tokens`` is the number of word chunks, or ``ceil(len(arguments) / 4) + 5`` for a
tool call.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import random
import re
import socket
import struct
import sys
import threading
import time
import zlib
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiohttp import web

from llm_resilience_plugin import _env

__all__ = [
    "Behavior",
    "Fault",
    "ProviderSimulator",
    "RequestRecord",
    "estimate_prompt_tokens",
    "estimate_tokens",
    "main",
]

JSONDict = dict[str, Any]

_IMAGE_TOKENS = 85
_DEFAULT_CONTEXT_LIMIT = 8192
_REDACTED_HEADERS = frozenset({"authorization", "api-key", "x-api-key", "proxy-authorization"})
_MALFORMED_EVENT = b'data: {"id": "broken", "choices": [{"delta": {"content": "oops"\n\n'
_DONE_EVENT = b"data: [DONE]\n\n"
_WORD_RE = re.compile(r"\s*\S+\s*")
_NUMBER_RE = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")
_QUOTED_KEY_RE = re.compile(r"(?<!\w)([\"'`])([A-Za-z_][A-Za-z0-9_\-]{0,63})\1(?!\w)")
_QUOTED_PHRASE_RE = re.compile(r"(?<!\w)([\"'`])([^\"'`\n]{1,200}?)\1(?!\w)")
_TOOL_ARG_FRAGMENT = 16
_MAX_SCHEMA_DEPTH = 12


# --------------------------------------------------------------------------------------------
# Behaviours
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Behavior:
    """One scripted behaviour.  Build these with the :class:`Fault` constructors."""

    kind: str
    text: str | None = None
    latency: float = 0.0
    ttft: float = 0.0
    chunk_delay: float = 0.0
    status: int = 200
    message: str | None = None
    retry_after: float | str | None = None
    code: str | None = None
    error_type: str | None = None
    context_limit: int | None = None
    after_chunks: int = 0
    seconds: float = 0.0
    p: float = 0.0
    fault: Behavior | None = None
    seed: int | None = None

    @property
    def name(self) -> str:
        """The name recorded in :attr:`RequestRecord.behavior` (flaky shows as ``flaky``)."""
        if self.kind == "http_error":
            return f"http_error:{self.status}"
        return self.kind


def _check_seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _check_count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def _check_status(name: str, value: int, low: int = 100, high: int = 599) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer HTTP status in [{low}, {high}], got {value!r}")
    return value


def _check_retry_after(value: float | str | None) -> float | str | None:
    if value is None or isinstance(value, str):
        return value
    return _check_seconds("retry_after", value)


def _default_error_type(status: int) -> str:
    if status == 429:
        return "rate_limit_exceeded"
    if status >= 500:
        return "server_error"
    if 400 <= status < 500:
        return "invalid_request_error"
    return "api_error"


class Fault:
    """Constructors for :class:`Behavior` values (a namespace, not meant to be instantiated)."""

    @staticmethod
    def ok(
        text: str | None = None,
        latency: float = 0.0,
        ttft: float = 0.0,
        chunk_delay: float = 0.0,
    ) -> Behavior:
        """A successful reply, optionally with fixed ``text`` and delays."""
        if text is not None and not isinstance(text, str):
            raise ValueError(f"text must be a str or None, got {text!r}")
        return Behavior(
            kind="ok",
            text=text,
            latency=_check_seconds("latency", latency),
            ttft=_check_seconds("ttft", ttft),
            chunk_delay=_check_seconds("chunk_delay", chunk_delay),
        )

    @staticmethod
    def http_error(
        status: int,
        message: str | None = None,
        retry_after: float | str | None = None,
        code: str | None = None,
        type: str | None = None,
    ) -> Behavior:
        """An HTTP error with an OpenAI-shaped JSON body and optional ``Retry-After``."""
        status = _check_status("status", status)
        return Behavior(
            kind="http_error",
            status=status,
            message=message,
            retry_after=_check_retry_after(retry_after),
            code=code,
            error_type=type if type is not None else _default_error_type(status),
        )

    @staticmethod
    def rate_limit(retry_after: float | str | None = None, message: str | None = None) -> Behavior:
        """429 ``rate_limit_exceeded``."""
        return Fault.http_error(
            429,
            message=message or "Rate limit reached for requests per min (RPM). Please try again.",
            retry_after=retry_after,
            code="rate_limit_exceeded",
            type="rate_limit_exceeded",
        )

    @staticmethod
    def server_error(status: int = 500, message: str | None = None) -> Behavior:
        """A 5xx ``server_error``."""
        return Fault.http_error(
            _check_status("status", status, 500, 599), message=message, type="server_error"
        )

    @staticmethod
    def overloaded() -> Behavior:
        """529 with Anthropic's ``overloaded_error`` / ``"Overloaded"``."""
        return Fault.http_error(529, message="Overloaded", type="overloaded_error")

    @staticmethod
    def auth() -> Behavior:
        """401 ``invalid_api_key``."""
        return Fault.http_error(
            401,
            message=(
                "Incorrect API key provided: sk-sim***. You can find your API key at "
                "https://platform.openai.com/account/api-keys."
            ),
            code="invalid_api_key",
            type="invalid_request_error",
        )

    @staticmethod
    def context_length(limit: int = _DEFAULT_CONTEXT_LIMIT) -> Behavior:
        """400 ``context_length_exceeded`` (the message reports the prompt's token estimate)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise ValueError(f"limit must be a positive integer, got {limit!r}")
        return Behavior(
            kind="http_error",
            status=400,
            code="context_length_exceeded",
            error_type="invalid_request_error",
            context_limit=limit,
        )

    @staticmethod
    def content_filter() -> Behavior:
        """400 ``content_filter`` with Azure OpenAI's content-management message."""
        return Fault.http_error(
            400,
            message=(
                "The response was filtered due to the prompt triggering Azure OpenAI's content "
                "management policy. Please modify your prompt and retry. To learn more about our "
                "content filtering policies please read our documentation: "
                "https://go.microsoft.com/fwlink/?linkid=2198766"
            ),
            code="content_filter",
            type="invalid_request_error",
        )

    @staticmethod
    def not_found() -> Behavior:
        """404 ``model_not_found`` (the message names the requested model)."""
        return Behavior(
            kind="http_error",
            status=404,
            code="model_not_found",
            error_type="invalid_request_error",
        )

    @staticmethod
    def reset() -> Behavior:
        """Abort the TCP connection with an RST after reading the request."""
        return Behavior(kind="reset")

    @staticmethod
    def silence(max_hold: float = 60.0) -> Behavior:
        """Send nothing until the client leaves or ``max_hold`` seconds pass (then RST)."""
        return Behavior(kind="silence", seconds=_check_seconds("max_hold", max_hold))

    @staticmethod
    def slow_first_token(seconds: float) -> Behavior:
        """``ok`` whose first token (or whole non-stream response) is ``seconds`` late."""
        return Behavior(kind="ok", ttft=_check_seconds("seconds", seconds))

    @staticmethod
    def stream_cut(after_chunks: int = 2) -> Behavior:
        """Close the connection mid-stream after ``after_chunks`` content chunks."""
        return Behavior(kind="stream_cut", after_chunks=_check_count("after_chunks", after_chunks))

    @staticmethod
    def stream_stall(after_chunks: int = 2, seconds: float = 60.0) -> Behavior:
        """Go silent for ``seconds`` after ``after_chunks`` content chunks (then RST)."""
        return Behavior(
            kind="stream_stall",
            after_chunks=_check_count("after_chunks", after_chunks),
            seconds=_check_seconds("seconds", seconds),
        )

    @staticmethod
    def malformed_chunk(after_chunks: int = 1) -> Behavior:
        """Insert one invalid-JSON event after ``after_chunks`` chunks (non-stream: bad body)."""
        return Behavior(kind="malformed_chunk", after_chunks=_check_count("after_chunks", after_chunks))

    @staticmethod
    def no_done() -> Behavior:
        """End the stream cleanly but without ``data: [DONE]``."""
        return Behavior(kind="no_done")

    @staticmethod
    def flaky(p: float, fault: Behavior, seed: int | None = None) -> Behavior:
        """Apply ``fault`` with probability ``p`` (deterministic per-deployment RNG), else ok."""
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be a probability in [0, 1], got {p!r}")
        if not isinstance(fault, Behavior):
            raise ValueError(f"fault must be a Behavior, got {fault!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be an int or None, got {seed!r}")
        return Behavior(kind="flaky", p=float(p), fault=fault, seed=seed)


_OK = Fault.ok()


# --------------------------------------------------------------------------------------------
# Request log
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestRecord:
    """A snapshot of one logged chat request."""

    deployment: str
    model: str
    stream: bool
    started_at: float
    finished_at: float | None
    behavior: str
    status: int | None
    body: JSONDict
    headers: dict[str, str]


@dataclass
class _MutableRecord:
    deployment: str
    model: str
    stream: bool
    started_at: float
    behavior: str
    body: JSONDict
    headers: dict[str, str]
    status: int | None = None
    finished_at: float | None = None

    def snapshot(self) -> RequestRecord:
        return RequestRecord(
            deployment=self.deployment,
            model=self.model,
            stream=self.stream,
            started_at=self.started_at,
            finished_at=self.finished_at,
            behavior=self.behavior,
            status=self.status,
            body=self.body,
            headers=self.headers,
        )


# --------------------------------------------------------------------------------------------
# Token estimate and reply generation
# --------------------------------------------------------------------------------------------


def estimate_tokens(text: str) -> int:
    """The simulator's token estimate for a piece of text: ``ceil(len(text) / 4)``."""
    return (len(text) + 3) // 4


def _content_text(content: Any) -> tuple[str, int]:
    """(concatenated text, number of image parts) of a message ``content``."""
    if content is None:
        return "", 0
    if isinstance(content, str):
        return content, 0
    if isinstance(content, list):
        texts: list[str] = []
        images = 0
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict):
                kind = part.get("type")
                if kind in ("image_url", "input_image", "image"):
                    images += 1
                elif isinstance(part.get("text"), str):
                    texts.append(part["text"])
        return "".join(texts), images
    return str(content), 0


def estimate_prompt_tokens(messages: Sequence[Any]) -> int:
    """``sum(4 + estimate_tokens(text) + 85 * images for each message) + 2``."""
    total = 2
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else message
        text, images = _content_text(content)
        total += 4 + estimate_tokens(text) + _IMAGE_TOKENS * images
    return total


def _last_text(messages: Sequence[Any], role: str) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == role:
            return _content_text(message.get("content"))[0]
    return ""


def _split_words(text: str) -> list[str]:
    return _WORD_RE.findall(text)


def _quoted(text: str) -> list[str]:
    return [m.group(2) for m in _QUOTED_PHRASE_RE.finditer(text)]


def _numbers(text: str) -> list[float]:
    return [float(m) for m in _NUMBER_RE.findall(text)]


class _SchemaFaker:
    """Generates a deterministic instance of a JSON schema."""

    def __init__(
        self,
        root: Any,
        numbers: Sequence[float],
        name_strings: bool,
        strings: Sequence[str] = (),
    ) -> None:
        self._root = root
        self._numbers = deque(numbers)
        self._strings = deque(strings)
        self._name_strings = name_strings

    def generate(self, schema: Any, name: str = "", depth: int = 0) -> Any:
        if depth > _MAX_SCHEMA_DEPTH or not isinstance(schema, dict):
            return None if depth > _MAX_SCHEMA_DEPTH else self._string({}, name)
        if isinstance(schema.get("$ref"), str):
            target = self._resolve(schema["$ref"])
            extra = {k: v for k, v in schema.items() if k != "$ref"}
            return self.generate({**target, **extra}, name, depth + 1)
        if "const" in schema:
            return schema["const"]
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return next((v for v in enum if v is not None), enum[0])
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and branches:
                branch = next((b for b in branches if not _is_null_schema(b)), branches[0])
                return self.generate(branch, name, depth + 1)
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and all_of:
            merged: JSONDict = {k: v for k, v in schema.items() if k != "allOf"}
            for branch in all_of:
                resolved = self._deref(branch)
                props = {**merged.get("properties", {}), **resolved.get("properties", {})}
                merged = {**resolved, **merged}
                if props:
                    merged["properties"] = props
            return self.generate(merged, name, depth + 1)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind is None:
            if "properties" in schema:
                kind = "object"
            elif "items" in schema or "prefixItems" in schema:
                kind = "array"
        if kind == "object":
            properties = schema.get("properties")
            if not isinstance(properties, dict):
                return {}
            return {str(k): self.generate(v, str(k), depth + 1) for k, v in properties.items()}
        if kind == "array":
            prefix = schema.get("prefixItems")
            if isinstance(prefix, list) and prefix:
                return [self.generate(p, name, depth + 1) for p in prefix]
            min_items = schema.get("minItems", 0)
            count = min_items if isinstance(min_items, int) and min_items > 0 else 0
            return [self.generate(schema.get("items", {}), name, depth + 1) for _ in range(count)]
        if kind == "integer":
            value = int(self._numbers.popleft()) if self._numbers else 1
            return int(_clamp(value, schema, integer=True))
        if kind == "number":
            number = self._numbers.popleft() if self._numbers else 1.0
            return float(_clamp(number, schema, integer=False))
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        return self._string(schema, name)

    def _string(self, schema: JSONDict, name: str) -> str:
        formats = {
            "date-time": "2024-01-01T00:00:00Z",
            "date": "2024-01-01",
            "time": "12:00:00",
            "email": "user@example.com",
            "uri": "https://example.com",
            "url": "https://example.com",
            "uuid": "00000000-0000-4000-8000-000000000000",
        }
        fmt = schema.get("format")
        if isinstance(fmt, str) and fmt in formats:
            return formats[fmt]
        if self._strings:
            value = self._strings.popleft()
        else:
            value = f"example {name}" if self._name_strings and name else "example"
        min_len = schema.get("minLength")
        if isinstance(min_len, int) and len(value) < min_len:
            value = value + "x" * (min_len - len(value))
        max_len = schema.get("maxLength")
        if isinstance(max_len, int) and len(value) > max_len:
            value = value[: max(max_len, 0)]
        return value

    def _deref(self, schema: Any) -> JSONDict:
        for _ in range(_MAX_SCHEMA_DEPTH):
            if not isinstance(schema, dict):
                return {}
            ref = schema.get("$ref")
            if not isinstance(ref, str):
                return schema
            schema = self._resolve(ref)
        return {}

    def _resolve(self, ref: str) -> JSONDict:
        if not ref.startswith("#"):
            return {}
        node: Any = self._root
        for raw in ref[1:].split("/"):
            if not raw:
                continue
            key = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and key in node:
                node = node[key]
            else:
                return {}
        return node if isinstance(node, dict) else {}


def _is_null_schema(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "null"


def _clamp(value: float, schema: JSONDict, *, integer: bool) -> float:
    step = 1 if integer else 1e-9
    low = schema.get("minimum")
    if isinstance(low, (int, float)) and value < low:
        value = math.ceil(low) if integer else low
    xlow = schema.get("exclusiveMinimum")
    if isinstance(xlow, (int, float)) and not isinstance(xlow, bool) and value <= xlow:
        value = math.floor(xlow) + 1 if integer else xlow + step
    high = schema.get("maximum")
    if isinstance(high, (int, float)) and value > high:
        value = math.floor(high) if integer else high
    xhigh = schema.get("exclusiveMaximum")
    if isinstance(xhigh, (int, float)) and not isinstance(xhigh, bool) and value >= xhigh:
        value = math.ceil(xhigh) - 1 if integer else xhigh - step
    return value


@dataclass
class _Reply:
    content: str | None
    words: list[str]
    finish_reason: str
    completion_tokens: int
    tool_call: JSONDict | None = None


def _pick_tool(tools: Any, tool_choice: Any, text: str) -> JSONDict | None:
    if tool_choice == "none" or not isinstance(tools, list):
        return None
    functions = [
        t["function"]
        for t in tools
        if isinstance(t, dict)
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
    ]
    if not functions:
        return None
    if isinstance(tool_choice, dict):
        chosen = tool_choice.get("function")
        wanted = chosen.get("name") if isinstance(chosen, dict) else tool_choice.get("name")
        for function in functions:
            if function["name"] == wanted:
                return function
    lowered = text.lower()
    best: tuple[int, int] | None = None
    best_function: JSONDict | None = None
    for function in functions:
        position = lowered.find(function["name"].lower())
        if position >= 0:
            key = (position, -len(function["name"]))
            if best is None or key < best:
                best, best_function = key, function
    return best_function if best_function is not None else functions[0]


def _default_text(deployment: str, user_text: str) -> str:
    words = user_text.split()[:12]
    excerpt = " ".join(words).rstrip(".!?;:, ")
    if not excerpt:
        return f"Hello from {deployment}."
    return f"Hello from {deployment}. You said: {excerpt}."


def _json_object_reply(messages: Sequence[Any], answer: str) -> JSONDict:
    texts = [
        _content_text(m.get("content"))[0]
        for m in messages
        if isinstance(m, dict) and m.get("role") in ("system", "developer")
    ]
    texts.append(_last_text(messages, "user"))
    keys: dict[str, None] = {}
    for text in texts:
        for match in _QUOTED_KEY_RE.finditer(text):
            keys.setdefault(match.group(2))
    if not keys:
        return {"answer": answer}
    return {key: f"example {key}" for key in keys}


def _apply_limits(text: str, body: Mapping[str, Any]) -> tuple[list[str], str]:
    finish = "stop"
    stop = body.get("stop")
    sequences = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    cut = len(text)
    for seq in sequences:
        if isinstance(seq, str) and seq:
            position = text.find(seq)
            if 0 <= position < cut:
                cut = position
    words = _split_words(text[:cut])
    limit = body.get("max_completion_tokens")
    if limit is None:
        limit = body.get("max_tokens")
    if isinstance(limit, int) and not isinstance(limit, bool) and 0 <= limit < len(words):
        words = words[:limit]
        finish = "length"
    return words, finish


def _build_reply(body: Mapping[str, Any], deployment: str, text: str | None) -> _Reply:
    raw_messages = body.get("messages")
    messages: list[Any] = raw_messages if isinstance(raw_messages, list) else []
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    user_text = _last_text(messages, "user")
    if text is None:
        if last.get("role") == "tool":
            text = f"The tool returned: {_content_text(last.get('content'))[0]}."
        else:
            function = _pick_tool(body.get("tools"), body.get("tool_choice", "auto"), user_text)
            if function is not None:
                params = function.get("parameters") or {"type": "object", "properties": {}}
                faker = _SchemaFaker(
                    params, _numbers(user_text), name_strings=False, strings=_quoted(user_text)
                )
                args = faker.generate(params)
                if not isinstance(args, dict):
                    args = {}
                arguments = json.dumps(args, ensure_ascii=False)
                call = {"name": function["name"], "arguments": arguments}
                return _Reply(
                    content=None,
                    words=[],
                    finish_reason="tool_calls",
                    completion_tokens=estimate_tokens(arguments) + 5,
                    tool_call=call,
                )
            text = _structured_text(body, messages, user_text)
            if text is None:
                text = _default_text(deployment, user_text)
    words, finish = _apply_limits(text, body)
    return _Reply(content="".join(words), words=words, finish_reason=finish, completion_tokens=len(words))


def _structured_text(body: Mapping[str, Any], messages: Sequence[Any], user_text: str) -> str | None:
    response_format = body.get("response_format")
    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            schema = {"type": "object", "properties": {}}
        faker = _SchemaFaker(schema, _numbers(user_text), name_strings=True)
        return json.dumps(faker.generate(schema, "answer"), ensure_ascii=False)
    if kind == "json_object":
        reply = _json_object_reply(messages, _default_text("simulator", user_text))
        return json.dumps(reply, ensure_ascii=False)
    return None


# --------------------------------------------------------------------------------------------
# Per-deployment state
# --------------------------------------------------------------------------------------------


@dataclass
class _Bucket:
    rate: float
    burst: int
    retry_after: float | None
    tokens: float
    updated: float

    def take(self, now: float) -> bool:
        self.tokens = min(float(self.burst), self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass
class _DeploymentState:
    queue: deque[Behavior] = field(default_factory=deque)
    default: Behavior = _OK
    outage_until: float = -math.inf
    outage_behavior: Behavior | None = None
    bucket: _Bucket | None = None
    context_window: int | None = None
    rngs: dict[Behavior, random.Random] = field(default_factory=dict)


@dataclass
class _Call:
    """Everything a handler needs about one chat request."""

    request: web.Request
    record: _MutableRecord
    behavior: Behavior
    body: JSONDict
    deployment: str
    model: str
    stream: bool
    prompt_tokens: int
    number: int


def _check_deployment(deployment: str) -> str:
    if not isinstance(deployment, str) or not deployment or "/" in deployment:
        raise ValueError(f"deployment must be a non-empty name without '/', got {deployment!r}")
    return deployment


def _format_retry_after(value: float | str) -> str:
    if isinstance(value, str):
        return value
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _abort(request: web.BaseRequest, *, rst: bool) -> None:
    """Drop the connection: RST (SO_LINGER 0, unsent data discarded) or a flushed FIN close."""
    transport = request.transport
    if transport is None:
        return
    if rst:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    else:
        transport.close()


def _finish(record: _MutableRecord) -> None:
    if record.finished_at is None:
        record.finished_at = time.monotonic()


def _sse(payload: JSONDict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


class ProviderSimulator:
    """A fault-injecting OpenAI-compatible server on a background thread (see module docs)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an integer in [0, 65535], got {port!r}")
        self.host = host
        self._requested_port = port
        self._bound_port: int | None = None
        self._lock = threading.Lock()
        self._states: dict[str, _DeploymentState] = {}
        self._log: list[_MutableRecord] = []
        self._numbers = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._active: set[asyncio.Task[Any]] = set()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> ProviderSimulator:
        """Start serving; returns once the socket is bound.  A no-op if already running."""
        if self._thread is not None:
            return self
        _env.allow_loopback()
        ready = threading.Event()
        errors: list[BaseException] = []
        thread = threading.Thread(
            target=self._run, args=(ready, errors), name="provider-simulator", daemon=True
        )
        thread.start()
        ready.wait()
        if errors:
            thread.join()
            raise errors[0]
        self._thread = thread
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving: cancel in-flight handlers, close connections, join the thread."""
        thread, loop = self._thread, self._loop
        if thread is None:
            return
        if loop is not None and loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
            with contextlib.suppress(Exception):
                future.result(timeout)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        self._thread = None
        self._loop = None

    def __enter__(self) -> ProviderSimulator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"port={self._bound_port}" if self._thread is not None else "stopped"
        return f"<ProviderSimulator {self.host} {state}>"

    def _run(self, ready: threading.Event, errors: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._setup())
        except BaseException as exc:
            errors.append(exc)
            ready.set()
            loop.close()
            return
        self._loop = loop
        ready.set()
        try:
            loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _setup(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._handle_chat)
        app.router.add_post("/chat/completions", self._handle_chat)
        app.router.add_get("/health", self._handle_health)
        app.router.add_get("/v1/models", self._handle_models)
        app.router.add_post("/{deployment}/v1/chat/completions", self._handle_chat)
        app.router.add_post("/{deployment}/chat/completions", self._handle_chat)
        app.router.add_get("/{deployment}/v1/models", self._handle_models)
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            handler_cancellation=True,
            shutdown_timeout=0.25,
        )
        await runner.setup()
        port = self._bound_port if self._bound_port is not None else self._requested_port
        site = web.TCPSite(runner, self.host, port, backlog=1024, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._bound_port = int(runner.addresses[0][1])

    async def _shutdown(self) -> None:
        active = list(self._active)
        for task in active:
            task.cancel()
        if active:
            await asyncio.wait(active, timeout=1.0)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        current = asyncio.current_task()
        leftovers = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
        for task in leftovers:
            task.cancel()
        if leftovers:
            await asyncio.wait(leftovers, timeout=1.0)

    # -- addresses ---------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound TCP port (only once started)."""
        if self._bound_port is None:
            raise RuntimeError("ProviderSimulator is not started")
        return self._bound_port

    @property
    def base_url(self) -> str:
        """``http://{host}:{port}`` (``127.0.0.1`` when bound to a wildcard address)."""
        host = "127.0.0.1" if self.host in ("", "0.0.0.0", "::") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def api_base(self, deployment: str) -> str:
        """LiteLLM ``api_base`` for an ``openai/`` model served as ``deployment``."""
        return f"{self.base_url}/{_check_deployment(deployment)}/v1"

    # -- scripting ---------------------------------------------------------------------------

    def _state(self, deployment: str) -> _DeploymentState:
        state = self._states.get(deployment)
        if state is None:
            state = self._states[deployment] = _DeploymentState()
        return state

    def script(self, deployment: str, *behaviors: Behavior) -> None:
        """Queue ``behaviors`` for ``deployment``; each request consumes one (FIFO)."""
        _check_deployment(deployment)
        for behavior in behaviors:
            if not isinstance(behavior, Behavior):
                raise ValueError(f"behaviors must be Behavior values, got {behavior!r}")
        with self._lock:
            self._state(deployment).queue.extend(behaviors)

    def set_default(self, deployment: str, behavior: Behavior) -> None:
        """What ``deployment`` does once its queue is empty."""
        _check_deployment(deployment)
        if not isinstance(behavior, Behavior):
            raise ValueError(f"behavior must be a Behavior, got {behavior!r}")
        with self._lock:
            self._state(deployment).default = behavior

    def outage(self, deployment: str, seconds: float, behavior: Behavior | None = None) -> None:
        """Every request in the next ``seconds`` gets ``behavior`` (default: 503)."""
        _check_deployment(deployment)
        seconds = _check_seconds("seconds", seconds)
        if behavior is None:
            behavior = Fault.server_error(503)
        if not isinstance(behavior, Behavior):
            raise ValueError(f"behavior must be a Behavior, got {behavior!r}")
        with self._lock:
            state = self._state(deployment)
            state.outage_until = time.monotonic() + seconds
            state.outage_behavior = behavior

    def token_bucket(
        self, deployment: str, rate: float, burst: int, retry_after: float | None = None
    ) -> None:
        """Rate-limit ``deployment``: ``burst`` tokens, refilled at ``rate`` per second."""
        _check_deployment(deployment)
        rate = _check_seconds("rate", rate)
        burst = _check_count("burst", burst)
        if retry_after is not None:
            retry_after = _check_seconds("retry_after", retry_after)
        with self._lock:
            self._state(deployment).bucket = _Bucket(
                rate=rate,
                burst=burst,
                retry_after=retry_after,
                tokens=float(burst),
                updated=time.monotonic(),
            )

    def set_context_window(self, deployment: str, tokens: int | None) -> None:
        """Reject prompts estimated above ``tokens`` with the context-length 400 (None: off)."""
        _check_deployment(deployment)
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0):
            raise ValueError(f"tokens must be a positive integer or None, got {tokens!r}")
        with self._lock:
            self._state(deployment).context_window = tokens

    # -- log ---------------------------------------------------------------------------------

    def requests(self, deployment: str | None = None) -> list[RequestRecord]:
        """Snapshot of the request log (arrival order), optionally for one deployment."""
        with self._lock:
            return [r.snapshot() for r in self._log if deployment is None or r.deployment == deployment]

    def count(self, deployment: str | None = None) -> int:
        """Number of logged chat requests, optionally for one deployment."""
        with self._lock:
            if deployment is None:
                return len(self._log)
            return sum(1 for r in self._log if r.deployment == deployment)

    def clear_log(self) -> None:
        """Forget logged requests (scripts and settings are kept)."""
        with self._lock:
            self._log.clear()

    def reset(self) -> None:
        """Clear the log and every script, default, outage, bucket and context window."""
        with self._lock:
            self._log.clear()
            self._states.clear()

    # -- request handling --------------------------------------------------------------------

    async def _handle_health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _handle_models(self, request: web.Request) -> web.Response:
        deployment = request.match_info.get("deployment")
        if deployment:
            names = [deployment]
        else:
            with self._lock:
                names = sorted(self._states) or ["sim"]
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "simulator"} for n in names]
        return web.json_response({"object": "list", "data": data})

    def _choose(self, deployment: str, prompt_tokens: int, now: float) -> tuple[Behavior, str]:
        """Pick the behaviour for one request (caller holds the lock)."""
        state = self._states.get(deployment)
        if state is None:
            return _OK, "ok"
        prefix = ""
        if state.outage_behavior is not None and now < state.outage_until:
            behavior = state.outage_behavior
            prefix = "outage:"
        elif state.bucket is not None and not state.bucket.take(now):
            behavior = Fault.rate_limit(retry_after=state.bucket.retry_after)
            return behavior, "token_bucket:429"
        elif state.context_window is not None and prompt_tokens > state.context_window:
            return Fault.context_length(state.context_window), "context_window"
        elif state.queue:
            behavior = state.queue.popleft()
        else:
            behavior = state.default
        names: list[str] = []
        while behavior.kind == "flaky" and behavior.fault is not None:
            rng = state.rngs.get(behavior)
            if rng is None:
                seed = behavior.seed
                if seed is None:
                    seed = zlib.crc32(deployment.encode())
                rng = state.rngs[behavior] = random.Random(seed)
            names.append("flaky:")
            behavior = behavior.fault if rng.random() < behavior.p else _OK
        return behavior, prefix + "".join(names) + behavior.name

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        task = asyncio.current_task()
        if task is not None:
            self._active.add(task)
        record: _MutableRecord | None = None
        try:
            raw = await request.read()
            headers = {
                k.lower(): ("***" if k.lower() in _REDACTED_HEADERS else v)
                for k, v in request.headers.items()
            }
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = None
            body: JSONDict = parsed if isinstance(parsed, dict) else {}
            model = body.get("model")
            model = model if isinstance(model, str) else ""
            deployment = request.match_info.get("deployment") or model or "default"
            stream = body.get("stream") is True
            messages = body.get("messages")
            if not isinstance(parsed, dict) or not isinstance(messages, list):
                record = _MutableRecord(deployment, model, stream, started, "bad_request", body, headers)
                with self._lock:
                    self._log.append(record)
                return await self._send_error(
                    request, record, deployment, 400,
                    {
                        "message": "Request body must be a JSON object with a 'messages' list.",
                        "type": "invalid_request_error",
                        "param": "messages",
                        "code": None,
                    },
                    None,
                )  # fmt: skip
            prompt_tokens = estimate_prompt_tokens(messages)
            with self._lock:
                behavior, name = self._choose(deployment, prompt_tokens, started)
                record = _MutableRecord(deployment, model, stream, started, name, body, headers)
                self._log.append(record)
            call = _Call(
                request=request,
                record=record,
                behavior=behavior,
                body=body,
                deployment=deployment,
                model=model,
                stream=stream,
                prompt_tokens=prompt_tokens,
                number=next(self._numbers),
            )
            return await self._apply(call)
        except ConnectionError:
            # The client went away mid-write; aiohttp's own write of this dummy fails quietly.
            return web.Response()
        finally:
            if record is not None and record.finished_at is None:
                record.finished_at = time.monotonic()
            if task is not None:
                self._active.discard(task)

    async def _apply(self, call: _Call) -> web.StreamResponse:
        behavior = call.behavior
        kind = behavior.kind
        request = call.request
        if kind == "http_error":
            return await self._send_behavior_error(call)
        if kind == "reset" or (kind == "stream_cut" and not call.stream):
            _finish(call.record)
            _abort(request, rst=True)
            return web.Response()
        if kind == "silence" or (kind == "stream_stall" and not call.stream):
            await asyncio.sleep(behavior.seconds)
            _finish(call.record)
            _abort(request, rst=True)
            return web.Response()
        reply = _build_reply(call.body, call.deployment, behavior.text)
        if call.stream:
            return await self._send_stream(call, reply)
        delay = behavior.latency + behavior.ttft
        if delay > 0:
            await asyncio.sleep(delay)
        payload = json.dumps(self._completion(call, reply), ensure_ascii=False).encode()
        if kind == "malformed_chunk":
            payload = payload[: max(1, len(payload) // 2)]
        response = web.Response(
            status=200,
            body=payload,
            content_type="application/json",
            charset="utf-8",
            headers={"x-simulator-deployment": call.deployment},
        )
        call.record.status = 200
        _finish(call.record)  # before the last byte, so the log is complete when the client sees it
        await response.prepare(request)
        await response.write_eof()
        return response

    async def _send_behavior_error(self, call: _Call) -> web.StreamResponse:
        behavior = call.behavior
        message = behavior.message
        if message is None:
            if behavior.context_limit is not None:
                message = (
                    f"This model's maximum context length is {behavior.context_limit} tokens. "
                    f"However, your messages resulted in {call.prompt_tokens} tokens. "
                    "Please reduce the length of the messages."
                )
            elif behavior.code == "model_not_found":
                message = (
                    f"The model `{call.model or call.deployment}` does not exist or you do not "
                    "have access to it."
                )
            else:
                message = _default_message(behavior.status)
        error = {
            "message": message,
            "type": behavior.error_type,
            "param": None,
            "code": behavior.code,
        }
        return await self._send_error(
            call.request, call.record, call.deployment, behavior.status, error, behavior.retry_after
        )

    async def _send_error(
        self,
        request: web.Request,
        record: _MutableRecord,
        deployment: str,
        status: int,
        error: JSONDict,
        retry_after: float | str | None,
    ) -> web.StreamResponse:
        headers = {"x-simulator-deployment": deployment}
        if retry_after is not None:
            headers["Retry-After"] = _format_retry_after(retry_after)
        response = web.Response(
            status=status,
            reason="Overloaded" if status == 529 else None,
            body=json.dumps({"error": error}, ensure_ascii=False).encode(),
            content_type="application/json",
            charset="utf-8",
            headers=headers,
        )
        record.status = status
        _finish(record)
        await response.prepare(request)
        await response.write_eof()
        return response

    def _completion(self, call: _Call, reply: _Reply) -> JSONDict:
        message: JSONDict = {"role": "assistant", "content": reply.content}
        if reply.tool_call is not None:
            message["tool_calls"] = [
                {"id": f"call_sim_{call.number}", "type": "function", "function": reply.tool_call}
            ]
        return {
            "id": f"chatcmpl-sim-{call.number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": call.model,
            "system_fingerprint": "sim",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": reply.finish_reason,
                }
            ],
            "usage": self._usage(call, reply),
        }

    @staticmethod
    def _usage(call: _Call, reply: _Reply) -> JSONDict:
        return {
            "prompt_tokens": call.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": call.prompt_tokens + reply.completion_tokens,
        }

    def _stream_events(self, call: _Call, reply: _Reply) -> tuple[list[bytes], list[bytes]]:
        """(content events, closing events: finish chunk, usage chunk, [DONE])."""
        base: JSONDict = {
            "id": f"chatcmpl-sim-{call.number}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": call.model,
            "system_fingerprint": "sim",
        }

        def chunk(delta: JSONDict, finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return _sse({**base, "choices": [choice]})

        deltas: list[JSONDict]
        if reply.tool_call is not None:
            arguments = reply.tool_call["arguments"]
            first = {
                "index": 0,
                "id": f"call_sim_{call.number}",
                "type": "function",
                "function": {"name": reply.tool_call["name"], "arguments": ""},
            }
            deltas = [{"role": "assistant", "content": None, "tool_calls": [first]}]
            for i in range(0, len(arguments), _TOOL_ARG_FRAGMENT):
                fragment = arguments[i : i + _TOOL_ARG_FRAGMENT]
                deltas.append({"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]})
        elif reply.words:
            deltas = [{"role": "assistant", "content": reply.words[0]}]
            deltas.extend({"content": word} for word in reply.words[1:])
        else:
            deltas = [{"role": "assistant", "content": ""}]
        events = [chunk(d) for d in deltas]
        closing = [chunk({}, reply.finish_reason)]
        options = call.body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage") is True:
            closing.append(_sse({**base, "choices": [], "usage": self._usage(call, reply)}))
        if call.behavior.kind != "no_done":
            closing.append(_DONE_EVENT)
        return events, closing

    async def _send_stream(self, call: _Call, reply: _Reply) -> web.StreamResponse:
        behavior = call.behavior
        kind = behavior.kind
        request = call.request
        events, closing = self._stream_events(call, reply)
        if kind in ("stream_cut", "stream_stall"):
            events, closing = events[: behavior.after_chunks], []
        elif kind == "malformed_chunk":
            events.insert(min(behavior.after_chunks, len(events)), _MALFORMED_EVENT)
        if behavior.latency > 0:
            await asyncio.sleep(behavior.latency)
        response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "x-simulator-deployment": call.deployment,
            },
        )
        if kind == "no_done":
            response.force_close()
        await response.prepare(request)
        call.record.status = 200
        if behavior.ttft > 0:
            await asyncio.sleep(behavior.ttft)
        if behavior.chunk_delay > 0:
            for i, event in enumerate(events):
                if i:
                    await asyncio.sleep(behavior.chunk_delay)
                await response.write(event)
            tail = b"".join(closing)
        else:
            tail = b"".join(events + closing)
        if kind == "stream_cut":
            if tail:
                await response.write(tail)
            _finish(call.record)
            _abort(request, rst=False)
            return response
        if kind == "stream_stall":
            if tail:
                await response.write(tail)
            await asyncio.sleep(behavior.seconds)
            _finish(call.record)
            _abort(request, rst=True)
            return response
        _finish(call.record)  # before the last byte, so the log is complete when the client sees it
        await response.write_eof(tail)
        return response


def _default_message(status: int) -> str:
    messages = {
        400: "Invalid request (simulated).",
        401: "Invalid authentication (simulated).",
        403: "Permission denied (simulated).",
        404: "Not found (simulated).",
        408: "Request timed out (simulated).",
        409: "Conflict (simulated).",
        422: "Unprocessable request (simulated).",
        429: "Rate limit reached for requests (simulated).",
        500: "The server had an error while processing your request. Sorry about that!",
        502: "Bad gateway (simulated).",
        503: "The service is temporarily unavailable (simulated).",
        504: "Gateway timeout (simulated).",
    }
    return messages.get(status, f"Simulated HTTP {status} error.")


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _wait_forever(simulator: ProviderSimulator) -> None:
    """Block until Ctrl-C (a seam for tests)."""
    while True:
        time.sleep(3600)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulator standalone until interrupted (Ctrl-C)."""
    parser = argparse.ArgumentParser(
        prog="python -m llm_resilience_plugin.simulator",
        description="Serve a fault-injecting OpenAI-compatible chat-completions endpoint.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="TCP port (0: pick a free one)")
    parser.add_argument("--deployments", default="a", help="comma-separated deployment names to print (a)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.deployments.split(",") if n.strip()]
    simulator = ProviderSimulator(host=args.host, port=args.port)
    simulator.start()
    try:
        print(f"ProviderSimulator listening on {simulator.base_url}", flush=True)
        for name in names:
            print(f"  {name}: {simulator.api_base(name)}", flush=True)
        print("Press Ctrl-C to stop.", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            _wait_forever(simulator)
    finally:
        simulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
