"""Chaos benchmark: scripted failure scenarios against one simulator, four systems side by side.

Systems and callers: see benchmarks/_chaos_systems.py (bare Router, tuned Router, LangChain
with_retry/with_fallbacks, the plugin; a completion, a chunk consumer, LangChain ainvoke over a
streaming chat model). Scenarios: benchmarks/_chaos_scenarios.py.

Each cell (scenario x caller x system) has its own simulator deployments, served by a simulator in
a child process (benchmarks/_chaos_sim.py). Cells run one at a time, except in the scenarios bound
by waiting (stalls, holds, timed incidents), which run theirs side by side; ``--quick`` (a smoke
run) runs every waiting-bound scenario at once, after the others; ``--serial`` runs every cell
alone. A cell
first sends healthy calls (not measured: a router in production has seen healthy traffic before an
incident): ``--warmup`` for the plugin, which learns its stream timeouts from them, two for the
others, which learn nothing from healthy calls. Then the fault is injected and the measured calls
go out.

Metrics per cell: success (complete answers only: one deployment's full text, finish reason
``stop``), garbled (calls ending with ``stop`` on a text that is no deployment's answer),
p50/p99 latency of every call (a call still running after CALL_CAP s is abandoned and
counted as failed at CALL_CAP), upstream requests per call, share of calls answered by the
primary group, time back on primary (seconds from the moment the primary is healthy again to
the first request it answers; flapping and Retry-After), requests that met a fault, billed
requests (2xx, cut streams included) and, for the plugin, requests that reached a deployment
while its breaker was open (more than OPEN_GRACE after it opened). Prints a Markdown table and
writes JSON (benchmarks/results/).

    python benchmarks/chaos.py [--quick] [--calls 30] [--concurrency 20] [--only storm,stall]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llm_resilience_plugin  # noqa: F401  (offline LiteLLM settings first)

try:  # run as a script (python benchmarks/x.py) or imported as benchmarks.x
    from _chaos_scenarios import Scenario, healthy, scenarios
    from _chaos_sim import Request, SimulatorProcess
    from _chaos_systems import SYSTEMS, Cell, Outcome, System, build
    from _common import pct, write_json
except ImportError:  # pragma: no cover
    from benchmarks._chaos_scenarios import Scenario, healthy, scenarios
    from benchmarks._chaos_sim import Request, SimulatorProcess
    from benchmarks._chaos_systems import SYSTEMS, Cell, Outcome, System, build
    from benchmarks._common import pct, write_json

CALL_CAP = 120.0  # seconds; twice the plugin's deadline: only systems without one come near it
WARMUP_CONCURRENCY = 12
LEAN_WARMUP = 2
OPEN_GRACE = 0.1  # seconds
RESULTS = Path(__file__).resolve().parent / "results"  # git-ignored


async def timed(system: System) -> tuple[Outcome, float]:
    """One call of ``system``: its outcome (an error by its type, the plugin's typed error saying
    whether it carried a replacement) and how long it took (CALL_CAP at most)."""
    t = time.monotonic()
    try:
        outcome = await asyncio.wait_for(system.call(), timeout=CALL_CAP)
    except TimeoutError:
        outcome = Outcome(False, None, f"still running after {CALL_CAP:g} s")
    except Exception as exc:
        replaced = getattr(exc, "replacement", None) is not None  # the plugin's typed error
        outcome = Outcome(False, None, type(exc).__name__ + (" with replacement" if replaced else ""))
    return outcome, time.monotonic() - t


async def _closed_loop(system: System, calls: int, concurrency: int) -> list[tuple[Outcome, float]]:
    sem = asyncio.Semaphore(concurrency)

    async def one() -> tuple[Outcome, float]:
        async with sem:
            return await timed(system)

    return list(await asyncio.gather(*(one() for _ in range(calls))))


async def _paced(system: System, calls: int, rate: float) -> list[tuple[Outcome, float]]:
    start = time.monotonic()
    tasks = []
    for i in range(calls):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(timed(system)))
    return list(await asyncio.gather(*tasks))


def sent_while_open(
    requests: list[Request], opened: list[tuple[str, float, str]]
) -> list[tuple[float, Request]]:
    """Requests that reached a deployment while the plugin held its breaker open (probes, sent
    half-open, excluded), with seconds after it opened. One that arrives within OPEN_GRACE of the
    opening was most likely on its way already (admitted before it), and is not counted."""
    late = []
    for r in requests:
        state, since = "closed", 0.0
        for dep, t, new in opened:
            if dep == r.deployment and t <= r.started_at:
                state, since = new, t
        if state == "open" and r.started_at - since > OPEN_GRACE:
            late.append((r.started_at - since, r))
    return late


def admitted_while_open(
    sent: list[tuple[str, float, bool]], opened: list[tuple[str, float, str]]
) -> list[float]:
    """Attempts the plugin opened and sent to a deployment whose breaker was open at that moment
    (probes excluded), as seconds after it opened: an admission bug, measured on the plugin's
    side (an attempt opens just before its admission), so a request admitted before the breaker
    opened and slow to reach the simulator is not one."""
    late = []
    for dep, at, probe in sent:
        state, since = "closed", 0.0
        for d, t, new in opened:
            if d == dep and t <= at:
                state, since = new, t
        if state == "open" and not probe:
            late.append(at - since)
    return late


def _last_sent_before(sent: list[tuple[str, float, bool]], dep: str, at: float) -> float | None:
    """The time of the plugin's last attempt to ``dep`` opened at or before ``at``."""
    times = [t for d, t, _ in sent if d == dep and t <= at]
    return max(times) if times else None


