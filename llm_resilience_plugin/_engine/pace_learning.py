"""How a pace learns a deployment's limit from the provider: its rate-limit headers when it sends
them, else its 429s - the first pace from what it accepted before refusing, then additive increase
and multiplicative decrease (AWS SDK adaptive retry's shape) - and forgets it after a quiet minute;
and the slow start that keeps a burst into an unknown limit from going out at once.
The mixin of :class:`._engine.pacing.Pace`; every attribute is the pace's own."""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from llm_resilience_plugin._engine.clock import Clock
from llm_resilience_plugin._engine.limits import RATE_LIMIT_KEYS, HeaderLimit, Limits, header_limits

if TYPE_CHECKING:
    from llm_resilience_plugin._engine.pacing import Grant

# AIMD when the limit is learned from 429s alone (AWS SDK adaptive retry uses beta = 0.7).
DECREASE = 0.7
# Additive increase per second without a 429 while the pace binds: this share of the rate, at least
# one request a second.
INCREASE_SHARE = 0.05
# A 429 without Retry-After from a deployment whose limit is unknown holds it this long (seconds),
# and the requests it accepted in this window before the first refusal set its first pace.
LEARN_WINDOW = 1.0
# Slow start: a deployment's first requests (and a fallback's, once traffic fails over to it for
# a rate limit) go out at most SLOW_START_WINDOW at a time; each answer widens the window by one,
# and so does time while calls wait on it (doubling every SLOW_START_DOUBLING seconds, so a slow
# provider is not waited on for long). A whole first window answered without a 429 ends it (the
# deployment takes our load), and so does a 429 (the pace takes over). So a burst into an unknown
# limit does not send everything at once, and a healthy deployment costs one round trip, once.
SLOW_START_WINDOW = 32
SLOW_START_DOUBLING = 2.0
SLOW_START_OPEN = 1024
# A learned pace lets this many seconds' worth of requests go at once.
LEARNED_BURST_S = 0.2
# A first pace counted from fewer accepted requests than this is a guess (see ``probing``).
PROBE_BELOW = 3
# A learned limit is dropped after this long without a 429 and without the pace binding.
FORGET_AFTER = 60.0


