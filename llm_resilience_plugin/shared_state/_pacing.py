"""A deployment's rate limit shared by the fleet on Redis: one atomic script per admission takes
a request slot and the tokens together from buckets every worker shares (Redis's clock), so N
workers together send no more than the limit (LiteLLM counts ``rpm``/``tpm`` per process).

While Redis cannot answer, ``pacing.on_shared_state_error`` decides: ``local_share`` paces this
process alone at its share of the limit (the limit over the workers seen in the last 10 s), or
``fail_closed`` sends nothing to the deployment until Redis is back.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import TYPE_CHECKING

from llm_resilience_plugin._lua import read_lua
from llm_resilience_plugin.shared_state._common import KEY_TTL, SharedStateUnavailable, text

if TYPE_CHECKING:
    from llm_resilience_plugin.shared_state._connection import RedisSharedState

PACE_SCRIPTS = {
    "pace": read_lua("llm_resilience_plugin.shared_state", "pace.lua"),
    "pace_refund": read_lua("llm_resilience_plugin.shared_state", "pace_refund.lua"),
}


class _LocalShare:
    """This process's share of the limit while Redis is away: a plain token bucket pair. It starts
    empty: the fleet may just have spent the provider's burst, so the share is paced from the first
    request on (at its rate), never sent as a burst on top of the fleet's."""

    def __init__(self) -> None:
        self.level: float | None = None
        self.tlevel: float | None = None
        self.at = time.monotonic()

    def take(
        self, rate: float, burst: float, trate: float | None, tburst: float, tokens: float, reserve: float
    ) -> float:
        now = time.monotonic()
        dt, self.at = now - self.at, now
        self.level = 0.0 if self.level is None else min(burst, self.level + dt * rate)
        self.tlevel = 0.0 if self.tlevel is None else min(tburst, self.tlevel + dt * (trate or 0.0))
        wait = 0.0
        need = 1.0 + reserve * max(0.0, burst - 1.0)
        if rate > 0 and self.level < need:
            wait = (need - self.level) / rate
        tneed = min(tokens, tburst)
        tneed += reserve * max(0.0, tburst - tneed)
        if trate and tokens > 0 and self.tlevel < tneed:
            wait = max(wait, (tneed - self.tlevel) / trate)
        if wait > 0:
            return wait
        if rate > 0:
            self.level -= 1
        if trate and tokens > 0:
            self.tlevel -= tokens
        return 0.0


class RedisPace:
    """The fleet's buckets for one deployment (the engine's ``SharedPace``)."""

    def __init__(self, shared: RedisSharedState, key: str, *, fail_closed: bool = False) -> None:
        self.shared = shared
        self.key = key
        self.fail_closed = fail_closed
        self.worker = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.workers = 1  # seen at the last answer (the local share divides the limit by it)
        self.local = _LocalShare()
        self._mu = threading.Lock()
        self._tburst = 0.0
        shared.load_scripts(PACE_SCRIPTS)

    def take(
        self,
        requests_per_s: float,
        burst: float,
        tokens_per_s: float | None,
        tburst: float,
        tokens: float,
        reserve: float = 0.0,
    ) -> float | None:
        """0.0 when a slot (and ``tokens``) was taken fleet-wide, ``reserve`` of each burst left to
        higher tiers; else the seconds until one fits; None while Redis cannot answer and the
        policy is fail-closed."""
        self._tburst = tburst
        args = [repr(requests_per_s), repr(burst), repr(tokens_per_s or 0.0), repr(tburst), repr(tokens)]
        try:
            reply = self.shared.run(
                "pace",
                [f"{self.key}:requests", f"{self.key}:tokens", f"{self.key}:workers"],
                [*args, KEY_TTL, self.worker, repr(reserve)],
            )
        except SharedStateUnavailable:
            if self.fail_closed:
                return None
            share = 1.0 / max(1, self.workers)
            with self._mu:
                return self.local.take(
                    requests_per_s * share,
                    max(1.0, burst * share),
                    (tokens_per_s or 0.0) * share if tokens_per_s else None,
                    max(1.0, tburst * share),
                    tokens,
                    reserve,
                )
        self.workers = max(1, int(float(text(reply[1]))))
        if self.local.level is not None:
            with self._mu:
                self.local = _LocalShare()  # Redis is back: a next outage starts its share empty
        return float(text(reply[0]))

    def refund(self, tokens: float) -> None:
        """Give back reserved tokens not used (or take more, when negative); lost while Redis is away."""
        if not tokens:
            return
        try:
            self.shared.run(
                "pace_refund", [f"{self.key}:tokens"], [repr(tokens), repr(self._tburst), KEY_TTL]
            )
        except SharedStateUnavailable:
            pass
