"""Issue #13 item 7: a broken response is reported as what happened on the wire. An undecodable
body or stream event of a 200, a stream cut or a stream that ends early is class ``connection``
with no HTTP status (LiteLLM's 500 is made up), while a status the provider really sent is kept.
``MidStreamFallbackError`` is classified by the error it wraps."""

from __future__ import annotations

import json

import httpx
import litellm
import openai
import pytest
from litellm.exceptions import MidStreamFallbackError

from llm_resilience_plugin import ErrorClass, StreamInterruptedError
from llm_resilience_plugin._engine.taxonomy import broken_body, classify

REQ = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")


def resp(status: int) -> httpx.Response:
    return httpx.Response(status, request=REQ)


def decode_error() -> json.JSONDecodeError:
    try:
        json.loads('{"choices": [')
    except json.JSONDecodeError as e:
        return e
    raise AssertionError("unreachable")


def caused(exc: BaseException, cause: BaseException) -> BaseException:
    exc.__cause__ = cause
    return exc


def conn(msg: str = "OpenAIException - Expecting value", cause: BaseException | None = None) -> BaseException:
    e = litellm.APIConnectionError(message=msg, model="m", llm_provider="openai")
    return caused(e, cause) if cause is not None else e


def mid_stream(original: BaseException | None, generated: str = "Hello ") -> MidStreamFallbackError:
    return MidStreamFallbackError(
        message=str(original),
        model="m",
        llm_provider="openai",
        original_exception=original,  # type: ignore[arg-type]
        generated_content=generated,
        is_pre_first_chunk=not generated,
    )


def status_error(cls: type, status: int, msg: str = "boom") -> BaseException:
    """A LiteLLM error built from a real HTTP error response (httpx's error in its cause chain)."""
    real = httpx.HTTPStatusError(msg, request=REQ, response=resp(status))
    return caused(cls(message=msg, model="m", llm_provider="openai", response=resp(status)), real)


@pytest.mark.parametrize(
    "original",
    [
        conn(cause=decode_error()),  # an SSE event that is not JSON
        conn("AnthropicException - Stream ended before a finish_reason was received"),
        conn("OpenAIException - Connection error.", cause=httpx.ReadError("payload not completed")),
        conn("AnthropicException - Response payload is not completed", cause=httpx.ReadError("cut")),
    ],
    ids=["undecodable-event", "ended-early", "cut-openai", "cut-anthropic"],
)
def test_a_stream_that_broke_after_its_200_is_connection_without_a_status(original: BaseException) -> None:
    exc = mid_stream(original)
    assert exc.status_code == 500  # what LiteLLM says
    f = classify(exc)
    assert (f.error_class, f.status) == (ErrorClass.CONNECTION, None)
    assert f.exception is exc  # the error raised to the caller stays LiteLLM's own
    assert "MidStreamFallbackError" not in f.message  # the provider's error, not the wrapper


def test_a_typed_stream_error_is_classified_by_its_cause() -> None:
    cause = mid_stream(conn(cause=decode_error()))
    err = StreamInterruptedError("stream from a failed", partial_text="Hello ", cause=cause, report=None)
    f = classify(err)
    assert (f.error_class, f.status) == (ErrorClass.CONNECTION, None)


@pytest.mark.parametrize(
    ("original", "cls", "status"),
    [
        (status_error(litellm.InternalServerError, 500), ErrorClass.SERVER, 500),
        (status_error(litellm.BadGatewayError, 502), ErrorClass.SERVER, 502),
        (status_error(litellm.ServiceUnavailableError, 503), ErrorClass.SERVER, 503),
        (
            caused(
                litellm.InternalServerError(message="overloaded_error", model="m", llm_provider="anthropic"),
                httpx.HTTPStatusError("529", request=REQ, response=resp(529)),
            ),
            ErrorClass.SERVER,
            529,
        ),
        (status_error(litellm.RateLimitError, 429), ErrorClass.RATE_LIMIT, 429),
        (
            litellm.ContextWindowExceededError(
                message="prompt is too long", model="m", llm_provider="anthropic"
            ),
            ErrorClass.CONTEXT_WINDOW,
            400,
        ),
        (
            litellm.ContentPolicyViolationError(
                message="Anthropic safeguard refusal (category: x).", model="m", llm_provider="anthropic"
            ),
            ErrorClass.CONTENT_POLICY,
            400,
        ),
    ],
    ids=["500", "502", "503", "529", "429", "context-window", "safeguard-refusal"],
)
def test_a_provider_error_in_a_stream_keeps_its_class_and_real_status(
    original: BaseException, cls: ErrorClass, status: int
) -> None:
    f = classify(mid_stream(original, generated=""))
    assert (f.error_class, f.status) == (cls, status)


def test_a_mid_stream_error_without_an_original_is_classified_as_before() -> None:
    f = classify(mid_stream(None))
    assert (f.error_class, f.status) == (ErrorClass.SERVER, 503)


def test_an_undecodable_200_body_is_connection_without_a_status() -> None:
    """Non-stream: LiteLLM's openai handler raises InternalServerError 500 (its OpenAIError 500
    caused by the decode error); the anthropic one APIConnectionError 500 (its AnthropicError
    still says 200)."""
    openai_side = caused(
        litellm.InternalServerError(
            message="OpenAIException - Expecting value", model="m", llm_provider="openai"
        ),
        caused(openai.APIError("Expecting value", request=REQ, body=None), decode_error()),
    )
    anthropic_side = conn("AnthropicException - Unable to get json response", cause=decode_error())
    for exc in (openai_side, anthropic_side):
        assert broken_body(exc)
        f = classify(exc)
        assert (f.error_class, f.status) == (ErrorClass.CONNECTION, None), exc


def test_an_error_status_whose_body_did_not_parse_keeps_its_status() -> None:
    """A 502 from a proxy with an HTML body: the decode error is in the chain, but so is the real
    HTTP error response, whose status is what the provider sent."""
    real = httpx.HTTPStatusError("bad gateway", request=REQ, response=resp(502))
    exc = caused(
        litellm.BadGatewayError(message="<html>", model="m", llm_provider="openai", response=resp(502)),
        caused(decode_error(), real),
    )
    assert not broken_body(exc)
    f = classify(exc)
    assert (f.error_class, f.status) == (ErrorClass.SERVER, 502)
    sdk = caused(openai.InternalServerError("bad gateway", response=resp(502), body=None), decode_error())
    assert not broken_body(sdk) and classify(sdk).status == 502
