"""Scale benchmark: memory over many calls, per-call cost with 2 vs 100 deployments, ledger speed.

Calls use LiteLLM's ``mock_response`` so the whole plugin + Router path runs without HTTP (the
simulator would cap the rate); the bare ``litellm.Router`` is measured in the same run.

    python benchmarks/scale.py [--calls 20000] [--per-call 1500]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import tempfile
import time
from typing import Any

import llm_resilience_plugin  # noqa: F401  (offline LiteLLM settings first)
from llm_resilience_plugin import ResilientRouter

try:  # run as a script (python benchmarks/x.py) or imported as benchmarks.x
    from _common import write_json
except ImportError:  # pragma: no cover
    from benchmarks._common import write_json

MSG = [{"role": "user", "content": "hi"}]


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def deployments(n: int) -> list[dict[str, Any]]:
    return [
        {
            "model_name": "g",
            "litellm_params": {
                "model": "openai/gpt-4o-mini",
                "api_key": "sk-mock",
                "api_base": f"http://127.0.0.1:9/{i}/v1",
            },
            "model_info": {"id": f"d{i}"},
        }
        for i in range(n)
    ]


async def memory_curve(calls: int) -> dict[str, Any]:
    router = ResilientRouter(model_list=deployments(2))
    samples: list[tuple[int, float]] = []
    step = max(1, calls // 20)
    for i in range(calls):
        await router.acompletion(model="g", messages=MSG, mock_response="ok")
        if i % step == 0:
            gc.collect()
            samples.append((i, rss_mib()))
    gc.collect()
    samples.append((calls, rss_mib()))
    router.close()
    half = samples[len(samples) // 2][1]
    return {
        "calls": calls,
        "rss_start_mib": samples[0][1],
        "rss_half_mib": half,
        "rss_end_mib": samples[-1][1],
        "growth_second_half_mib": samples[-1][1] - half,
        "samples": samples,
    }


async def per_call(n_deployments: int, calls: int, rounds: int = 3) -> dict[str, float]:
    """Median µs per call of each system over alternating rounds."""
    import statistics

    import litellm  # after llm_resilience_plugin: its env keeps LiteLLM offline

    bare = litellm.Router(model_list=deployments(n_deployments), num_retries=0, disable_cooldowns=True)
    plugin = ResilientRouter(model_list=deployments(n_deployments))
    systems = {
        "bare": lambda: bare.acompletion(model="g", messages=MSG, mock_response="ok"),
        "plugin": lambda: plugin.acompletion(model="g", messages=MSG, mock_response="ok"),
    }
    for call in systems.values():
        for _ in range(200):
            await call()
    samples: dict[str, list[float]] = {k: [] for k in systems}
    for i in range(rounds):
        for name in ("bare", "plugin") if i % 2 == 0 else ("plugin", "bare"):
            gc.collect()
            t = time.perf_counter()
            for _ in range(calls):
                await systems[name]()
            samples[name].append((time.perf_counter() - t) / calls * 1e6)
    plugin.close()
    out = {f"{k}_us": statistics.median(v) for k, v in samples.items()}
    out["added_us"] = out["plugin_us"] - out["bare_us"]
    return out


def ledger_ops(n: int) -> dict[str, float] | None:
    """Full CostGuard reserve + settle cycles per second (daily + monthly + per-request budgets)."""
    from llm_resilience_plugin.cost._guard import Budget, CostGuard, Price

    result: dict[str, float] = {}
    candidates = [("d0", "openai/gpt-4o-mini", Price(1e-7, 4e-7))]
    with tempfile.TemporaryDirectory() as d:
        for name, ledger in (("memory", "memory"), ("sqlite", f"sqlite:///{os.path.join(d, 'l.db')}")):
            guard = CostGuard(
                budgets=[Budget.daily(1e9), Budget.monthly(1e9), Budget.per_request(1.0)], ledger=ledger
            )
            t = time.perf_counter()
            for _ in range(n):
                ticket = guard.reserve(candidates, prompt_tokens=100, max_tokens=200)
                guard.settle(ticket, prompt_tokens=100, completion_tokens=150, deployment_id="d0")
            result[name] = n / (time.perf_counter() - t)
            guard.close()
    return result


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20000, help="calls for the memory curve")
    ap.add_argument("--per-call", type=int, default=1500, help="calls per per-call measurement")
    ap.add_argument("--ledger-ops", type=int, default=2000)
    ap.add_argument("--out", default="benchmarks/results/scale.json")
    ap.add_argument("--only", choices=["memory", "per-call", "ledger"], help="run one part only")
    args = ap.parse_args()
    if args.only == "ledger":
        for k, v in (ledger_ops(args.ledger_ops) or {}).items():
            print(f"| {k} | {v:.0f} |")
        return
    if args.only == "per-call":
        for n in (2, 100):
            m = await per_call(n, args.per_call)
            print(f"| {n} | {m['bare_us']:.0f} | {m['plugin_us']:.0f} | {m['added_us']:+.0f} |")
        return
    mem = await memory_curve(args.calls)
    pc = {n: await per_call(n, args.per_call) for n in (2, 100)}
    ledger = ledger_ops(args.ledger_ops)
    print(f"| memory over {mem['calls']} calls | RSS start MiB | RSS half-way | RSS end | growth, 2nd half |")
    print("|---|---:|---:|---:|---:|")
    print(
        f"| ResilientRouter (mock responses) | {mem['rss_start_mib']:.1f} | {mem['rss_half_mib']:.1f} | "
        f"{mem['rss_end_mib']:.1f} | {mem['growth_second_half_mib']:+.1f} |"
    )
    print("\n| deployments | bare µs/call | plugin µs/call | added µs/call |")
    print("|---:|---:|---:|---:|")
    for n, m in pc.items():
        print(f"| {n} | {m['bare_us']:.0f} | {m['plugin_us']:.0f} | {m['added_us']:+.0f} |")
    if ledger:
        print("\n| ledger | reserve+settle per second |")
        print("|---|---:|")
        for k, v in ledger.items():
            print(f"| {k} | {v:.0f} |")
    out = write_json(args.out, {"memory": mem, "per_call": pc, "ledger": ledger})
    print(f"\nJSON: {out}")


if __name__ == "__main__":
    asyncio.run(main())
