"""Error taxonomy: every exception LiteLLM, openai, httpx and aiohttp raise is classified once here.

The engine acts on the class, never on exception types, so a new provider quirk is fixed in one
place. The class -> action table lives in :mod:`llm_resilience_plugin.policy` (``classes``).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import re
import time
from collections.abc import Mapping
from typing import Any

from llm_resilience_plugin._redaction import REDACTED, is_secret_key, scrub_field
from llm_resilience_plugin.errors import (
    BudgetExceededError,
    CircuitOpenError,
    ConfigError,
    ErrorClass,
    Failure,
    ResilienceError,
    StreamInterruptedError,
)

_CONTENT_POLICY_RE = re.compile(
    r"content[ _-]?(management )?polic|content[ _]filter|safety system|responsible ?ai|"
    r"flagged|prohibited content",
    re.IGNORECASE,
)
_CONTEXT_RE = re.compile(
    r"context[ _]length|maximum context|context window|prompt is too long|too many tokens|"
    r"input is too long|reduce the length",
    re.IGNORECASE,
)
_QUOTA_RE = re.compile(r"insufficient_quota|exceeded your current quota|billing", re.IGNORECASE)
_CONNECTION_RE = re.compile(
    r"connection error|connection reset|connection refused|server disconnected|"
    r"connection aborted|remote end closed|peer closed",
    re.IGNORECASE,
)


def parse_retry_after(value: Any, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After value: delta-seconds or an HTTP-date (RFC 9110)."""
    if value is None:
        return None
    text = str(value).strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)


def _headers_of(exc: BaseException) -> Mapping[str, Any] | None:
    for attr in ("litellm_response_headers", "headers"):
        h = getattr(exc, attr, None)
        if h:
            return h  # type: ignore[no-any-return]
    resp = getattr(exc, "response", None)
    h = getattr(resp, "headers", None)
    return h if h else None  # type: ignore[no-any-return]


def headers_of(exc: BaseException) -> Mapping[str, Any] | None:
    """The response headers an error carries (its rate-limit headers, Retry-After), if any."""
    return _headers_of(exc)


def retry_after_of(exc: BaseException) -> float | None:
    """The Retry-After an error carries (``retry-after-ms`` too), in seconds."""
    headers = _headers_of(exc)
    if not headers:
        return None
    try:
        lowered = {str(k).lower(): v for k, v in dict(headers).items()}
    except (TypeError, ValueError):
        return None
    ms = lowered.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    return parse_retry_after(lowered.get("retry-after"))


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    if status is None:
        from litellm.types.router import RouterRateLimitError

        if isinstance(exc, RouterRateLimitError):
            status = 429  # LiteLLM's "no deployment available": 429 from 1.110, unset before
    try:
        return int(status) if status is not None else None
    except (TypeError, ValueError):
        return None


def _wire_status(exc: BaseException, status: int | None) -> int | None:
    """The 5xx the provider really sent when LiteLLM reports it as a generic 500 (Anthropic's
    529 ``overloaded_error`` surfaces as ``InternalServerError`` 500): httpx's response says."""
    if status != 500:
        return status
    for e in _chain(exc):
        if type(e).__module__.split(".")[0] == "httpx" and type(e).__name__ == "HTTPStatusError":
            wire = getattr(getattr(e, "response", None), "status_code", None)
            if isinstance(wire, int) and wire > 500:
                return wire
    return status


def _message_of(exc: BaseException) -> str:
    msg = getattr(exc, "message", None)
    text = msg if isinstance(msg, str) and msg else str(exc)
    # LiteLLM appends a paragraph about its own fallbacks, which are off here.
    text = text.split("\n\nLiteLLM: model group")[0]
    return text.strip()[:500]