class PaceLearning:
    """Learning a deployment's limit (the :class:`~._engine.pacing.Pace` mixin; its state)."""

    clock: Clock
    learn: bool
    headroom: float
    configured: Limits | None
    limits: Limits
    lock: threading.Lock
    sends: deque[tuple[float, bool]]
    waiting: list[Any]
    _level: float
    _tlevel: float
    _updated: float
    _hold_until: float
    _last_429: float
    _last_decrease: float
    _last_increase: float
    last_bound: float
    _learned_from: tuple[float, float] | None
    _ss_over: bool
    _ss_acks: int
    _ss_start: float | None
    _ss_mark: float | None
    inflight: int
    refused: int

    @property
    def limited(self) -> bool:
        raise NotImplementedError

    pending_learn: tuple[float, float] | None = None
    _learned_at = 0.0
    rate_at_429 = math.inf  # the pace a 429 last lowered (the increase slows near it)
    # The first pace is a guess (the deployment accepted almost nothing before refusing, e.g. an
    # incident that refused everything): it doubles each second without a 429 until one comes
    # (TCP's slow start after a timeout), instead of creeping up from a rate nobody measured.
    probing = False
    # A sibling's 429 narrowed the slow-start window to what was in flight then (see
    # :meth:`sibling_refused`); it widens by one per answer since (acks counted from _ss_cap_acks).
    _ss_cap = math.inf
    _ss_cap_acks = 0

    def answered_at(self, sent_at: float) -> None:
        """A request sent at ``sent_at`` (monotonic) was accepted: the first pace counts these
        (one that ends after the pace was set raises it to what was really accepted)."""
        self.sends.append((sent_at, False))
        if not self._ss_over:
            self._ss_acks += 1
        learned = self._learned_from
        if learned is not None and learned[0] - LEARN_WINDOW <= sent_at <= learned[0]:
            with self.lock:
                at, hold = learned
                lim = self.limits
                if lim.source != "learned" or lim.requests_per_s is None:
                    return
                accepted, rate, _shown = self._accepted_rate(at, hold)
                if rate > lim.requests_per_s and self._last_decrease <= self._learned_at:
                    lim.requests_per_s = rate
                    lim.request_burst = max(lim.request_burst, min(float(accepted), lim.requests_per_s))

    def _accepted_rate(self, at: float, hold: float) -> tuple[int, float, float]:
        """(requests accepted in the window before the first refusal at ``at``, the pace to start
        at, the rate they show). The wave that met the limit shows the provider's burst more
        than its rate: where enough was accepted before its last LEARNED_BURST_S, the rate is the
        lower of the window over the hold and that earlier part over its span - and that earlier
        traffic may predate the limit (a provider that began to shed load), so the pace starts
        one decrease below it and climbs back, slower near it, rather than meet a 429 to learn so."""
        window = [t for t, refused in self.sends if at - LEARN_WINDOW <= t <= at and not refused]
        rate = len(window) / hold
        before = sum(1 for t in window if t < at - LEARNED_BURST_S)
        if before < PROBE_BELOW:
            return len(window), rate, rate
        shown = min(rate, before / (LEARN_WINDOW - LEARNED_BURST_S))
        return len(window), shown * DECREASE, shown

    def wants_headers(self, headers: Mapping[str, Any] | None) -> bool:
        """Are an answer's rate-limit headers worth adopting: this deployment is paced already,
        or they say less than a tenth of its limit is left (pace before the first 429)?"""
        if not headers or not self.learn or not any(k in headers for k in RATE_LIMIT_KEYS):
            return False  # most answers: no limit stated at all
        if self.limited:
            return True
        req, tok = header_limits(headers)
        return any(h is not None and h.limit > 0 and h.remaining < 0.1 * h.limit for h in (req, tok))

    def on_rate_limited(
        self,
        retry_after: float | None,
        headers: Mapping[str, Any] | None,
        latency: float = 0.0,
        grant: Grant | None = None,
    ) -> None:
        """A 429 for a request sent ``latency`` seconds ago: hold for its Retry-After, and set or
        lower the pace (from its headers, else additive-increase/multiplicative-decrease)."""
        now = self.clock.monotonic()
        with self.lock:
            self.refused += 1
            self._ss_over = True  # the limit is found: the pace takes over from slow start
            self.sends.append((now - latency, True))
            self._last_429 = now
            if grant is not None and grant.tokens and self.limits.tokens_per_s is not None:
                self._tlevel = min(self.limits.token_burst, self._tlevel + grant.tokens)  # not counted
            hold = retry_after
            adopted = self.adopt_headers(headers, now) if headers else False
            lim = self.limits
            if not adopted and self.learn:
                if lim.requests_per_s is None:
                    if self.pending_learn is None:
                        # The first pace: what the deployment accepted in the window before this
                        # refusal, counted when the hold ends (once the wave's refusals are in).
                        self.pending_learn = (now - latency, max(hold or LEARN_WINDOW, LEARN_WINDOW))
                    lim.source = "learned"
                    if hold is None:
                        hold = LEARN_WINDOW
                elif (self.waiting or self._level < 1.0) and now - self._last_decrease >= min(
                    1.0, 1.0 / lim.requests_per_s
                ):  # only a 429 met while sending at the pace lowers it (not a stray one)
                    self.rate_at_429 = lim.requests_per_s
                    self.probing = False
                    lim.requests_per_s = max(1.0 / 60.0, lim.requests_per_s * DECREASE)
                    self._last_decrease = now
            if hold is None and lim.requests_per_s:
                hold = 1.0 / lim.requests_per_s
            if hold:
                self._hold_until = max(self._hold_until, now + hold)
            self._level = min(self._level, 0.0)
            self._last_increase = now

    def settle_learning(self) -> None:
        """Turn a pending first estimate into a pace once its hold has ended."""
        if self.pending_learn is None:
            return
        with self.lock:
            self.settle_locked(self.clock.monotonic())

    def settle_locked(self, now: float) -> None:
        """:meth:`settle_learning` with the lock held: the first pace is the requests the
        deployment accepted in the window before its first refusal, over the hold it asked for."""
        pending = self.pending_learn
        if pending is None or now < self._hold_until:
            return
        at, hold = pending
        self.pending_learn = None
        lim = self.limits
        if lim.requests_per_s is not None:
            return
        accepted, rate, shown = self._accepted_rate(at, hold)
        # At the headroom a stated limit gets: a pace at exactly the rate it accepted meets a 429
        # on every jitter, and each would lower it by a third.
        first = max(1.0 / 60.0, rate) if accepted else 1.0 / hold
        lim.requests_per_s = first * self.headroom
        # What it accepted is as high as it is known to go - unless it accepted too little to say.
        self.probing = accepted < PROBE_BELOW
        self.rate_at_429 = math.inf if self.probing else shown * self.headroom
        # The provider's burst is not known (the count may include calls from before its limit
        # bit): send evenly, a fifth of a second's worth at most at once, not a second's.
        lim.request_burst = max(1.0, min(float(accepted), LEARNED_BURST_S * lim.requests_per_s))
        self._level = lim.request_burst  # the provider refilled while it held us off
        self._learned_from, self._learned_at = pending, now
        self._updated = now
        self._last_increase = now
        self._last_decrease = now

    def adopt_headers(self, headers: Mapping[str, Any], now: float, since: int = 0) -> bool:
        """Set the limits the provider's headers state (configured limits cap them); lock held."""
        if not self.learn and self.configured is None:
            return False
        req, tok = header_limits(headers)
        if req is None and tok is None:
            return False
        lim = self.limits
        cfg = self.configured
        changed = False
        if req is not None:
            rate = req.rate()
            if cfg is not None and cfg.requests_per_s and not _proved_lower(req, rate, cfg.requests_per_s):
                rate = None  # a configured limit stands until the provider's numbers prove it too high
            if rate is not None and self.learn:
                rate *= self.headroom
                if lim.source == "headers" and lim.requests_per_s:  # readings are noisy: smooth them
                    rate = 0.5 * (lim.requests_per_s + rate)
                lim.requests_per_s = rate
                lim.request_burst = max(1.0, req.limit)
                changed = True
            if lim.requests_per_s is not None:
                # ``since``: slots granted after that request went out, not yet in its count.
                self._level = min(self._level, req.remaining - since)
        if tok is not None:
            rate = tok.rate()
            if cfg is not None and cfg.tokens_per_s and not _proved_lower(tok, rate, cfg.tokens_per_s):
                rate = None
            if rate is not None and self.learn:
                rate *= self.headroom
                if lim.source == "headers" and lim.tokens_per_s:
                    rate = 0.5 * (lim.tokens_per_s + rate)
                lim.tokens_per_s = rate
                lim.token_burst = max(1.0, tok.limit)
                changed = True
            if lim.tokens_per_s is not None:
                self._tlevel = min(self._tlevel, tok.remaining)
        if changed and lim.source != "config":
            lim.source = "headers"
        self.pending_learn = None
        return changed

    def forget_if_idle(self) -> None:
        """Drop a learned limit after a quiet minute (no 429, the pace not binding)."""
        lim = self.limits
        if lim.source not in ("learned", "headers") or self.waiting:
            return
        now = self.clock.monotonic()
        if now - self._last_429 > FORGET_AFTER and now - self.last_bound > FORGET_AFTER:
            with self.lock:
                if self.waiting:
                    return
                if self.configured is not None:
                    c = self.configured
                    self.limits = Limits(
                        c.requests_per_s * self.headroom if c.requests_per_s else None,
                        c.request_burst,
                        c.tokens_per_s * self.headroom if c.tokens_per_s else None,
                        c.token_burst,
                        "config",
                    )
                else:
                    self.limits = Limits()

    # -- slow start (lock held where noted) ------------------------------------------------

    def slow_start_window(self, now: float) -> float:
        """How many requests may be in flight during slow start (inf once it is over)."""
        if self._ss_over:
            return math.inf
        if self._ss_start is None:
            self._ss_start = 0.0  # seconds it has bound so far (its clock runs only while it binds)
        bound = self._ss_start + (now - self._ss_mark if self._ss_mark is not None else 0.0)
        w = (SLOW_START_WINDOW + self._ss_acks) * 2 ** (bound / SLOW_START_DOUBLING)
        if self._ss_cap < math.inf:
            w = min(w, self._ss_cap + self._ss_acks - self._ss_cap_acks)
        if w >= SLOW_START_OPEN or self._ss_acks >= SLOW_START_WINDOW:  # a first window answered
            self._ss_over = True
            return math.inf
        return w

    def end_slow_start(self) -> None:
        """No slow start for this deployment (pacing off, or a known limit paces it instead)."""
        self._ss_over = True

    def restart_slow_start(self) -> None:
        """Traffic is about to move here for a rate limit elsewhere: ramp up again, unless a
        limit is known or the deployment was in use lately."""
        if self._ss_over and self.limits.requests_per_s is None and self.inflight == 0:
            with self.lock:
                self._ss_over, self._ss_start, self._ss_mark, self._ss_acks = False, None, None, 0
                self._ss_cap, self._ss_cap_acks = math.inf, 0

    def sibling_refused(self) -> None:
        """Another deployment of the group answered 429 while this one is in slow start with no
        limit known: the same wave may have met this one's limit too, so it sends no more than it
        has in flight until answers show room (each widens the window by one), rather than take
        the refused calls' retries straight into that limit."""
        if self._ss_over or self.limits.requests_per_s is not None:
            return
        with self.lock:
            cap = max(1.0, float(self.inflight))
            if cap < self._ss_cap + self._ss_acks - self._ss_cap_acks:  # only ever narrows
                self._ss_cap, self._ss_cap_acks = cap, self._ss_acks

    def track_slow_start(self, now: float) -> None:
        """Run the slow-start clock while calls wait, stop it when none do (lock held)."""
        if self._ss_over:
            return
        if self.waiting and self._ss_mark is None:
            self._ss_mark = now
        elif not self.waiting and self._ss_mark is not None:
            self._ss_start = (self._ss_start or 0.0) + now - self._ss_mark
            self._ss_mark = None


def _proved_lower(h: HeaderLimit, rate: float | None, configured: float) -> bool:
    """Do a precise reading's numbers put the provider's limit below the configured one?"""
    most = h.most()
    return rate is not None and most is not None and most < configured