def _metrics(
    cell: Cell,
    results: list[tuple[Outcome, float]],
    reqs: list[Request],
    system: System,
    healthy_at: float | None,
    start: float,
    end: float,
) -> dict[str, Any]:
    """The cell's numbers (see the module docstring) from its outcomes and the simulator's log."""
    calls = len(results)
    lat = [t for _, t in results]
    ok = [o for o, _ in results if o.ok]
    primaries = {cell.dep(d) for d in cell.scenario.groups[cell.scenario.primary]}
    back: float | None = None
    if healthy_at is not None:
        served = [r.started_at for r in reqs if r.deployment in primaries and r.behavior == "ok"]
        after = [t for t in served if t >= healthy_at]
        back = min(after) - healthy_at if after else None
    errors = Counter(o.error for o, _ in results if not o.ok)
    leaks = sent_while_open(reqs, system.opened)
    admitted = admitted_while_open(system.sent, system.opened)
    # each request that reached a deployment while open: when the plugin last opened an attempt
    # there (seconds before the request reached it), to tell a late arrival from a late admission
    leak_detail = []
    for after, r in leaks:
        last = _last_sent_before(system.sent, r.deployment, r.started_at)
        leak_detail.append(
            {
                "after_open_s": round(after, 3),
                "attempt_opened_before_arrival_s": None if last is None else round(r.started_at - last, 3),
                "behavior": r.behavior,
            }
        )
    return {
        "calls": calls,
        "success_rate": len(ok) / calls,
        "garbled": sum(o.garbled for o, _ in results),
        "p50_s": pct(lat, 50),
        "p99_s": pct(lat, 99),
        "upstream_per_call": len(reqs) / calls,
        "on_primary": sum(o.deployment in cell.scenario.groups[cell.scenario.primary] for o in ok) / calls,
        "back_on_primary_s": back,
        "observed_after_recovery_s": None if healthy_at is None else end - healthy_at,
        "to_failing": sum(1 for r in reqs if r.behavior != "ok"),
        "billed": sum(1 for r in reqs if r.status == 200),
        "sent_while_open": len(admitted) if cell.system == "plugin" else None,
        "sent_while_open_after_s": [round(t, 3) for t in admitted],
        "reached_while_open": len(leaks) if cell.system == "plugin" else None,
        "reached_while_open_detail": leak_detail,
        "breaker_opens": sum(new == "open" for _, _, new in system.opened),
        "errors": dict(errors),
        # the longest a failed call took to end (the plugin's typed error: within its deadline?)
        "slowest_error_s": max((t for o, t in results if not o.ok), default=None),
        "restart_markers": dict(Counter(m for o, _ in results for m in o.markers)),
        "wall_s": end - start,
    }


