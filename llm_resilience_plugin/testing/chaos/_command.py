"""``llm-resilience chaos router.yaml``: the user's config against the scenario catalogue, the
plugin beside a plain LiteLLM Router, a scorecard, and a non-zero exit when a threshold is missed."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.policy import RouterSpec, config_problems, read_config
from llm_resilience_plugin.testing._simulator import ProviderSimulator
from llm_resilience_plugin.testing.chaos._metrics import advice, behind, measure
from llm_resilience_plugin.testing.chaos._plot import check_plot_path, write_plot
from llm_resilience_plugin.testing.chaos._report import (
    MIN_SAMPLE,
    Row,
    chaos_settings,
    render_table,
    threshold_failures,
    to_json,
)
from llm_resilience_plugin.testing.chaos._run import SYSTEMS, Prepared, RunResult, execute, prepare, warm_up
from llm_resilience_plugin.testing.chaos._scenario import Scenario, builtin_scenarios, load_scenario

__all__ = ["EXIT_THRESHOLDS", "ChaosConfig", "load_chaos_config", "primary_group", "run_chaos"]

EXIT_THRESHOLDS = 1
SCENARIOS_AT_ONCE = 4  # scenarios run side by side (each runs both systems side by side)


class ChaosConfig:
    """A user's config, checked: the spec, its raw ``router_settings`` (for the plain Router)."""

    def __init__(self, path: str, raw: Mapping[str, Any], spec: RouterSpec) -> None:
        self.path = path
        self.raw = raw
        self.spec = spec
        self.settings = chaos_settings(raw)
        settings = raw.get("router_settings") or {}
        self.router_settings: dict[str, Any] = dict(settings) if isinstance(settings, Mapping) else {}


def load_chaos_config(path: str) -> ChaosConfig:
    """Read and check ``path`` with the loader ``check`` uses (``ConfigError`` on an error)."""
    raw = read_config(path)
    spec, problems = config_problems(raw, source=path)
    errors = [p for p in problems if p.severity == "error"]
    if errors or spec is None:
        first = errors[0] if errors else None
        more = f" (and {len(errors) - 1} more; run llm-resilience check)" if len(errors) > 1 else ""
        raise ConfigError(first.field if first else path, (first.message if first else "invalid") + more)
    assert isinstance(raw, Mapping)
    return ChaosConfig(path, raw, spec)


def primary_group(config: ChaosConfig) -> str:
    """The group the calls ask for: ``chaos.model``, else the first with fallbacks, else the first."""
    groups = config.spec.groups
    wanted = config.settings.model
    if wanted is not None:
        if wanted not in groups:
            raise ConfigError("chaos.model", f"no model group {wanted!r} (groups: {', '.join(groups)})")
        return wanted
    return next((g for g in groups if config.spec.fallback_chain(g, None)), groups[0])


