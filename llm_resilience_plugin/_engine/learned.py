"""Timeouts learned from what a group's calls really do: a stream's time to first token and its
longest silence between chunks, a non-stream call's time to its whole answer, so a
slow-but-healthy model is not cut and a stalled one is not waited on for the whole attempt
timeout."""

from __future__ import annotations

import threading
from collections import deque

# Samples before the learned value replaces the static default, how many are kept, how far above
# the observed p95 the timeout sits, and the smallest timeout ever learned.
MIN_SAMPLES = 20
WINDOW = 200
HEADROOM = 4.0
FLOOR = 1.0
RECOMPUTE = 10  # non-stream answers between two computations of their p95


def _p95(values: deque[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


class StreamTimings:
    """One group's recent time-to-first-token and largest inter-chunk gap per stream."""

    def __init__(self) -> None:
        self._ttft: deque[float] = deque(maxlen=WINDOW)
        self._gaps: deque[float] = deque(maxlen=WINDOW)
        self._answers: deque[float] = deque(maxlen=WINDOW)
        # (samples seen when computed, p95, the cap last asked with, the limit for that cap)
        self._answer_limit: tuple[int, float, float, float] | None = None
        self._seen = 0
        self._lock = threading.Lock()

    def observe_ttft(self, seconds: float) -> None:
        """A stream's first chunk arrived after ``seconds``."""
        with self._lock:
            self._ttft.append(seconds)

    def observe_gap(self, seconds: float) -> None:
        """A completed stream's longest silence between two chunks."""
        with self._lock:
            self._gaps.append(seconds)

    def observe_answer(self, seconds: float) -> None:
        """A non-stream attempt's whole answer arrived after ``seconds``."""
        with self._lock:
            self._answers.append(seconds)
            self._seen += 1

    def answer(self, cap: float) -> float:
        """A non-stream attempt's timeout: ``cap`` until enough samples, then HEADROOM x the p95
        of observed answer times (at least FLOOR, at most ``cap``). The p95 is recomputed every
        RECOMPUTE answers, not on every call."""
        known = self._answer_limit
        if known is not None and known[2] == cap and self._seen - known[0] < RECOMPUTE:
            return known[3]  # the common case: the value kept for this cap
        if known is None or self._seen - known[0] >= RECOMPUTE:
            with self._lock:
                if len(self._answers) < MIN_SAMPLES:
                    return cap
                seen, p95 = self._seen, _p95(self._answers)
        else:
            seen, p95 = known[0], known[1]
        value = min(cap, max(FLOOR, HEADROOM * p95))
        self._answer_limit = (seen, p95, cap, value)
        return value

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