@dataclass
class Prepared:
    """A cell with its system built and warmed up, ready to measure."""

    cell: Cell
    system: System


async def prepare(cell: Cell, sim: SimulatorProcess, args: argparse.Namespace) -> Prepared:
    """Healthy deployments, the system built and warmed up on them (not measured): the plugin
    with ``--warmup`` calls (it learns from them), the others with LEAN_WARMUP (they learn
    nothing from healthy calls; these open their HTTP clients)."""
    for name in cell.scenario.deployments:
        sim.set_default(cell.dep(name), healthy(cell.answer(name)))
    system = build(cell, sim)
    warmup = args.warmup if cell.system == "plugin" else min(args.warmup, LEAN_WARMUP)
    if warmup:
        await _closed_loop(system, warmup, WARMUP_CONCURRENCY)
    return Prepared(cell, system)


async def measure(p: Prepared, sim: SimulatorProcess, args: argparse.Namespace) -> dict[str, Any]:
    """Inject the scenario's fault, send the calls, read the simulator's log; closes the system."""
    sc, system = p.cell.scenario, p.system
    try:
        calls = sc.load.count(args.calls)
        start = time.monotonic()
        sc.inject(sim, p.cell)
        healthy_at = None if sc.recovers_after is None else start + sc.recovers_after
        if sc.load.rate is None:
            results = await _closed_loop(system, calls, args.concurrency)
        else:
            results = await _paced(system, calls, sc.load.rate)
        end = time.monotonic()
    finally:
        system.close()
    reqs = sim.log({p.cell.dep(d) for d in sc.deployments}, start)
    return _metrics(p.cell, results, reqs, system, healthy_at, start, end)


async def run_cells(
    cells: list[Cell], sim: SimulatorProcess, args: argparse.Namespace, side_by_side: bool
) -> list[dict[str, Any]]:
    """Measure ``cells``: one after another, or side by side (every warm-up first, then every
    measurement at once, so no cell is measured while another warms up)."""
    if not side_by_side:
        return [await measure(await prepare(c, sim, args), sim, args) for c in cells]
    ready = await asyncio.gather(*(prepare(c, sim, args) for c in cells))
    return list(await asyncio.gather(*(measure(p, sim, args) for p in ready)))


def batches(
    chosen: list[Scenario], systems: list[str], args: argparse.Namespace
) -> list[tuple[list[Cell], bool]]:
    """The cells to run together, and whether side by side. Default: a scenario at a time, its
    cells side by side when it is bound by waiting, else one by one. ``--quick``: the others the
    same way, then every waiting-bound scenario at once. ``--serial``: every cell alone."""

    def cells(sc: Scenario) -> list[Cell]:
        return [Cell(sc, system, consumer) for consumer in sc.consumers for system in systems]

    if args.serial:
        return [(cells(sc), False) for sc in chosen]
    if not args.quick:
        return [(cells(sc), sc.parallel) for sc in chosen]
    waiting = [c for sc in chosen if sc.parallel for c in cells(sc)]
    return [(cells(sc), False) for sc in chosen if not sc.parallel] + ([(waiting, True)] if waiting else [])


def _num(value: float | None, fmt: str, missing: str = "-") -> str:
    return missing if value is None else format(value, fmt)


def print_table(results: dict[str, Any]) -> None:
    """The Markdown table: one row per scenario, caller and system."""
    columns = [
        "scenario", "caller", "system", "calls", "success", "garbled", "p50 s", "p99 s", "upstream/call",
        "on primary", "back on primary s", "to failing", "billed", "sent while open",
    ]  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|---|---|---|" + "---:|" * (len(columns) - 3))
    for name, by_consumer in results.items():
        for consumer, by_system in by_consumer.items():
            for system, m in by_system.items():
                back = m["back_on_primary_s"]
                if m["observed_after_recovery_s"] is None:
                    back_s = "-"
                elif back is None:
                    back_s = f"never (>{m['observed_after_recovery_s']:.0f})"
                else:
                    back_s = f"{back:.1f}"
                cells = [
                    name, consumer, system, str(m["calls"]), f"{m['success_rate']:.0%}", str(m["garbled"]),
                    f"{m['p50_s']:.2f}",
                    f"{m['p99_s']:.2f}", f"{m['upstream_per_call']:.2f}", f"{m['on_primary']:.0%}",
                    back_s, str(m["to_failing"]), str(m["billed"]), _num(m["sent_while_open"], "d"),
                ]  # fmt: skip
                print("| " + " | ".join(cells) + " |")


