"""The adaptive in-flight limit (Gradient2 shape) without sockets: it grows while latency holds,
shrinks when answers slow down, learns nothing while it is not what holds calls back, and a pace
with it queues the calls over the limit until a request ends."""

from __future__ import annotations

import pytest

from llm_resilience_plugin._engine.clock import FakeClock
from llm_resilience_plugin._engine.concurrency import Gradient
from llm_resilience_plugin._engine.pacing import Pace
from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.policy import ResiliencePolicy


def _busy(g: Gradient, rtt: float, n: int) -> None:
    for _ in range(n):
        g.sample(rtt, int(g.limit))  # every place in use: the limit is what holds calls back


def test_the_limit_grows_while_answers_come_back_as_fast_as_usual():
    g = Gradient(initial=10, minimum=1, maximum=100, tolerance=1.5)
    _busy(g, 0.5, 50)
    assert g.limit > 20  # about its square root a step, smoothed


def test_the_limit_shrinks_when_the_provider_slows_down_and_recovers_after():
    g = Gradient(initial=40, minimum=2, maximum=100, tolerance=1.5)
    _busy(g, 0.5, 300)  # a long run at 0.5 s
    high = g.limit
    _busy(g, 2.5, 40)  # five times slower: past the tolerance
    assert g.limit < high / 2
    low = g.limit
    _busy(g, 0.5, 60)  # fast again
    assert g.limit > low


def test_nothing_is_learned_while_the_limit_is_not_what_holds_calls_back():
    g = Gradient(initial=40, minimum=1, maximum=100, tolerance=1.5)
    for _ in range(100):
        g.sample(5.0, 3)  # slow, but only 3 of 40 places in use
    assert g.limit == 40


def test_the_limit_stays_within_its_bounds():
    g = Gradient(initial=500, minimum=5, maximum=50, tolerance=1.0)
    assert g.limit == 50
    _busy(g, 0.1, 500)
    assert g.limit == 50
    _busy(g, 10.0, 80)  # a hundred times slower than the long run
    assert g.limit == 5


def test_a_pace_with_a_limit_queues_calls_past_it_until_a_request_ends():
    pace = Pace("d", FakeClock())
    pace.end_slow_start()
    pace.concurrency = Gradient(initial=2, minimum=2, maximum=2, tolerance=1.5)
    assert pace.limited and pace.admits
    assert pace.try_take() and pace.try_take()
    assert not pace.try_take()  # two in flight: the third waits
    assert not pace.exact  # its wait depends on when answers come: never judged a deadline miss early
    w = pace.join(rank=1)
    grant = pace.grant(0.0, 0.0)
    pace.ended(grant)  # one request ends: the waiter is granted at once
    assert w.granted
    assert pace.snapshot()["concurrency"]["limit"] == 2


def test_the_policy_names_the_limit_by_group_or_deployment_and_checks_its_bounds():
    pol = ResiliencePolicy.model_validate({"pacing": {"concurrency": {"primary": {"initial": 8}}}})
    assert pol.pacing.concurrency["primary"].initial == 8
    with pytest.raises((ConfigError, ValueError), match="min"):
        ResiliencePolicy.model_validate({"pacing": {"concurrency": {"*": {"min": 9, "max": 3}}}})