def _class_of(exc: BaseException, status: int | None, message: str) -> ErrorClass:
    # Imported lazily: importing this module must stay cheap and never pull litellm in early.
    import httpx
    import litellm
    import openai

    if isinstance(exc, BudgetExceededError):
        return ErrorClass.BUDGET
    if isinstance(exc, CircuitOpenError):
        return ErrorClass.CIRCUIT_OPEN
    if isinstance(exc, litellm.ContextWindowExceededError):
        return ErrorClass.CONTEXT_WINDOW
    if isinstance(exc, litellm.ContentPolicyViolationError):
        return ErrorClass.CONTENT_POLICY
    from litellm.types.router import RouterRateLimitError, RouterRateLimitErrorBasic

    if isinstance(exc, RouterRateLimitError | RouterRateLimitErrorBasic):
        return ErrorClass.CIRCUIT_OPEN  # LiteLLM found no deployment to send to
    if isinstance(
        exc,
        litellm.Timeout
        | openai.APITimeoutError
        | httpx.TimeoutException
        | asyncio.TimeoutError
        | TimeoutError,
    ):
        return ErrorClass.TIMEOUT
    if status == 408:
        return ErrorClass.TIMEOUT
    if status == 429 or isinstance(exc, litellm.RateLimitError | openai.RateLimitError):
        return ErrorClass.AUTH if _QUOTA_RE.search(message) else ErrorClass.RATE_LIMIT
    if status in (401, 403) or isinstance(exc, litellm.AuthenticationError | litellm.PermissionDeniedError):
        return ErrorClass.AUTH
    if isinstance(exc, litellm.APIConnectionError | openai.APIConnectionError) or isinstance(
        exc, httpx.TransportError | ConnectionError
    ):
        return ErrorClass.CONNECTION
    if status is not None and status >= 500:
        # Refused connections surface as InternalServerError("Connection error.").
        return ErrorClass.CONNECTION if _CONNECTION_RE.search(message) else ErrorClass.SERVER
    if status in (400, 404, 409, 413, 422) or isinstance(
        exc, litellm.BadRequestError | litellm.NotFoundError | openai.BadRequestError
    ):
        if _CONTEXT_RE.search(message) or status == 413:
            return ErrorClass.CONTEXT_WINDOW
        if _CONTENT_POLICY_RE.search(message):
            return ErrorClass.CONTENT_POLICY
        if _QUOTA_RE.search(message):
            return ErrorClass.AUTH
        return ErrorClass.BAD_REQUEST
    try:
        import aiohttp

        if isinstance(exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError):
            return ErrorClass.CONNECTION
    except ImportError:  # pragma: no cover - aiohttp is a dependency
        pass
    if _CONNECTION_RE.search(message):
        return ErrorClass.CONNECTION
    return ErrorClass.UNKNOWN


_MISSING_CREDENTIALS_RE = re.compile(
    r"missing credentials|api_key client option must be set|no api key provided", re.IGNORECASE
)
# Where a request that reached the network fails: transports, HTTP statuses, the OS, timeouts.
_TRANSPORT_MODULES = ("httpx", "aiohttp", "httpcore", "h11", "ssl", "socket")


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen and len(seen) < 20:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def raised_before_sending(exc: BaseException) -> bool:
    """Did ``exc`` happen in this process before any byte reached a provider?

    LiteLLM wraps errors raised while building a request (a message that is not a dict, a lone
    surrogate, ``bytes`` content, a NaN ``max_tokens``, missing credentials, credentials in the
    URL together with an Authorization header) as a 500 with no real response. Their cause chain
    holds no transport error, no HTTP status error and no OS error, and ends in a plain Python
    error (or says the credentials are missing). Such errors are the caller's, never the
    deployment's.
    """
    chain = _chain(exc)
    if type(exc).__module__.split(".")[0] not in ("litellm", "openai"):
        return False  # not a request LiteLLM tried to build (e.g. a bug in a wrapped Runnable)
    for e in chain:
        module = type(e).__module__.split(".")[0]
        if module in _TRANSPORT_MODULES or isinstance(e, OSError | TimeoutError | asyncio.TimeoutError):
            return False
        if (
            type(e).__name__ in ("APIConnectionError", "APITimeoutError", "APIStatusError")
            and module == "openai"
        ):
            return False
        if getattr(e, "status_code", None) not in (None, 500) and module != "litellm":
            return False
    root = chain[-1]
    if _MISSING_CREDENTIALS_RE.search(_message_of(exc)):
        return True
    return type(root).__module__ == "builtins" and isinstance(
        root, TypeError | ValueError | AttributeError | KeyError | UnicodeError | IndexError
    )


_SCRUBBED = "_llm_resilience_scrubbed"


