"""Redaction cannot stall: every scan is linear (no backtracking), an exception's text is scrubbed
once and bounded, and the registry adds and forgets secrets in O(1)."""

from __future__ import annotations

import random
import string
import time
from collections.abc import Callable

import pytest

from llm_resilience_plugin._engine import taxonomy
from llm_resilience_plugin._redaction import (
    MAX_FIELD_CHARS,
    REDACTED,
    SECRETS,
    SecretHold,
    mask_params,
    mask_url,
    scrub,
    scrub_field,
)

MB = 1_000_000


def _best(fn: Callable[[], object], runs: int = 3) -> float:
    """The fastest of ``runs`` timings (the machine is shared: the minimum is the cost)."""
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _keys(n: int, seed: int = 7) -> list[str]:
    rnd = random.Random(seed)
    return ["sk-proj-" + "".join(rnd.choices(string.ascii_letters + string.digits, k=40)) for _ in range(n)]


def test_scrubbing_one_megabyte_takes_under_50_ms() -> None:
    hold = SecretHold(_keys(20))
    try:
        rnd = random.Random(1)
        prose = "".join(rnd.choices(string.ascii_letters + " ", k=MB))
        echo = '{"error": {"message": "' + "The input was: hello world, " * (MB // 28) + '"}}'
        for text in (prose, echo, "x" * MB):
            assert _best(lambda text=text: scrub(text)) < 0.050
    finally:
        hold.release()


@pytest.mark.parametrize(
    "unit", ["sk-", "k-", "://", "Bearer", "?key=", "&", "=", "AKIA", "://a@"], ids=lambda u: repr(u)
)
def test_no_input_makes_a_scan_superlinear(unit: str) -> None:
    # A backtracking pattern takes seconds to minutes here (32 kB of letters took 0.5 s before).
    text = (unit * (MB // len(unit)))[:MB]
    assert _best(lambda: scrub(text)) < 0.25


def test_the_old_catastrophic_input_is_instant() -> None:
    assert _best(lambda: scrub("x" * 32_000)) < 0.005


def test_masks_still_mask() -> None:
    assert scrub("auth: Bearer abcdefghijkl and sk-abcdefgh1234") == "auth: Bearer *** and sk-***"
    assert scrub("key AKIAABCDEFGHIJKLMNOP") == "key AKI***"
    assert scrub("xsk-abcdefghij, Bearerish token") == "xsk-abcdefghij, Bearerish token"  # no boundary
    assert mask_url("https://u:p@host/x?key=abc&foo=1&sig=zz") == "https://***@host/x?key=***&foo=1&sig=***"
    assert mask_url("see http://h/p?api-key=Z9&code=42#f") == "see http://h/p?api-key=***&code=***#f"


def test_a_field_is_bounded_with_a_marker() -> None:
    out = scrub_field("y" * (MAX_FIELD_CHARS + 500))
    assert out.startswith("y" * MAX_FIELD_CHARS) and out.endswith("[500 more characters not shown]")
    assert scrub_field("short") == "short"


def test_the_registry_adds_in_constant_time_and_forgets_on_release() -> None:
    keys = _keys(1000, seed=11)
    t0 = time.perf_counter()
    holds = [SecretHold([k]) for k in keys]
    scrub("warm the view")
    assert time.perf_counter() - t0 < 0.5  # recompiling every key per add took 52 s
    assert scrub(f"echo {keys[500]} end") == f"echo {REDACTED} end"
    assert _best(lambda: scrub("z" * 100_000)) < 0.25  # 1,000 keys over 100 kB
    shared = SecretHold([keys[0]])  # a second holder of one key
    for hold in holds:
        hold.release()
    hold.release()  # idempotent
    plain = keys[1].removeprefix("sk-proj-")
    assert scrub(f"echo {plain}") == f"echo {plain}"  # forgotten with its last holder
    assert REDACTED in scrub(f"echo {keys[0]}")  # still held
    shared.release()
    assert all(k not in {n[0] for n in SECRETS.needles()} for k in keys)


def test_an_exception_chain_is_scrubbed_once_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    body = "echo " + "q" * 100_000
    calls: list[int] = []
    real = taxonomy.scrub_field

    def counting(text: str) -> str:
        calls.append(len(text))
        return real(text)

    monkeypatch.setattr(taxonomy, "scrub_field", counting)

    class ProviderError(Exception):
        def __init__(self, message: str) -> None:
            super().__init__(message)
            self.message = message
            self.body = {"error": {"message": message, "api_key": "x" * 10}}

    outer = ProviderError(body)
    outer.__cause__ = ProviderError(body)
    taxonomy.scrub_exception(outer)
    assert len(calls) == 1  # one provider body in six places: one scan
    assert len(outer.message) < MAX_FIELD_CHARS + 100 and outer.message.endswith("not shown]")
    assert outer.args[0] == outer.message and outer.body["error"]["api_key"] == REDACTED
    taxonomy.scrub_exception(outer)  # classified again (a retry, a recovery): not scanned again
    assert len(calls) == 1


def test_deployment_params_show_no_credential() -> None:
    shown = mask_params(
        {
            "model": "vertex_ai/gemini",
            "api_base": "https://h/v1?key=AIzaSECRET&alt=sse",
            "extra_headers": {"X-Tenant-Token": "hdr-secret", "X-Trace": "t"},
            "vertex_credentials": '{"private_key": "-----BEGIN"}',
            "aws_access_key_id": "AKIA...",
            "aws_secret_access_key": "s",
            "aws_session_token": "t",
            "aws_region_name": "eu-west-1",
            "max_tokens": 100,
            "input_cost_per_token": 1e-6,
        }
    )
    assert shown == {
        "model": "vertex_ai/gemini",
        "api_base": "https://h/v1?key=***&alt=sse",
        "extra_headers": {"X-Tenant-Token": "***", "X-Trace": "***"},
        "aws_region_name": "eu-west-1",
        "max_tokens": 100,
        "input_cost_per_token": 1e-6,
    }


def test_chaos_never_hands_a_credential_to_the_simulator() -> None:
    from llm_resilience_plugin.testing.chaos._target import simulated_target

    entry = {
        "model_name": "g",
        "litellm_params": {
            "model": "vertex_ai/gemini-1.5-pro",
            "vertex_credentials": '{"private_key": "-----BEGIN PRIVATE KEY-----MIIEv"}',
            "aws_secret_access_key": "aws-secret-value",
            "extra_headers": {"X-Gateway-Token": "hdr-secret"},
            "api_key": "sk-live-real-key",
        },
    }
    t = simulated_target([entry], base_url="http://127.0.0.1:1", prefix="s", primary="g", fallbacks=[])
    params = t.model_list[0]["litellm_params"]
    assert params["api_key"] == "sk-chaos" and params["model"] == "openai/gemini-1.5-pro"
    assert not {"vertex_credentials", "aws_secret_access_key", "extra_headers"} & set(params)
