"""Hedged requests: when to send a second request, and how many may be sent.

The delay is fixed or learned from the group's recent p95 latency (time to first chunk for
streams); a token bucket keeps hedges within ``max_extra_fraction`` of calls.
"""

from __future__ import annotations

import threading
from collections import deque

from llm_resilience_plugin.policy import HedgePolicy


class HedgeState:
    """Per model group: recent latencies and the hedge allowance."""

    def __init__(self, policy: HedgePolicy, window: int = 200) -> None:
        self.policy = policy
        self._samples: deque[float] = deque(maxlen=window)
        self._tokens = 1.0
        self._lock = threading.Lock()
        self.sent = 0
        self.calls = 0

    def observe(self, latency_s: float) -> None:
        """Record a successful attempt's latency (TTFT for streams)."""
        with self._lock:
            self._samples.append(latency_s)

    def delay(self) -> float:
        """Seconds to wait before hedging."""
        p = self.policy
        if isinstance(p.delay, int | float):
            return max(p.min_delay, float(p.delay))
        with self._lock:
            samples = sorted(self._samples)
        if len(samples) < p.min_samples:
            return max(p.min_delay, p.initial_delay)
        return max(p.min_delay, samples[min(len(samples) - 1, int(0.95 * len(samples)))])

    def on_call(self) -> None:
        """Each call earns ``max_extra_fraction`` of a hedge (capped, so bursts stay bounded)."""
        with self._lock:
            self.calls += 1
            self._tokens = min(10.0, self._tokens + self.policy.max_extra_fraction)

    def try_take(self) -> bool:
        """Spend one hedge if the allowance has one."""
        with self._lock:
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                self.sent += 1
                return True
            return False
