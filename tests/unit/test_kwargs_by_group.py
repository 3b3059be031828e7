"""``kwargs_by_group``: a call asked another way on the groups that need it (socket-free)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from llm_resilience_plugin._engine.attempt import AttemptContext
from llm_resilience_plugin._engine.core import CallState, split_options
from llm_resilience_plugin._engine.drivers import walk_routes, walk_routes_sync
from llm_resilience_plugin.errors import ConfigError
from tests.unit.test_engine_core import MSG, ScriptedDispatcher, _call, _engine, _err


class RecordingDispatcher(ScriptedDispatcher):
    """Also keeps the kwargs each attempt was sent with."""

    def __init__(self, scripts: dict[str, list[tuple[str, Any]]]) -> None:
        super().__init__(scripts)
        self.kwargs: list[tuple[str, dict[str, Any]]] = []

    async def send(
        self, attempt: AttemptContext, messages: Any, kwargs: Any, *, timeout_s: float, bound: float
    ) -> Any:
        self.kwargs.append((attempt.group, dict(kwargs)))
        return await super().send(attempt, messages, kwargs, timeout_s=timeout_s, bound=bound)


def _with_overrides(call: CallState, overrides: dict[str, Any]) -> CallState:
    call.opts = replace(
        call.opts, kwargs_by_group=split_options({"kwargs_by_group": overrides})[0].kwargs_by_group
    )
    return call


@pytest.mark.parametrize("own_group_overridden", [False, True])
async def test_each_group_is_sent_its_own_kwargs(own_group_overridden: bool) -> None:
    engine, _, _ = _engine({})
    disp = engine.dispatcher = RecordingDispatcher(
        {"primary": [("a", _err(500))] * 3, "backup": [("c", "from backup")]}
    )
    overrides: dict[str, Any] = {"backup": {"tools": ["t"], "response_format": None}}
    if own_group_overridden:
        overrides["primary"] = {"response_format": "own"}
    call = _with_overrides(_call(engine), overrides)
    base = {"response_format": "strict", "temperature": 0}
    await walk_routes(engine, call, "primary", MSG, base)
    primary_rf = "own" if own_group_overridden else "strict"
    assert [(g, kw["response_format"]) for g, kw in disp.kwargs] == [("primary", primary_rf)] * 3 + [
        ("backup", None)
    ]
    assert disp.kwargs[-1][1] == {"response_format": None, "temperature": 0, "tools": ["t"]}
    assert base == {"response_format": "strict", "temperature": 0}  # the caller's kwargs untouched


def test_the_sync_walk_sends_the_same() -> None:
    engine, _, _ = _engine({})
    sent: list[tuple[str, dict[str, Any]]] = []

    class SyncDispatcher(RecordingDispatcher):
        def send_sync(self, attempt: AttemptContext, messages: Any, kwargs: Any, **_: Any) -> Any:
            sent.append((attempt.group, dict(kwargs)))
            dep, outcome = self.scripts[attempt.group].popleft()
            attempt.pick(dep)
            attempt.sent = True
            if isinstance(outcome, BaseException):
                raise outcome
            import litellm

            return litellm.ModelResponse(model="gpt-4o-mini", choices=[{"message": {"content": outcome}}])

    engine.dispatcher = SyncDispatcher({"primary": [("a", _err(500))] * 3, "backup": [("c", "ok")]})
    call = _with_overrides(_call(engine), {"backup": {"response_format": "tool form"}})
    walk_routes_sync(engine, call, "primary", MSG, {"response_format": "strict"})
    assert [(g, kw["response_format"]) for g, kw in sent] == [("primary", "strict")] * 3 + [
        ("backup", "tool form")
    ]


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (["backup"], "kwargs_by_group"),
        ({"backup": "tools"}, "kwargs_by_group"),
        ({"backup": {"model": "other"}}, "kwargs_by_group.backup"),
        ({"backup": {"deadline_cap": 3}}, "kwargs_by_group.backup"),
    ],
)
def test_bad_overrides_name_their_field(value: Any, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        split_options({"kwargs_by_group": value})
    assert info.value.field == field


def test_overrides_are_taken_out_of_litellms_kwargs() -> None:
    opts, clean = split_options({"temperature": 0, "kwargs_by_group": {"b": {"tools": []}}})
    assert clean == {"temperature": 0} and opts.kwargs_by_group == {"b": {"tools": []}}
