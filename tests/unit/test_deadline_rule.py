"""One deadline rule for every entry point (router, chat model, resilient()): the most specific
setting given, never past what an enclosing run has left."""

from __future__ import annotations

import pytest

from llm_resilience_plugin._engine.clock import call_budget
from llm_resilience_plugin._engine.core import split_options
from llm_resilience_plugin.errors import ConfigError


def test_the_most_specific_setting_wins() -> None:
    assert call_budget(5.0, 20.0, 60.0) == 5.0  # the call's own
    assert call_budget(None, 20.0, 60.0) == 20.0  # its tier's
    assert call_budget(None, None, 60.0) == 60.0  # the policy's


def test_the_cap_bounds_whatever_was_chosen() -> None:
    assert call_budget(30.0, 60.0, cap=0.5) == 0.5
    assert call_budget(None, 2.0, cap=10.0) == 2.0


def test_no_setting_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        call_budget(None, None)


def test_deadline_cap_is_a_checked_call_option() -> None:
    opts, clean = split_options({"deadline_cap": 1.5, "temperature": 0})
    assert opts.deadline_cap == 1.5 and clean == {"temperature": 0}
    with pytest.raises(ConfigError, match="deadline_cap"):
        split_options({"deadline_cap": -1})
