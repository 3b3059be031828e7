"""The Retry-After queue: a held deployment admits as many waiting calls as it answered since its
hold began (at least one); the overflow is refused (it fails over at once)."""

from __future__ import annotations

from llm_resilience_plugin._engine.holds import HoldQueue


def test_a_hold_admits_as_many_waiters_as_answers_since_it_began() -> None:
    q = HoldQueue()
    q.answered("a", 99.0)  # before the hold: not counted
    q.held("a", 100.0, 1.0)
    assert q.try_wait([("a", 0.9)], 100.1) == 0.9  # at least one waits
    assert q.try_wait([("a", 0.9)], 100.1) is None  # the overflow fails over
    for t in (100.2, 100.25, 100.3):  # requests it had accepted are answered while it is held
        q.answered("a", t)
    assert [q.try_wait([("a", 0.6)], 100.4) for _ in range(3)] == [0.6, 0.6, None]  # 3 in all


def test_a_new_hold_has_a_new_queue_and_the_earliest_free_deployment_is_joined_first() -> None:
    q = HoldQueue()
    q.held("a", 0.0, 1.0)
    q.held("b", 0.0, 2.0)
    assert q.try_wait([("b", 2.0), ("a", 1.0)], 0.0) == 1.0  # a frees first
    assert q.try_wait([("b", 2.0), ("a", 1.0)], 0.0) == 2.0  # a is full: b's queue
    assert q.try_wait([("b", 2.0), ("a", 1.0)], 0.0) is None
    q.held("a", 5.0, 1.0)  # a later hold: its own queue
    assert q.try_wait([("a", 1.0)], 5.0) == 1.0
