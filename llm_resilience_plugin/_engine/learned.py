"""Stream timeouts learned from what a group's streams really do: time to first token and the
longest silence between chunks, so a slow-but-healthy model is not cut and a stalled one is not
waited on for the whole attempt timeout."""

from __future__ import annotations

import threading
from collections import deque

# Samples before the learned value replaces the static default, how many are kept, how far above
# the observed p95 the timeout sits, and the smallest timeout ever learned.
MIN_SAMPLES = 20
WINDOW = 200
HEADROOM = 4.0
FLOOR = 1.0


def _p95(values: deque[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


class StreamTimings:
    """One group's recent time-to-first-token and largest inter-chunk gap per stream."""

    def __init__(self) -> None:
        self._ttft: deque[float] = deque(maxlen=WINDOW)
        self._gaps: deque[float] = deque(maxlen=WINDOW)
        self._lock = threading.Lock()

    def observe_ttft(self, seconds: float) -> None:
        """A stream's first chunk arrived after ``seconds``."""
        with self._lock:
            self._ttft.append(seconds)

    def observe_gap(self, seconds: float) -> None:
        """A completed stream's longest silence between two chunks."""
        with self._lock:
            self._gaps.append(seconds)

    def first_chunk(self, default: float, cap: float) -> float:
        """The first-chunk timeout: ``default`` until enough samples, then HEADROOM x the p95 of
        observed TTFT (at least FLOOR, at most ``cap``)."""
        return self._learned(self._ttft, default, cap)

    def idle(self, default: float, cap: float) -> float:
        """The idle timeout between chunks, learned the same way from the largest gaps."""
        return self._learned(self._gaps, default, cap)

    def _learned(self, values: deque[float], default: float, cap: float) -> float:
        with self._lock:
            if len(values) < MIN_SAMPLES:
                return min(default, cap)
            p95 = _p95(values)
        return min(cap, max(FLOOR, HEADROOM * p95))
