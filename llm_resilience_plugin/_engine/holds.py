"""Who may wait out a ``Retry-After`` hold on the group asked for, and who fails over at once.

A hold means the provider is at its rate limit. When it lifts, a deployment takes about as many
requests as it had accepted when it started refusing (the ones it answers while held), not the
whole queue that built up behind it: calls beyond that would meet another 429 and wait again. So
a held deployment admits at most that many waiting calls per hold (at least one), and a call
waits out at most one hold per group; the overflow fails over at once when the group has a
fallback.
"""

from __future__ import annotations

import threading
from collections import deque

# Answer times kept per deployment (enough for the throughput of any realistic hold window).
HISTORY = 256


class HoldQueue:
    """Per deployment: recent answer times, when its current hold began, and how many calls
    wait for that hold."""

    def __init__(self) -> None:
        self._answers: dict[str, deque[float]] = {}
        self._held: dict[str, tuple[float, float]] = {}  # deployment -> (hold start, hold end)
        self._waiting: dict[str, tuple[float | None, int]] = {}  # deployment -> (hold start, waiting)
        self._lock = threading.Lock()

    def answered(self, dep: str, now: float) -> None:
        """``dep`` answered a request at ``now`` (wall clock)."""
        times = self._answers.get(dep)
        if times is None:
            times = self._answers.setdefault(dep, deque(maxlen=HISTORY))
        times.append(now)

    def held(self, dep: str, now: float, seconds: float) -> None:
        """``dep`` asked for ``seconds`` of rest at ``now``; a hold still running keeps its start."""
        with self._lock:
            start, end = self._held.get(dep, (now, 0.0))
            self._held[dep] = (start if now < end else now, max(end, now + seconds))

    def capacity(self, dep: str) -> int:
        """Calls ``dep`` is likely to take when its hold lifts: the answers it gave since the
        hold began (requests it had accepted before refusing), at least one."""
        times = self._answers.get(dep)
        since = self._held.get(dep, (0.0, 0.0))[0]
        if not times:
            return 1
        return max(1, sum(1 for t in reversed(times) if t >= since))

    def try_wait(self, holds: list[tuple[str, float]], now: float) -> float | None:
        """Join the queue of the held deployment (``(id, seconds held)`` each) that frees first
        and still has room: the seconds to wait, or None when every queue is full."""
        with self._lock:
            for dep, held in sorted(holds, key=lambda h: h[1]):
                # One hold, one queue: a hold extended by more 429s keeps its start, and its queue.
                start = self._held.get(dep, (round(now + held, 3), 0.0))[0]
                known, count = self._waiting.get(dep, (None, 0))
                if known != start:
                    count = 0
                if count < self.capacity(dep):
                    self._waiting[dep] = (start, count + 1)
                    return held
        return None
