"""An in-flight limit per deployment that follows latency (Netflix concurrency-limits' Gradient2
shape): while answers come back as fast as they usually do the limit grows by about its square
root; when they slow down past ``tolerance`` times the long-run latency it shrinks in proportion,
so a slowing provider is not piled onto. Opt-in per group or deployment (``pacing.concurrency``);
calls over the limit wait in the deployment's priority queue like calls over its rate."""

from __future__ import annotations

import math
import threading

# The long-run latency averages this many answers (the first ones warm it up faster); the short
# one this many, so one slow answer does not shrink the limit on its own.
LONG_WINDOW = 600
SHORT_WINDOW = 10
# How much of each new estimate the limit takes (the rest is its old value).
SMOOTHING = 0.2


class Gradient:
    """One deployment's adaptive in-flight limit (thread-safe)."""

    def __init__(self, initial: int, minimum: int, maximum: int, tolerance: float) -> None:
        self.limit = float(min(max(initial, minimum), maximum))
        self.minimum = float(minimum)
        self.maximum = float(maximum)
        self.tolerance = tolerance
        self.long_rtt: float | None = None
        self.short_rtt: float | None = None
        self.samples = 0
        self._lock = threading.Lock()

    def allows(self, inflight: int) -> bool:
        """May one more request go while ``inflight`` are out?"""
        return inflight < max(1, int(self.limit))

    def sample(self, rtt: float, inflight: int) -> None:
        """An answer after ``rtt`` seconds with ``inflight`` requests out: update the limit."""
        if not math.isfinite(rtt) or rtt <= 0:
            return
        with self._lock:
            self.samples += 1
            n = self.samples
            long_alpha = 2.0 / (min(n, LONG_WINDOW) + 1)
            short_alpha = 2.0 / (min(n, SHORT_WINDOW) + 1)
            self.long_rtt = (
                rtt if self.long_rtt is None else self.long_rtt + long_alpha * (rtt - self.long_rtt)
            )
            self.short_rtt = (
                rtt if self.short_rtt is None else self.short_rtt + short_alpha * (rtt - self.short_rtt)
            )
            long_rtt, short_rtt = self.long_rtt, self.short_rtt
            if long_rtt / short_rtt > 2.0:
                # Latency fell well below the long-run figure (the provider recovered): let the
                # long-run one follow sooner, or the limit would be judged against a slow past.
                self.long_rtt = long_rtt = long_rtt * 0.95
            if inflight < self.limit / 2:
                return  # the limit is not what holds calls back: nothing to learn about it
            gradient = max(0.5, min(1.0, self.tolerance * long_rtt / short_rtt))
            estimate = self.limit * gradient + math.sqrt(self.limit)
            limit = self.limit * (1.0 - SMOOTHING) + estimate * SMOOTHING
            self.limit = min(self.maximum, max(self.minimum, limit))

    def wait_hint(self) -> float:
        """A waiter's sleep while the limit binds (it is woken as soon as a request ends)."""
        rtt = self.short_rtt or self.long_rtt
        return min(1.0, max(0.01, rtt / max(1.0, self.limit))) if rtt else 0.05

    def snapshot(self) -> dict[str, float | None]:
        return {
            "limit": round(self.limit, 2),
            "long_rtt_s": round(self.long_rtt, 4) if self.long_rtt is not None else None,
            "short_rtt_s": round(self.short_rtt, 4) if self.short_rtt is not None else None,
        }
