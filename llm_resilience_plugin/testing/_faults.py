"""The simulator's fault vocabulary: :class:`Behavior` values, the :class:`Fault` constructors.

Also the argument checks the server's scripting methods share, and the default error messages.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "OK",
    "PREFILL_REFUSAL",
    "Behavior",
    "Fault",
    "check_count",
    "check_seconds",
    "default_message",
    "prefilled",
    "resolve",
]

_DEFAULT_CONTEXT_LIMIT = 8192

PREFILL_REFUSAL = (
    "This model does not support assistant message prefill. The conversation must end with a user message."
)
"""What ``refuse_prefill`` answers by default: the 400 ``invalid_request_error`` Anthropic's newer
models send (and OpenAI-compatible proxies in front of them pass on) for a request ending in an
assistant message."""


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
    carries_content: bool = True  # malformed_chunk: does the invalid event show a text value?
    repeat: int = 1  # malformed_chunk: how many invalid events (one good chunk between two)
    replace: bool = False  # malformed_chunk: the invalid event takes a content event's place

    @property
    def name(self) -> str:
        """The name recorded in :attr:`RequestRecord.behavior` (flaky shows as ``flaky``)."""
        if self.kind == "http_error":
            return f"http_error:{self.status}"
        return self.kind


def check_seconds(name: str, value: float) -> float:
    """``value`` as a float if it is a finite number >= 0, else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def check_count(name: str, value: int) -> int:
    """``value`` if it is an integer >= 0, else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def _check_status(name: str, value: int, low: int = 100, high: int = 599) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer HTTP status in [{low}, {high}], got {value!r}")
    return value


def _check_retry_after(value: float | str | None) -> float | str | None:
    if value is None:
        return value
    if isinstance(value, str):  # sent as a header value: a line break would split the response
        if not value.strip() or not value.isprintable():
            raise ValueError(
                f"retry_after must be a printable header value without line breaks, got {value!r}"
            )
        return value
    return check_seconds("retry_after", value)


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
            latency=check_seconds("latency", latency),
            ttft=check_seconds("ttft", ttft),
            chunk_delay=check_seconds("chunk_delay", chunk_delay),
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
    def overloaded(retry_after: float | str | None = None) -> Behavior:
        """529 with Anthropic's ``overloaded_error`` / ``"Overloaded"`` (optional ``Retry-After``)."""
        return Fault.http_error(529, message="Overloaded", retry_after=retry_after, type="overloaded_error")

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
        return Behavior(kind="silence", seconds=check_seconds("max_hold", max_hold))

    @staticmethod
    def slow_first_token(seconds: float) -> Behavior:
        """``ok`` whose first token (or whole non-stream response) is ``seconds`` late."""
        return Behavior(kind="ok", ttft=check_seconds("seconds", seconds))

    @staticmethod
    def stream_cut(after_chunks: int = 2) -> Behavior:
        """Close the connection mid-stream after ``after_chunks`` content chunks."""
        return Behavior(kind="stream_cut", after_chunks=check_count("after_chunks", after_chunks))

    @staticmethod
    def stream_stall(after_chunks: int = 2, seconds: float = 60.0) -> Behavior:
        """Go silent for ``seconds`` after ``after_chunks`` content chunks (then RST)."""
        return Behavior(
            kind="stream_stall",
            after_chunks=check_count("after_chunks", after_chunks),
            seconds=check_seconds("seconds", seconds),
        )

    @staticmethod
    def malformed_chunk(
        after_chunks: int = 1, content: bool = True, repeat: int = 1, replace: bool = False
    ) -> Behavior:
        """Insert one invalid-JSON event after ``after_chunks`` chunks (non-stream: bad body);
        ``content=False`` makes it one that shows no text (a cut role chunk), ``repeat`` inserts
        that many (one good chunk between two); ``replace=True`` puts it in the place of the next
        event instead (that event's text is lost - a client that skips what it cannot decode
        ends with a hole in the answer)."""
        if not isinstance(content, bool):
            raise ValueError(f"content must be a bool, got {content!r}")
        if not isinstance(replace, bool):
            raise ValueError(f"replace must be a bool, got {replace!r}")
        if check_count("repeat", repeat) < 1:
            raise ValueError(f"repeat must be an integer >= 1, got {repeat!r}")
        return Behavior(
            kind="malformed_chunk",
            after_chunks=check_count("after_chunks", after_chunks),
            carries_content=content,
            repeat=repeat,
            replace=replace,
        )

    @staticmethod
    def no_done() -> Behavior:
        """End the stream cleanly but without ``data: [DONE]``."""
        return Behavior(kind="no_done")

    @staticmethod
    def refuse_prefill(fault: Behavior | None = None, message: str | None = None) -> Behavior:
        """A model that takes no assistant prefill: a request whose last message is the assistant's
        (``{"role": "assistant", ...}``, with or without ``"prefix": true``) gets a 400
        ``invalid_request_error`` saying so (``message``, default :data:`PREFILL_REFUSAL`);
        any other request gets ``fault`` (default ``ok``)."""
        if fault is not None and not isinstance(fault, Behavior):
            raise ValueError(f"fault must be a Behavior or None, got {fault!r}")
        if message is not None and (not isinstance(message, str) or not message):
            raise ValueError(f"message must be a non-empty str or None, got {message!r}")
        return Behavior(kind="refuse_prefill", fault=fault, message=message)

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


OK = Fault.ok()
"""The plain success every deployment starts with (and what ``flaky`` applies when it does not fire)."""


def prefilled(body: object) -> bool:
    """Does a request ``body`` end in an assistant message (chat or Anthropic ``messages``, a
    Responses ``input`` list)?"""
    if not isinstance(body, dict):
        return False
    for key in ("messages", "input"):
        items = body.get(key)
        if isinstance(items, list) and items:
            last = items[-1]
            return isinstance(last, dict) and last.get("role") == "assistant"
    return False


def resolve(behavior: Behavior, body: object, draw: Callable[[Behavior], float]) -> tuple[Behavior, str]:
    """The behaviour a wrapper (``flaky``, ``refuse_prefill``) applies to one request ``body``,
    and the name it is logged as; ``draw`` gives a flaky wrapper's next random number."""
    names: list[str] = []
    while behavior.fault is not None or behavior.kind == "refuse_prefill":
        if behavior.kind == "flaky" and behavior.fault is not None:
            names.append("flaky:")
            behavior = behavior.fault if draw(behavior) < behavior.p else OK
        elif behavior.kind == "refuse_prefill":
            if prefilled(body):
                refusal = Fault.http_error(400, message=behavior.message or PREFILL_REFUSAL)
                return refusal, "".join(names) + "prefill_refused"
            behavior = behavior.fault or OK
        else:
            break
    return behavior, "".join(names) + behavior.name


def default_message(status: int) -> str:
    """The error message sent for an ``http_error`` without its own (OpenAI's wording for 500)."""
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
