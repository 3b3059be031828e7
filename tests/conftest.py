"""Shared fixtures: one provider simulator per session (reset per test) and a router factory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import llm_resilience_plugin  # noqa: F401  (sets LiteLLM's offline switches before it is imported)
from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin.testing import FakeClock
from llm_resilience_plugin.testing._simulator import ProviderSimulator

FAST_POLICY: dict[str, Any] = {
    "deadline": 10,
    "attempt_timeout": 5,
    "backoff": {"initial": 0.01, "maximum": 0.05},
    "breaker": {"fail_max": 3, "reset_timeout": 5},
}


@pytest.fixture(scope="session")
def sim_server() -> Iterator[ProviderSimulator]:
    with ProviderSimulator() as sim:
        yield sim


@pytest.fixture
def sim(sim_server: ProviderSimulator) -> Iterator[ProviderSimulator]:
    sim_server.reset()
    yield sim_server
    sim_server.reset()


def _litellm_before(minor: int) -> bool:
    from importlib.metadata import version

    parts = version("litellm").split(".")
    return len(parts) > 1 and parts[0] == "1" and parts[1].isdigit() and int(parts[1]) < minor


_MAP_WRITTEN_IN_PLACE = _litellm_before(109)


@pytest.fixture(autouse=True)
def _model_map_kept() -> Iterator[None]:
    """Each test starts from LiteLLM's own model map: LiteLLM 1.105-1.108 write a deployment's
    ``model_info`` (``mode``, ``supports_assistant_prefill``, ...) into the process-wide map under
    the model's name, so one router with a ``mode: responses`` deployment of ``gpt-4o-mini`` sends
    every later ``gpt-4o-mini`` chat call in the process through the Responses API."""
    import litellm

    if not _MAP_WRITTEN_IN_PLACE:  # from 1.109 a deployment's model_info stays out of them
        yield
        return
    kept = {k: v.copy() for k, v in litellm.model_cost.items() if isinstance(v, dict)}
    yield
    for key, entry in litellm.model_cost.items():
        before = kept.get(key)
        if before is not None and isinstance(entry, dict) and entry != before:
            entry.clear()
            entry.update(before)


def requires_capability(name: str) -> pytest.MarkDecorator:
    """Skip, naming the capability and the LiteLLM version, where this LiteLLM lacks ``name``."""
    from llm_resilience_plugin import _litellm

    cap = _litellm.capabilities()[name]
    return pytest.mark.skipif(
        not cap.available,
        reason=f"needs LiteLLM capability {name}; "
        f"litellm {_litellm.litellm_version()} lacks it ({cap.missing})",
    )


def deployment(sim: ProviderSimulator, group: str, dep_id: str, **params: Any) -> dict[str, Any]:
    """A LiteLLM deployment entry pointing at simulator deployment ``dep_id``."""
    return {
        "model_name": group,
        "litellm_params": {
            "model": "openai/gpt-4o-mini",
            "api_base": sim.api_base(dep_id),
            "api_key": "sk-sim-secret",
            **params,
        },
        "model_info": {"id": dep_id},
    }


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.fixture
def routers() -> Iterator[list[ResilientRouter]]:
    """A list to put routers in; each is closed after the test."""
    made: list[ResilientRouter] = []
    yield made
    for r in made:
        r.close()


RouterFactory = Callable[..., ResilientRouter]


@pytest.fixture
def make_router(sim: ProviderSimulator) -> Iterator[RouterFactory]:
    """make_router({"primary": ["a", "b"], "backup": ["c"]}, fallbacks=..., policy=...)"""
    made: list[ResilientRouter] = []

    def make(
        groups: dict[str, list[str]],
        *,
        policy: dict[str, Any] | None = None,
        clock: FakeClock | None = None,
        **kwargs: Any,
    ) -> ResilientRouter:
        model_list = [deployment(sim, g, d) for g, deps in groups.items() for d in deps]
        router = ResilientRouter(
            model_list=model_list,
            policy=_merge(FAST_POLICY, policy or {}),
            clock=clock or FakeClock(),
            seed=1234,
            **kwargs,
        )
        made.append(router)
        return router

    yield make
    for r in made:
        r.close()


MSG = [{"role": "user", "content": "Hello there, how are you?"}]


# -- where the suite's time goes: one line per kind of test (tests/<kind>/) at the end of a run --

_KIND_TIMES: dict[str, list[float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add each phase's duration (setup, call, teardown) to its kind's total."""
    parts = report.nodeid.split("/")
    kind = parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0].split("::")[0]
    entry = _KIND_TIMES.setdefault(kind, [0.0, 0.0])
    entry[0] += report.duration
    if report.when == "call":
        entry[1] += 1


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Seconds spent per kind, slowest first (only when a run covers more than one kind)."""
    if len(_KIND_TIMES) < 2:
        return
    terminalreporter.section("time by kind of test")
    for kind, (seconds, tests) in sorted(_KIND_TIMES.items(), key=lambda kv: -kv[1][0]):
        terminalreporter.write_line(f"{kind:<14} {seconds:7.1f} s  {int(tests):5d} tests")