def quick(scenario: Scenario) -> Scenario:
    """A smoke version: half the calls (at least 2), the same timeline."""
    calls = max(2, scenario.calls // 2)
    rate = scenario.rate / 2 if scenario.rate is not None else None
    return scenario.model_copy(update={"calls": calls, "rate": rate})


class _Progress:
    """Calls done out of the total, on stderr: tqdm when installed and on a TTY, else a bare bar
    on a TTY, else one line per finished scenario."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total, self.done, self.stream = total, 0, stream
        self.tty = stream.isatty()
        self.bar: Any = None
        if self.tty:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="call", desc="chaos", file=stream, leave=False)
            except ImportError:
                self.bar = None

    def step(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.tty:
            width = 30
            filled = int(width * self.done / max(1, self.total))
            self.stream.write(f"\rchaos [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}")
            self.stream.flush()

    def scenario_done(self, name: str, seconds: float) -> None:
        if not self.tty:
            print(f"chaos: {name} done in {seconds:.1f} s", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.tty:
            self.stream.write("\r" + " " * 60 + "\r")
            self.stream.flush()


async def _run_all(
    config: ChaosConfig, scenarios: list[Scenario], sim: ProviderSimulator, progress: _Progress
) -> list[tuple[RunResult, RunResult]]:
    """Every router built and warmed up first (building is synchronous: it would stall runs in
    progress), then the scenarios, a few at a time, each on both systems side by side."""
    primary = primary_group(config)
    ready: list[list[Prepared]] = []
    try:
        for sc in scenarios:
            ready.append([])
            for system in SYSTEMS:
                ready[-1].append(
                    prepare(sim, config.spec, config.router_settings, sc, system, primary=primary)
                )
        await asyncio.gather(*(warm_up(p) for pair in ready for p in pair))
    except BaseException:
        for pair in ready:
            for p in pair:
                p.close()
        raise
    gate = asyncio.Semaphore(SCENARIOS_AT_ONCE)

    async def both(pair: list[Prepared]) -> tuple[RunResult, RunResult]:
        async with gate:
            t = time.monotonic()
            plugin, plain = await asyncio.gather(*(execute(p, progress.step) for p in pair))
            progress.scenario_done(pair[0].scenario.name, time.monotonic() - t)
            return plugin, plain

    return list(await asyncio.gather(*(both(pair) for pair in ready)))


def run_chaos(
    config_path: str,
    scenario_paths: Sequence[str] = (),
    *,
    json_path: str | None = None,
    plot_path: str | None = None,
    quick_run: bool = False,
    only: Sequence[str] = (),
    out: Callable[[str], None] = print,
    err: TextIO | None = None,
) -> int:
    """The command: 0 when every threshold holds, 1 when one is missed (``ConfigError`` for a
    mistake in the config, a scenario file or an option)."""
    config = load_chaos_config(config_path)
    primary_group(config)  # a bad chaos.model fails before anything runs
    scenarios = [load_scenario(p) for p in scenario_paths] or builtin_scenarios()
    if only:
        unknown = sorted(set(only) - {s.name for s in scenarios})
        if unknown:
            names = ", ".join(s.name for s in scenarios)
            raise ConfigError("--only", f"unknown scenario(s) {', '.join(unknown)}; choose from {names}")
        scenarios = [s for s in scenarios if s.name in only]
    if len({s.name for s in scenarios}) != len(scenarios):
        raise ConfigError("--scenario", "two scenarios share a name")
    if quick_run:
        scenarios = [quick(s) for s in scenarios]
    if plot_path is not None:
        check_plot_path(plot_path)  # a wrong suffix or a missing matplotlib, before any scenario runs
    progress = _Progress(sum(s.calls for s in scenarios) * len(SYSTEMS), err or sys.stderr)
    started = time.monotonic()
    with ProviderSimulator() as sim, contextlib.redirect_stdout(io.StringIO()):
        try:
            runs = asyncio.run(_run_all(config, scenarios, sim, progress))
        finally:
            progress.close()
    wall = time.monotonic() - started
    rows = []
    for plugin, plain in runs:
        pm, lm = measure(plugin, config.spec), measure(plain, config.spec)
        sc = plugin.scenario
        tips = advice(plugin, pm, config.spec) + behind(sc.name, pm, lm, min_sample=MIN_SAMPLE)
        rows.append(Row(sc.name, sc.description, sc.gate, pm, lm, tips))
    failures = threshold_failures(rows, config.settings)
    table = render_table(rows)
    out(f"{config_path}: {len(rows)} scenario(s) on group {primary_group(config)!r}, {wall:.1f} s\n")
    out(table)
    tips = [tip for r in rows for tip in r.advice]
    if tips:
        out("\nAdvice:")
        for tip in tips:
            out(f"  - {tip}")
    if json_path is not None:
        Path(json_path).write_text(
            json.dumps(to_json(config_path, rows, config.settings, failures, wall), indent=2)
        )
        out(f"\nJSON: {json_path}")
    if plot_path is not None:
        out(f"Plot: {write_plot(plot_path, runs, rows)}")
    if failures:
        out("\nThresholds missed:")
        for line in failures:
            out(f"  - {line}")
        return EXIT_THRESHOLDS
    if config.settings.model_dump(exclude_none=True, exclude={"model"}):
        out("\nThresholds met.")
    return 0