async def main() -> None:
    """Parse the options, run the chosen scenarios, print the table, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke run: fewer calls, shorter incidents")
    ap.add_argument("--calls", type=int, default=None, help="calls per cell (default 30; --quick 6)")
    ap.add_argument("--concurrency", type=int, default=20, help="closed-loop scenarios (storm, ...)")
    ap.add_argument("--warmup", type=int, default=24, help="healthy calls before measuring (plugin cells)")
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--serial", action="store_true", help="run every cell alone (slower, no contention)")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/chaos[-quick].json)")
    args = ap.parse_args()
    if args.calls is None:
        args.calls = 6 if args.quick else 30
    if args.calls < 1 or args.concurrency < 1 or args.warmup < 0:
        ap.error("--calls and --concurrency must be at least 1, --warmup at least 0")
    catalogue = scenarios(quick=args.quick)
    wanted = [s for s in args.only.split(",") if s]
    unknown = set(wanted) - {s.name for s in catalogue}
    if unknown:
        ap.error(f"unknown scenario(s) {sorted(unknown)}; choose from {[s.name for s in catalogue]}")
    systems = [s for s in args.systems.split(",") if s]
    bad = set(systems) - set(SYSTEMS)
    if bad:
        ap.error(f"unknown system(s) {sorted(bad)}; choose from {list(SYSTEMS)}")
    chosen = [s for s in catalogue if not wanted or s.name in wanted]
    results: dict[str, Any] = {}
    t0 = time.monotonic()
    with SimulatorProcess() as sim:
        for batch, side_by_side in batches(chosen, systems, args):
            t = time.monotonic()
            for cell, m in zip(batch, await run_cells(batch, sim, args, side_by_side), strict=True):
                results.setdefault(cell.scenario.name, {}).setdefault(cell.consumer, {})[cell.system] = m
            sim.reset()  # a short log for the next batch's look-ups
            names = ", ".join(dict.fromkeys(c.scenario.name for c in batch))
            print(f"  {names}: {time.monotonic() - t:.0f} s", flush=True)
    results = {sc.name: results[sc.name] for sc in chosen}
    total = time.monotonic() - t0
    mode = "quick" if args.quick else "default"
    layout = (
        "every cell alone"
        if args.serial
        else "waiting-bound scenarios all at once"
        if args.quick
        else "waiting-bound scenarios' cells side by side"
    )
    print(f"\n{mode} run: --calls {args.calls} (paced scenarios: rate x duration), plugin warm-up "
          f"{args.warmup}, concurrency {args.concurrency}, cells: {layout}, call cap {CALL_CAP:g} s, "
          f"{total:.0f} s; every system on its defaults\n")  # fmt: skip
    print_table(results)
    print()
    for sc in chosen:
        pinned = ", ".join(f"{k}={v:g}" for k, v in sc.plugin_policy.items())
        asked = ", ".join(f"{k}={v:g}" for k, v in sc.request.items())
        print(
            f"- {sc.name}: {sc.description}"
            + (f" (plugin: defaults + {pinned})" if pinned else "")
            + (f" (every caller asks {asked})" if asked else "")
        )
    out_path = args.out or str(RESULTS / f"chaos{'-quick' if args.quick else ''}.json")
    data = {
        "mode": mode,
        "calls": args.calls,
        "concurrency": args.concurrency,
        "warmup": args.warmup,
        "serial": args.serial,
        "call_cap_s": CALL_CAP,
        "total_s": total,
        "scenarios": {
            sc.name: {"description": sc.description, "plugin_policy": sc.plugin_policy} for sc in chosen
        },
        "results": results,
    }
    print(f"\nJSON: {write_json(out_path, data)}")


if __name__ == "__main__":
    asyncio.run(main())