def scrub_exception(exc: BaseException) -> None:
    """Redact secrets from the text of ``exc`` and its causes, in place (``args``, ``message``,
    ``body``), so an error raised to the caller as itself carries no key either.

    Each distinct text is scrubbed once (LiteLLM repeats one provider body in several fields and
    exceptions of the chain), at most ``MAX_FIELD_CHARS`` of it, and an exception already
    scrubbed is skipped: a 100 kB error body costs one bounded, linear scan.
    """
    done: dict[str, str] = {}

    def clean(text: str) -> str:
        out = done.get(text)
        if out is None:
            out = done[text] = scrub_field(text)
            done[out] = out
        return out

    def tree(value: Any, depth: int = 0) -> Any:
        if isinstance(value, str):
            return clean(value)
        if depth > 12:
            return "..."
        if isinstance(value, dict):
            return {
                k: REDACTED if is_secret_key(str(k)) and v not in (None, "") else tree(v, depth + 1)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [tree(v, depth + 1) for v in value]
        return value

    for e in _chain(exc):
        if getattr(e, _SCRUBBED, False):
            continue
        try:
            if any(isinstance(a, str) for a in e.args):
                e.args = tuple(clean(a) if isinstance(a, str) else a for a in e.args)
            for attr in ("message", "body"):
                value = getattr(e, attr, None)
                if isinstance(value, str):
                    setattr(e, attr, clean(value))
                elif isinstance(value, dict):
                    setattr(e, attr, tree(value))
            setattr(e, _SCRUBBED, True)
        except (AttributeError, TypeError, ValueError):  # read-only or frozen: leave it
            continue


def _is_http_status_error(e: BaseException) -> bool:
    """An exception built from a real HTTP error response (httpx's, or the openai SDK's own)."""
    module = type(e).__module__.split(".")[0]
    name = type(e).__name__
    return (module == "httpx" and name == "HTTPStatusError") or (
        module == "openai"
        and name not in ("APIConnectionError", "APITimeoutError")
        and _status_of(e) is not None
    )


def broken_body(exc: BaseException) -> bool:
    """Did a response arrive (HTTP 200) whose body or stream event could not be decoded?

    LiteLLM reports such a body as a 500 (``InternalServerError`` or ``APIConnectionError``) with
    the JSON decode error in the cause chain and no HTTP error response anywhere in it.
    """
    chain = _chain(exc)
    if any(_is_http_status_error(e) for e in chain):
        return False  # an error status came, its body merely failed to parse: keep the status
    return any(isinstance(e, json.JSONDecodeError) for e in chain)


def _mid_stream_original(exc: BaseException) -> BaseException | None:
    """The provider error LiteLLM's ``MidStreamFallbackError`` wraps (its own status is 503 or
    the original's; the class says nothing about what went wrong)."""
    from litellm.exceptions import MidStreamFallbackError

    if isinstance(exc, MidStreamFallbackError):
        original = exc.original_exception
        if isinstance(original, BaseException) and original is not exc:
            return original
    return None


def _broken_after_start(exc: BaseException) -> bool:
    """A LiteLLM ``APIConnectionError`` wrapping a ``MidStreamFallbackError``: the Router's stream
    broke after its 200 (LiteLLM's 500 on it was never sent by the provider)."""
    import litellm
    from litellm.exceptions import MidStreamFallbackError

    if not isinstance(exc, litellm.APIConnectionError):
        return False
    wrapped = getattr(exc, "original_exception", None)
    return isinstance(wrapped, MidStreamFallbackError) or any(
        isinstance(e, MidStreamFallbackError) for e in _chain(exc)
    )


def answered_with_status(exc: BaseException) -> bool:
    """Did an HTTP response with a status reach us (not a status LiteLLM made up for a reset,
    a refused connection or a timeout)?"""
    for e in _chain(exc):
        name = type(e).__name__
        module = type(e).__module__.split(".")[0]
        if module == "httpx" and name == "HTTPStatusError":
            return True
        if module in ("httpx", "aiohttp", "httpcore") or isinstance(e, OSError | TimeoutError):
            return False
        if module == "openai" and name in ("APIConnectionError", "APITimeoutError"):
            return False
    return True


def classify(exc: BaseException) -> Failure:
    """Classify ``exc`` into one :class:`Failure` (class, status, message, Retry-After).

    The message is redacted here, where provider text enters the plugin's records: registered
    secrets (the routers' API keys) and key-shaped tokens never reach a report, an event or an
    error built from it.
    """
    if isinstance(exc, StreamInterruptedError):
        return classify(exc.cause)
    scrub_exception(exc)
    original = _mid_stream_original(exc)
    if original is not None:
        return _classify_mid_stream(exc, original)
    message = _message_of(exc)
    if not isinstance(exc, ResilienceError) and raised_before_sending(exc):
        if _MISSING_CREDENTIALS_RE.search(message):
            err = ConfigError("api_key", f"the deployment has no credentials ({message}); set its api_key")
            err.__cause__ = exc
            return Failure(ErrorClass.BAD_REQUEST, None, str(err), None, err)
        return Failure(ErrorClass.BAD_REQUEST, None, f"rejected before sending: {message}", None, exc)
    status = _wire_status(exc, _status_of(exc))
    error_class = _class_of(exc, status, message)
    if broken_body(exc):
        # A 200 whose body could not be decoded: a broken response, not a server error, and the
        # 500 is LiteLLM's label, not what the provider sent.
        error_class, status = ErrorClass.CONNECTION, None
    if status is not None and not answered_with_status(exc):
        status = None  # LiteLLM labels a reset or a refused connection 500: no HTTP answer came
    if status is not None and _broken_after_start(exc):
        status = None  # a stream that broke after its 200 (the Router's wrapping of a direct one)
    retry_after = retry_after_of(exc) if error_class in (ErrorClass.RATE_LIMIT, ErrorClass.SERVER) else None
    return Failure(error_class, status, message, retry_after, exc)


def _classify_mid_stream(exc: BaseException, original: BaseException) -> Failure:
    """A ``MidStreamFallbackError`` is classified by the error it wraps (a cut, an undecodable
    event, a provider error event, a context overflow), keeping ``exc`` as the exception."""
    import litellm

    inner = classify(original)
    status = inner.status
    if isinstance(original, litellm.APIConnectionError):
        # The stream had started with a 200 and then broke (cut, undecodable event, ended early):
        # LiteLLM's APIConnectionError always says 500, which the provider never sent.
        status = None
    return Failure(inner.error_class, status, inner.message, inner.retry_after, exc)
