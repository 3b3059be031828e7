"""The error taxonomy: each exception LiteLLM, openai and httpx raise maps to one class."""

from __future__ import annotations

import time

import httpx
import litellm
import openai
import pytest
from litellm.types.router import RouterRateLimitError

from llm_resilience_plugin import BudgetExceededError, CircuitOpenError, ErrorClass
from llm_resilience_plugin._engine.taxonomy import classify, parse_retry_after

REQ = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")


def resp(status: int, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, headers=headers or {}, request=REQ)


def L(cls, msg="boom", status=None, headers=None, **kw):
    args = {"message": msg, "model": "gpt-4o-mini", "llm_provider": "openai", **kw}
    if status is not None:
        args["response"] = resp(status, headers)
    return cls(**args)


@pytest.mark.parametrize(
    ("exc", "cls", "status"),
    [
        (L(litellm.RateLimitError, status=429), ErrorClass.RATE_LIMIT, 429),
        (L(litellm.RateLimitError, "You exceeded your current quota", status=429), ErrorClass.AUTH, 429),
        (L(litellm.InternalServerError, "oops", status=500), ErrorClass.SERVER, 500),
        (L(litellm.InternalServerError, "Connection error.", status=500), ErrorClass.CONNECTION, 500),
        (L(litellm.BadGatewayError, status=502), ErrorClass.SERVER, 502),
        (L(litellm.ServiceUnavailableError, status=503), ErrorClass.SERVER, 503),
        (L(litellm.AuthenticationError, status=401), ErrorClass.AUTH, 401),
        (L(litellm.PermissionDeniedError, status=403), ErrorClass.AUTH, 403),
        (L(litellm.NotFoundError, status=404), ErrorClass.BAD_REQUEST, 404),
        (L(litellm.BadRequestError, "missing field", status=400), ErrorClass.BAD_REQUEST, 400),
        (L(litellm.ContextWindowExceededError, "too long", status=400), ErrorClass.CONTEXT_WINDOW, 400),
        (
            L(litellm.BadRequestError, "This model's maximum context length is 8192 tokens", status=400),
            ErrorClass.CONTEXT_WINDOW,
            400,
        ),
        (L(litellm.ContentPolicyViolationError, status=400), ErrorClass.CONTENT_POLICY, 400),
        (
            L(litellm.BadRequestError, "filtered by Azure OpenAI's content management policy", status=400),
            ErrorClass.CONTENT_POLICY,
            400,
        ),
        (litellm.Timeout(message="slow", model="m", llm_provider="openai"), ErrorClass.TIMEOUT, 408),
        (
            litellm.APIConnectionError(message="reset", model="m", llm_provider="openai"),
            ErrorClass.CONNECTION,
            500,
        ),
        (openai.APITimeoutError(request=REQ), ErrorClass.TIMEOUT, None),
        (openai.APIConnectionError(request=REQ), ErrorClass.CONNECTION, None),
        (httpx.ConnectError("refused"), ErrorClass.CONNECTION, None),
        (httpx.ReadTimeout("slow"), ErrorClass.TIMEOUT, None),
        (ConnectionResetError("reset by peer"), ErrorClass.CONNECTION, None),
        (TimeoutError(), ErrorClass.TIMEOUT, None),
        (
            RouterRateLimitError(model="g", cooldown_time=5, enable_pre_call_checks=False, cooldown_list=[]),
            ErrorClass.CIRCUIT_OPEN,
            429,
        ),
        (CircuitOpenError("g", ["a"]), ErrorClass.CIRCUIT_OPEN, None),
        (BudgetExceededError("daily", 1.0, 0.5, 1.2), ErrorClass.BUDGET, None),
        (KeyError("bug"), ErrorClass.UNKNOWN, None),
    ],
)
def test_classification(exc: BaseException, cls: ErrorClass, status: int | None) -> None:
    f = classify(exc)
    assert f.error_class is cls, f
    assert f.status == status
    assert f.exception is exc


def test_529_overloaded_is_server() -> None:
    exc = openai.APIStatusError("overloaded", response=resp(529), body=None)
    assert classify(exc).error_class is ErrorClass.SERVER


def test_retry_after_header_seconds_and_ms() -> None:
    f = classify(L(litellm.RateLimitError, status=429, headers={"retry-after": "7"}))
    assert f.retry_after == 7.0
    f = classify(L(litellm.RateLimitError, status=429, headers={"retry-after-ms": "1500"}))
    assert f.retry_after == 1.5


def test_parse_retry_after_http_date() -> None:
    now = 1_700_000_000.0
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(now + 42))
    assert parse_retry_after(date, now=now) == pytest.approx(42, abs=1)
    assert parse_retry_after("nonsense") is None
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after(None) is None


def test_litellm_suffix_is_trimmed_from_messages() -> None:
    msg = "boom\n\nLiteLLM: model group 'g' failed with the error above. No fallback was attempted."
    assert classify(L(litellm.InternalServerError, msg, status=500)).message.endswith("boom")


def test_all_routes_failed_is_also_the_providers_error_class() -> None:
    """Drop-in: ``except litellm.RateLimitError`` written for a plain Router catches the plugin's
    final error; a non-provider root cause leaves it a plain AllRoutesFailedError."""
    from llm_resilience_plugin.errors import AllRoutesFailedError, DeadlineExceededError, as_provider_error
    from llm_resilience_plugin.events import CallReport

    report = CallReport(call_id="c", requested_group="g", stream=False, started_at=0.0)
    root = L(litellm.RateLimitError, "slow down", status=429)
    err = as_provider_error(AllRoutesFailedError("all routes failed", [], report), root)
    assert isinstance(err, litellm.RateLimitError) and isinstance(err, openai.RateLimitError)
    assert isinstance(err, AllRoutesFailedError) and err.status_code == 429 and err.report is report
    assert str(err) == "all routes failed" and err.llm_provider == root.llm_provider
    late = as_provider_error(DeadlineExceededError("late", [], report), L(litellm.Timeout, "t", status=408))
    assert isinstance(late, TimeoutError) and isinstance(late, litellm.Timeout)
    plain = as_provider_error(AllRoutesFailedError("x", [], report), RuntimeError("boom"))
    assert type(plain) is AllRoutesFailedError


def test_budget_error_raised_without_a_ledger_key_has_none_for_the_key_fields() -> None:
    err = BudgetExceededError("daily", 1.0, 0.5, 1.2)
    assert (err.budget_name, err.scope, err.window, err.settled, err.in_flight) == (None,) * 5
    assert "exceeded" in str(err) and err.limit == 1.2
