"""A pytest plugin (entry point ``pytest11``): a running simulator, your router YAML pointed at
it, a fake clock, and scenarios applied by marker or by call, so a test of your own chain is a
few lines::

    import pytest

    @pytest.mark.llm_resilience(config="router.yaml", scenario="deployment-down")
    def test_survives_a_dead_primary(llm_chaos):
        reply = llm_chaos.router.completion(model="primary", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content
        assert llm_chaos.count("fallback") == 1

Fixtures (prefixed so they never clash with a project's own): ``llm_simulator`` (a
:class:`ProviderSimulator`, reset for each test), ``llm_clock`` (a :class:`FakeClock`: backoff and
breaker waits pass instantly), ``llm_chaos`` (a :class:`ChaosHarness`: the router from the YAML,
``apply``/``fault``/``count``). The YAML comes from the marker's ``config=``, else the ini option
``llm_resilience_config``; a relative path is looked up beside the test file, then from the
rootdir.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from llm_resilience_plugin.testing._harness import ChaosHarness
    from llm_resilience_plugin.testing._simulator import ProviderSimulator
    from llm_resilience_plugin.testing.chaos import Scenario

__all__ = [
    "llm_chaos",
    "llm_clock",
    "llm_simulator",
    "pytest_addoption",
    "pytest_configure",
]

MARKER = "llm_resilience"


def pytest_addoption(parser: pytest.Parser) -> None:
    """The ini option naming the default router YAML."""
    parser.addini("llm_resilience_config", "router YAML for the llm_chaos fixture", default="")


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}(config=None, scenario=None, model=None): the router YAML the llm_chaos fixture "
        "builds, a scenario (a built-in name, a YAML path or a Scenario) applied before the test, "
        "and the model group the scenario's `primary` means",
    )


@pytest.fixture(scope="session")
def _llm_simulator_server() -> Iterator[ProviderSimulator]:
    from llm_resilience_plugin.testing._simulator import ProviderSimulator

    with ProviderSimulator() as sim:
        yield sim


@pytest.fixture
def llm_simulator(_llm_simulator_server: ProviderSimulator) -> Iterator[ProviderSimulator]:
    """The session's provider simulator, reset before and after each test."""
    _llm_simulator_server.reset()
    yield _llm_simulator_server
    _llm_simulator_server.reset()


@pytest.fixture
def llm_clock() -> Any:
    """A :class:`FakeClock` for the router: its waits (backoff, breaker reset) pass instantly."""
    from llm_resilience_plugin.testing import FakeClock

    return FakeClock()


def _config_path(request: pytest.FixtureRequest, given: str | None) -> Path:
    value = given or str(request.config.getini("llm_resilience_config") or "")
    if not value:
        raise pytest.UsageError(
            "llm_chaos needs a router YAML: @pytest.mark.llm_resilience(config='router.yaml') or "
            "the ini option llm_resilience_config"
        )
    path = Path(value)
    if path.is_absolute():
        return path
    for base in (Path(str(request.path)).parent, Path(str(request.config.rootpath))):
        if (base / path).is_file():
            return base / path
    return path


@pytest.fixture
def llm_chaos(
    request: pytest.FixtureRequest, llm_simulator: ProviderSimulator, llm_clock: Any
) -> Iterator[ChaosHarness]:
    """Your router YAML pointed at ``llm_simulator`` (built with ``llm_clock``), and the marker's
    scenario applied."""
    from llm_resilience_plugin.testing._harness import ChaosHarness

    marker = request.node.get_closest_marker(MARKER)
    options: dict[str, Any] = dict(marker.kwargs) if marker is not None else {}
    scenario: str | Scenario | None = options.get("scenario")
    harness = ChaosHarness.from_config(
        _config_path(request, options.get("config")),
        llm_simulator,
        clock=llm_clock,
        model=options.get("model"),
    )
    try:
        if scenario is not None:
            harness.apply(scenario)
        yield harness
    finally:
        harness.close()
