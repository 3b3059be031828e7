"""Chaos benchmark: scripted failure scenarios against the same simulator, four systems compared.

Systems (all measured in one run, same deployments, same workload):
  bare      litellm.Router with its defaults (+ the same fallbacks)
  tuned     litellm.Router tuned: num_retries=2, allowed_fails=2, cooldown_time=5, timeout, fallbacks
  langchain ChatLiteLLMRouter(...).with_retry(3 tries, jitter).with_fallbacks([...]) (LangChain's own tools)
  plugin    ResilientRouter with its default policy (deadline/attempt timeout as below)

Metrics per scenario and system: success rate, p50/p99 latency, upstream requests per logical
request, requests that hit a failing deployment, billed requests (2xx answers the provider
charged for, duplicates included). Prints a Markdown table and writes JSON.

    python benchmarks/chaos.py [--calls 200] [--concurrency 20] [--only storm,outage]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import llm_resilience_plugin  # noqa: F401  (offline LiteLLM settings first)
from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator

try:  # run as a script (python benchmarks/x.py) or imported as benchmarks.x
    from _common import pct, write_json
except ImportError:  # pragma: no cover
    from benchmarks._common import pct, write_json

MSG = [{"role": "user", "content": "Give me one sentence about resilience."}]
ATTEMPT_TIMEOUT = 1.0
DEADLINE = 8.0


@dataclass
class Scenario:
    name: str
    description: str
    groups: dict[str, list[str]]
    fallbacks: list[dict[str, list[str]]]
    setup: Callable[[ProviderSimulator], None]
    during: Callable[[ProviderSimulator, float], None] | None = None  # called every ~50 ms


def _storm(sim: ProviderSimulator) -> None:
    sim.token_bucket("p-a", rate=15, burst=5, retry_after=1)
    sim.token_bucket("p-b", rate=15, burst=5, retry_after=1)


def _outage(sim: ProviderSimulator) -> None:
    sim.set_default("p-a", Fault.server_error(503))


def _silent(sim: ProviderSimulator) -> None:
    sim.set_default("p-a", Fault.silence(max_hold=10))


def _flap_setup(sim: ProviderSimulator) -> None:
    sim.set_default("p-a", Fault.ok())


def _flap_tick(sim: ProviderSimulator, t: float) -> None:
    # down 1 s, up 1 s, ...
    phase = int(t) % 2
    if phase == 0:
        sim.set_default("p-a", Fault.server_error(503))
    else:
        sim.set_default("p-a", Fault.ok())


def _three(sim: ProviderSimulator) -> None:
    for i, dep in enumerate(("x-a", "y-a", "z-a")):
        sim.set_default(dep, Fault.flaky(0.05, Fault.server_error(500), seed=100 + i))


SCENARIOS = [
    Scenario(
        "storm",
        "429 storm: both primary deployments behind a 15 req/s token bucket (Retry-After: 1)",
        {"primary": ["p-a", "p-b"], "backup": ["b-a"]},
        [{"primary": ["backup"]}],
        _storm,
    ),
    Scenario(
        "outage",
        "hard outage: one of two primary deployments answers 503 throughout",
        {"primary": ["p-a", "p-b"], "backup": ["b-a"]},
        [{"primary": ["backup"]}],
        _outage,
    ),
    Scenario(
        "silent",
        "silent provider: one of two primary deployments never answers",
        {"primary": ["p-a", "p-b"], "backup": ["b-a"]},
        [{"primary": ["backup"]}],
        _silent,
    ),
    Scenario(
        "flapping",
        "flapping primary: the only primary deployment is down 1 s, up 1 s",
        {"primary": ["p-a"], "backup": ["b-a"]},
        [{"primary": ["backup"]}],
        _flap_setup,
        _flap_tick,
    ),
    Scenario(
        "three-5pct",
        "three providers, each failing 5% of calls independently (x -> y -> z)",
        {"x": ["x-a"], "y": ["y-a"], "z": ["z-a"]},
        [{"x": ["y", "z"]}],
        _three,
    ),
]


def model_list(sim: ProviderSimulator, groups: dict[str, list[str]]) -> list[dict[str, Any]]:
    return [
        {
            "model_name": g,
            "litellm_params": {
                "model": "openai/gpt-4o-mini",
                "api_base": sim.api_base(d),
                "api_key": "sk-sim",
                "input_cost_per_token": 1e-6,
                "output_cost_per_token": 2e-6,
            },
            "model_info": {"id": d},
        }
        for g, deps in groups.items()
        for d in deps
    ]


Call = Callable[[], Awaitable[Any]]
# Breaker transitions of the plugin run in progress: (deployment, monotonic time, new state).
OPENED: list[tuple[str, float, str]] = []


def sent_while_open(requests: list[Any]) -> int:
    """Requests that reached a deployment while the plugin held its breaker open (probes excluded)."""
    count = 0
    for r in requests:
        state = "closed"
        for dep, t, new in OPENED:
            if dep == r.deployment and t <= r.started_at:
                state = new
        if state == "open":
            count += 1
    return count


def build(system: str, sim: ProviderSimulator, sc: Scenario) -> tuple[Call, Callable[[], None]]:
    import litellm  # after llm_resilience_plugin: its env keeps LiteLLM offline

    first = next(iter(sc.groups))
    ml = model_list(sim, sc.groups)
    if system == "bare":
        r = litellm.Router(model_list=ml, fallbacks=sc.fallbacks)
        return (lambda: r.acompletion(model=first, messages=MSG)), (lambda: None)
    if system == "tuned":
        r = litellm.Router(
            model_list=ml,
            fallbacks=sc.fallbacks,
            num_retries=2,
            allowed_fails=2,
            cooldown_time=5,
            timeout=ATTEMPT_TIMEOUT,
            retry_after=0,
        )
        return (lambda: r.acompletion(model=first, messages=MSG)), (lambda: None)
    if system == "langchain":
        from langchain_litellm import ChatLiteLLMRouter

        r = litellm.Router(model_list=ml, num_retries=0, timeout=ATTEMPT_TIMEOUT)
        chain = sc.fallbacks[0][first]

        def model(group: str) -> Any:
            return ChatLiteLLMRouter(router=r, model=group, max_retries=0).with_retry(
                stop_after_attempt=3, wait_exponential_jitter=True
            )

        runnable = model(first).with_fallbacks([model(g) for g in chain])
        return (lambda: runnable.ainvoke(MSG)), (lambda: None)
    rr = ResilientRouter(
        model_list=ml,
        fallbacks=sc.fallbacks,
        policy={"attempt_timeout": ATTEMPT_TIMEOUT, "deadline": DEADLINE},
    )
    OPENED.clear()

    def on_event(e: Any) -> None:
        if type(e).__name__ == "BreakerTransition":
            if e.new_state == "open":
                OPENED.append((e.deployment_id, time.monotonic(), "open"))
            elif e.old_state == "open":
                OPENED.append((e.deployment_id, time.monotonic(), e.new_state))

    rr.subscribe(on_event)
    return (lambda: rr.acompletion(model=first, messages=MSG)), rr.close


async def run_one(system: str, sc: Scenario, sim: ProviderSimulator, calls: int, conc: int) -> dict[str, Any]:
    sim.reset()
    sc.setup(sim)
    call, close = build(system, sim, sc)
    sem = asyncio.Semaphore(conc)
    lat: list[float] = []
    ok = 0
    t_start = time.monotonic()
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            if sc.during is not None:
                sc.during(sim, time.monotonic() - t_start)
            await asyncio.sleep(0.05)

    async def one() -> None:
        nonlocal ok
        async with sem:
            t = time.monotonic()
            try:
                await asyncio.wait_for(call(), timeout=DEADLINE + 5)
                ok += 1
            except Exception:
                pass
            lat.append(time.monotonic() - t)

    tick = asyncio.create_task(ticker())
    await asyncio.gather(*(one() for _ in range(calls)))
    stop.set()
    await tick
    close()
    reqs = sim.requests()
    faulted = sum(1 for r in reqs if r.behavior not in ("ok", "flaky:ok"))
    billed = sum(1 for r in reqs if r.status == 200)
    return {
        "success_rate": ok / calls,
        "p50_s": pct(lat, 50),
        "p99_s": pct(lat, 99),
        "upstream_per_call": len(reqs) / calls,
        "to_failing": faulted,
        "billed": billed,
        "sent_while_open": sent_while_open(reqs) if system == "plugin" else None,
        "wall_s": time.monotonic() - t_start,
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=20)
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--systems", default="bare,tuned,langchain,plugin")
    ap.add_argument("--out", default="benchmarks/results/chaos.json")
    args = ap.parse_args()
    wanted = {s for s in args.only.split(",") if s}
    systems = [s for s in args.systems.split(",") if s]
    results: dict[str, dict[str, Any]] = {}
    with ProviderSimulator() as sim:
        for sc in SCENARIOS:
            if wanted and sc.name not in wanted:
                continue
            results[sc.name] = {}
            for system in systems:
                results[sc.name][system] = await run_one(system, sc, sim, args.calls, args.concurrency)
    print(f"calls per cell: {args.calls}, concurrency {args.concurrency}\n")
    columns = ["scenario", "system", "success", "p50 s", "p99 s", "upstream/call", "to failing", "billed"]
    print("| " + " | ".join([*columns, "sent while open"]) + " |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, by_system in results.items():
        for system, m in by_system.items():
            print(
                f"| {name} | {system} | {m['success_rate']:.1%} | {m['p50_s']:.3f} | {m['p99_s']:.3f} | "
                f"{m['upstream_per_call']:.2f} | {m['to_failing']} | {m['billed']} | "
                f"{'-' if m['sent_while_open'] is None else m['sent_while_open']} |"
            )
    print()
    for sc in SCENARIOS:
        if sc.name in results:
            print(f"- {sc.name}: {sc.description}")
    out = write_json(args.out, {"calls": args.calls, "concurrency": args.concurrency, "results": results})
    print(f"\nJSON: {out}")


if __name__ == "__main__":
    asyncio.run(main())
