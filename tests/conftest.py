"""Shared fixtures: one provider simulator per session (reset per test) and a router factory."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
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

# One function tool (the stream suites' tool-call streams).
WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "the weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                "required": ["city", "unit"],
            },
        },
    }
]


# -- progress under pytest-xdist (scripts/test.sh runs -n 4): a line per test file once it is done --
#
# Without xdist pytest prints a line per file itself. With it the files' tests finish on several
# workers at once and the terminal shows only dots, so the controller prints each file's line
# (its counts and the total done so far) when the file's last test is reported, and no dots.


class _FileProgress:
    def __init__(self, terminalreporter: Any) -> None:
        self.tr = terminalreporter
        self.total: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self.outcomes: dict[str, dict[str, int]] = {}
        self.grand_total = 0
        self.grand_done = 0

    def collected(self, ids: list[str]) -> None:
        if self.total:  # every worker collects the same ids
            return
        for nodeid in ids:
            path = nodeid.split("::")[0]
            self.total[path] = self.total.get(path, 0) + 1
        self.grand_total = len(ids)

    def report(self, report: pytest.TestReport) -> None:
        path = report.nodeid.split("::")[0]
        counts = self.outcomes.setdefault(path, {})
        if report.when == "call" or (report.when == "setup" and not report.passed):
            outcome = "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome
            outcome = "error" if report.when == "setup" and report.failed else outcome
            counts[outcome] = counts.get(outcome, 0) + 1
        elif report.when == "teardown" and report.failed:
            counts["error"] = counts.get("error", 0) + 1
        if report.when != "teardown":
            return
        self.done[path] = self.done.get(path, 0) + 1
        self.grand_done += 1
        if self.done[path] != self.total.get(path):
            return
        parts = ", ".join(f"{n} {what}" for what, n in sorted(counts.items()))
        width = len(str(self.grand_total))
        line = f"{path} {parts}"
        self.tr.write_line(f"{line:<76} [{self.grand_done:>{width}}/{self.grand_total}]")


def _xdist_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None))


_PROGRESS: list[_FileProgress] = []  # one, on the xdist controller


# Files whose few tests take long (a notebook, the demo, subprocess CLIs, docs examples): under
# pytest-xdist's file scheduling (scripts/test.sh runs it with --no-loadscope-reorder) they start
# first, so no worker is left running one of them alone at the end; the rest follow by their
# number of tests, most first, as xdist's own order would have them.
RUN_FIRST = (
    "tests/integration/test_notebooks.py",
    "tests/integration/test_demo.py",
    "tests/docs/test_examples.py",
    "tests/chaos/test_chaos_cli.py",
    "tests/chaos/test_anthropic_chaos.py",
    "tests/integration/test_failure_modes.py",
    "tests/langchain/integration_tests/test_surface.py",
    "tests/integration/test_simulator.py",
    "tests/integration/test_pacing.py",
    "tests/integration/test_chaos_stream_scenarios.py",
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order files for the workers: :data:`RUN_FIRST`, then by test count (a stable sort)."""
    if not _xdist_worker(config):
        return
    counts: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        counts[path] = counts.get(path, 0) + 1
    rank = {path: i for i, path in enumerate(RUN_FIRST)}

    def key(item: pytest.Item) -> tuple[int, int]:
        path = item.nodeid.split("::", 1)[0]
        return (rank.get(path, len(rank)), -counts[path])

    items.sort(key=key)


def _xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    if terminal is not None and _xdist_controller(config):
        _PROGRESS.append(_FileProgress(terminal))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    for progress in _PROGRESS:
        progress.collected(ids)


@pytest.hookimpl(wrapper=True)
def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> Any:
    """Under xdist, no dot per test: the per-file lines say it (failures are listed at the end)."""
    category, letter, word = yield
    if _PROGRESS and config.get_verbosity() <= 0:
        letter = ""
    return category, letter, word


# -- where the suite's time goes: one line per kind of test (tests/<kind>/) at the end of a run --

_KIND_TIMES: dict[str, list[float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add each phase's duration (setup, call, teardown) to its kind's total (under xdist: on the
    controller, so a kind's figure is the sum over the workers, more than the wall time it took)."""
    for progress in _PROGRESS:
        progress.report(report)
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


async def worst_loop_lag(calls: Callable[[], Awaitable[None]]) -> float:
    """The longest the loop was held (beyond a 5 ms tick) while ``calls`` ran."""
    lags: list[float] = []
    running = True

    async def ticker() -> None:
        while running:
            t0 = time.perf_counter()
            await asyncio.sleep(0.005)
            lags.append(time.perf_counter() - t0 - 0.005)

    tick = asyncio.ensure_future(ticker())
    await asyncio.sleep(0.02)
    try:
        await calls()
        await asyncio.sleep(0.02)
    finally:
        running = False
        await tick
    return max(lags)
