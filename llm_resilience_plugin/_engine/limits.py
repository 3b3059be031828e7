"""A deployment's rate limits: configured (LiteLLM's ``rpm``/``tpm``, the policy's ``pacing.limits``)
and stated by the provider in its rate-limit headers (OpenAI/Azure ``x-ratelimit-*``, Anthropic
``anthropic-ratelimit-*``), read into one shape the pace uses (see :mod:`._engine.pacing`)."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Limits:
    """A deployment's limits in requests and tokens per second (None: not limited that way),
    with where each comes from (``config``, ``headers``, ``learned``)."""

    requests_per_s: float | None = None
    request_burst: float = 1.0
    tokens_per_s: float | None = None
    token_burst: float = 0.0
    source: str = "none"


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def parse_duration(value: Any) -> float | None:
    """Seconds in an ``x-ratelimit-reset-*`` value: ``"1s"``, ``"120ms"``, ``"6m0s"``, ``"0.5"``."""
    if value is None:
        return None
    text = str(value).strip().lower()
    if not text:
        return None
    try:
        seconds = float(text)
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    except ValueError:
        pass
    total, matched = 0.0, 0
    for number, unit in _DURATION.findall(text[:32]):
        matched += 1
        total += float(number) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[unit]
    return total if matched else None


def _reset_seconds(value: Any, now_wall: float) -> float | None:
    """A reset that is a duration (OpenAI, Azure) or an RFC 3339 time (Anthropic)."""
    seconds = parse_duration(value)
    if seconds is not None:
        return seconds
    text = str(value).strip()
    if "T" in text[:32]:
        from datetime import datetime

        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            return None
        return max(0.0, when.timestamp() - now_wall)
    return None


@dataclass(frozen=True, slots=True)
class HeaderLimit:
    """What a provider's rate-limit headers said of one dimension (requests or tokens)."""

    limit: float
    remaining: float
    reset_s: float | None

    def rate(self) -> float | None:
        """The refill rate these values imply: what was used comes back over the reset time
        (``remaining`` is rounded down: up to one request less was used, so count one less - never
        faster than the truth); None when the reading is too coarse to tell."""
        if self.limit <= 0:
            return None
        used = self.limit - self.remaining
        # Only a reading with enough used is precise (a rounded-down remaining of a nearly full
        # bucket over a reset of a few milliseconds says little).
        if self.reset_s and self.reset_s > 0 and used >= max(3.0, 0.5 * self.limit):
            return (used - 1.0) / self.reset_s
        return None

    def most(self) -> float | None:
        """The fastest refill these values allow (``remaining`` rounded down: all of ``used`` may
        have been used): a rate above it is proved too high; None when there is nothing to tell."""
        used = self.limit - self.remaining
        if self.limit <= 0 or not self.reset_s or self.reset_s <= 0 or used < 1.0:
            return None
        return used / self.reset_s


_PREFIXES = ("", "llm_provider-")
# The keys whose presence says an answer states a limit (checked before any parsing).
RATE_LIMIT_KEYS = tuple(
    prefix + name
    for prefix in _PREFIXES
    for name in (
        "x-ratelimit-remaining-requests",
        "x-ratelimit-remaining-tokens",
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-tokens-remaining",
    )
)


def _get(headers: Mapping[str, Any], name: str) -> Any:
    for prefix in _PREFIXES:
        value = headers.get(prefix + name)
        if value is not None:
            return value
    return None


def _number(value: Any) -> float | None:
    try:
        n = float(str(value).strip())
    except (TypeError, ValueError):
        return None
    return n if math.isfinite(n) and n >= 0 else None


def header_limits(
    headers: Mapping[str, Any] | None, now_wall: float | None = None
) -> tuple[HeaderLimit | None, HeaderLimit | None]:
    """(requests, tokens) from OpenAI/Azure ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``
    or Anthropic ``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`` headers (also
    with LiteLLM's ``llm_provider-`` prefix); None for a dimension they do not give."""
    if not headers:
        return None, None
    try:
        lowered = {str(k).lower(): v for k, v in dict(headers).items()}
    except (TypeError, ValueError):
        return None, None
    now = time.time() if now_wall is None else now_wall
    out: list[HeaderLimit | None] = []
    for dim in ("requests", "tokens"):
        forms = (
            (f"x-ratelimit-limit-{dim}", f"x-ratelimit-remaining-{dim}", f"x-ratelimit-reset-{dim}"),
            (
                f"anthropic-ratelimit-{dim}-limit",
                f"anthropic-ratelimit-{dim}-remaining",
                f"anthropic-ratelimit-{dim}-reset",
            ),
        )
        found = None
        for limit_key, remaining_key, reset_key in forms:
            limit = _number(_get(lowered, limit_key))
            remaining = _number(_get(lowered, remaining_key))
            if limit is None or remaining is None:
                continue
            reset_value = _get(lowered, reset_key)
            found = HeaderLimit(
                limit,
                min(limit, remaining),
                _reset_seconds(reset_value, now) if reset_value is not None else None,
            )
            break
        out.append(found)
    return out[0], out[1]


def configured_limits(params: Mapping[str, Any], override: Mapping[str, Any] | None = None) -> Limits | None:
    """A deployment's configured limits: the policy's ``pacing.limits`` entry over LiteLLM's
    ``rpm``/``tpm`` in ``litellm_params`` (per minute; bursts default to one second's worth)."""
    rpm = _positive((override or {}).get("rpm")) or _positive(params.get("rpm"))
    tpm = _positive((override or {}).get("tpm")) or _positive(params.get("tpm"))
    if rpm is None and tpm is None:
        return None
    rps = rpm / 60.0 if rpm else None
    tps = tpm / 60.0 if tpm else None
    burst = _positive((override or {}).get("burst"))
    return Limits(
        rps,
        burst or (max(1.0, rps) if rps else 1.0),
        tps,
        # The token bucket holds as many seconds of tokens as the request bucket does of requests.
        max(1.0, tps or 0.0) * ((burst / rps) if burst and rps else 1.0) if tps else 0.0,
        "config",
    )


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 < value < math.inf else None
