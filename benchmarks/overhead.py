"""Overhead of ResilientRouter over a bare litellm.Router on healthy providers (the simulator runs
in its own process).

Both routers run in this process against the same simulator deployments, in alternating rounds,
so drift on the machine hits both alike. Prints a Markdown table and writes JSON.

    python benchmarks/overhead.py [--calls 300] [--concurrency 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from typing import Any

import llm_resilience_plugin  # noqa: F401  (offline LiteLLM settings first)
from llm_resilience_plugin import ResilientRouter

try:  # run as a script (python benchmarks/x.py) or imported as benchmarks.x
    from _common import pct, write_json
except ImportError:  # pragma: no cover
    from benchmarks._common import pct, write_json

MSG = [{"role": "user", "content": "Say hello in five words."}]


class ExternalSimulator:
    """The simulator in its own process, so its work does not share this process's GIL."""

    def __init__(self) -> None:
        import subprocess
        import sys

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llm_resilience_plugin.simulator", "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "ProviderSimulator listening on http://127.0.0.1:PORT"
        self.base_url = line.strip().rsplit(" ", 1)[-1]

    def api_base(self, deployment: str) -> str:
        return f"{self.base_url}/{deployment}/v1"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def model_list(sim: Any) -> list[dict[str, Any]]:
    return [
        {
            "model_name": "primary",
            "litellm_params": {
                "model": "openai/gpt-4o-mini",
                "api_base": sim.api_base(dep),
                "api_key": "sk-sim",
            },
            "model_info": {"id": dep},
        }
        for dep in ("a", "b")
    ]


async def run_calls(call: Any, n: int, concurrency: int) -> tuple[float, list[float]]:
    latencies: list[float] = []
    sem = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with sem:
            t = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return time.perf_counter() - t0, latencies


def build(kind: str, sim: Any) -> tuple[Any, Any]:
    """A router and a call function; both systems use the same deployments."""
    import litellm  # after llm_resilience_plugin: its env keeps LiteLLM offline

    if kind == "bare":
        router: Any = litellm.Router(model_list=model_list(sim), num_retries=0, disable_cooldowns=True)
    else:
        router = ResilientRouter(model_list=model_list(sim))

    async def call() -> Any:
        return await router.acompletion(model="primary", messages=MSG)

    return router, call


async def measure(call: Any, n: int, concurrency: int) -> dict[str, float]:
    gc.collect()
    cpu0 = time.process_time()  # this process only: the simulator runs in its own
    elapsed, lat = await run_calls(call, n, concurrency)
    cpu_ms = (time.process_time() - cpu0) / n * 1e3
    return {
        "throughput": n / elapsed,
        "p50_ms": pct(lat, 50) * 1e3,
        "p99_ms": pct(lat, 99) * 1e3,
        "cpu_ms_per_call": cpu_ms,
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", default="benchmarks/results/overhead.json")
    args = ap.parse_args()
    results: dict[str, Any] = {}
    sim = ExternalSimulator()
    try:
        systems = {kind: build(kind, sim) for kind in ("bare", "resilient")}
        for _, call in systems.values():  # warm connections, client caches and code paths
            await run_calls(call, 50, args.concurrency)
        for label, conc in (("sequential", 1), (f"{args.concurrency}-concurrent", args.concurrency)):
            runs: dict[str, list[dict[str, float]]] = {"bare": [], "resilient": []}
            for i in range(args.rounds):
                order = ("bare", "resilient") if i % 2 == 0 else ("resilient", "bare")
                for kind in order:
                    runs[kind].append(await measure(systems[kind][1], args.calls, conc))
            agg = {kind: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for kind, rs in runs.items()}
            agg["ratio"] = {"throughput": agg["resilient"]["throughput"] / agg["bare"]["throughput"]}
            agg["added_ms"] = {
                "p50": agg["resilient"]["p50_ms"] - agg["bare"]["p50_ms"],
                "p99": agg["resilient"]["p99_ms"] - agg["bare"]["p99_ms"],
            }
            ratios = sorted(
                r["throughput"] / b["throughput"]
                for r, b in zip(runs["resilient"], runs["bare"], strict=True)
            )
            agg["ratio"]["cpu"] = agg["bare"]["cpu_ms_per_call"] / agg["resilient"]["cpu_ms_per_call"]
            agg["ratio"]["per_round_min"] = ratios[0]
            agg["ratio"]["per_round_max"] = ratios[-1]
            results[label] = agg
        systems["resilient"][0].close()
    finally:
        sim.stop()
    print(
        "| workload | bare calls/s | resilient calls/s | ratio (round range) | added p50 ms | added p99 ms "
        "| client CPU ms/call bare / plugin (ratio) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, agg in results.items():
        print(
            f"| {label} | {agg['bare']['throughput']:.1f} | {agg['resilient']['throughput']:.1f} | "
            f"{agg['ratio']['throughput']:.3f} ({agg['ratio']['per_round_min']:.2f}-"
            f"{agg['ratio']['per_round_max']:.2f}) | {agg['added_ms']['p50']:+.2f} | "
            f"{agg['added_ms']['p99']:+.2f} | {agg['bare']['cpu_ms_per_call']:.2f} / "
            f"{agg['resilient']['cpu_ms_per_call']:.2f} ({agg['ratio']['cpu']:.3f}) |"
        )
    out = write_json(args.out, {"calls": args.calls, "rounds": args.rounds, "results": results})
    print(f"\nmedian of {args.rounds} alternating rounds, {args.calls} calls each; JSON: {out}")


if __name__ == "__main__":
    asyncio.run(main())
