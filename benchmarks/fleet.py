"""Fleet pacing benchmark: 4 worker processes share one deployment whose provider (the simulator)
enforces an RPM and a TPM limit; together they offer twice the limit with mixed priority tiers
(20 % P0, 80 % P3). Systems, each in its own run:

  router        plain litellm.Router with the limits as LiteLLM's rpm/tpm (routing weights)
  unpaced       ResilientRouter with pacing off (pacing.enabled: false)
  paced-local   ResilientRouter paced in each process (each thinks it has the whole limit)
  paced-redis   ResilientRouter paced on one redis-server shared by the four (the fleet's limit)

Per run: provider 429s, goodput (answered calls a second against the limit), calls failed, and the
P0 p99 latency, beside the P0 p99 of the Redis-paced fleet at half the limit.

    python -m benchmarks.fleet [--seconds 10] [--rpm 600] [--tpm 60000] [--workers 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing as mp
import os
import random
import tempfile
import time
from typing import Any

os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

MSG = [{"role": "user", "content": "hello there"}]


def _worker(args: dict[str, Any], out: Any) -> None:
    """One worker process: its own router, calls at its share of the offered rate."""
    import llm_resilience_plugin  # noqa: F401  (offline LiteLLM settings first)
    from llm_resilience_plugin import ResilientRouter

    for name in ("LiteLLM Router", "LiteLLM"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    model_list = [
        {
            "model_name": "primary",
            "litellm_params": {
                "model": "openai/gpt-4o-mini",
                "api_base": args["api_base"],
                "api_key": "sk-fleet",
                "rpm": args["rpm"],
                "tpm": args["tpm"],
            },
            "model_info": {"id": "shared"},
        }
    ]
    system = args["system"]

    async def run() -> list[tuple[str, float, bool]]:
        import litellm

        if system == "router":
            router: Any = litellm.Router(model_list=model_list)
        else:
            policy: dict[str, Any] = {"deadline": 30}
            if system == "unpaced":
                policy["pacing"] = {"enabled": False}
            settings = {"redis_url": args["redis_url"]} if system == "paced-redis" else None
            router = ResilientRouter(model_list, router_settings=settings, policy=policy)
        rng = random.Random(args["seed"])
        results: list[tuple[str, float, bool]] = []

        async def one(priority: str) -> None:
            t = time.monotonic()
            try:
                if system == "router":
                    await router.acompletion(model="primary", messages=MSG, max_tokens=32)
                else:
                    await router.acompletion(model="primary", messages=MSG, max_tokens=32, priority=priority)
                ok = True
            except Exception:
                ok = False
            results.append((priority, time.monotonic() - t, ok))

        tasks = []
        interval = 1.0 / args["rate"]
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < args["seconds"]:
            tasks.append(asyncio.ensure_future(one("P0" if rng.random() < 0.2 else "P3")))
            n += 1
            await asyncio.sleep(max(0.0, start + n * interval - time.monotonic()))
        await asyncio.gather(*tasks)
        if system != "router":
            router.close()
        return results

    out.put(asyncio.run(run()))


def _run(system: str, load: float, args: argparse.Namespace, sim: Any, redis_url: str) -> dict[str, Any]:
    from benchmarks._common import pct

    limit_rps = args.rpm / 60.0
    sim.rate_limit("shared", rpm=args.rpm, tpm=args.tpm, retry_after=1.0)
    before = sim.count("shared")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    per_worker = load * limit_rps / args.workers
    procs = [
        ctx.Process(
            target=_worker,
            args=(
                {
                    "system": system,
                    "api_base": sim.api_base("shared"),
                    "rpm": args.rpm,
                    "tpm": args.tpm,
                    "rate": per_worker,
                    "seconds": args.seconds,
                    "seed": i,
                    "redis_url": redis_url,
                },
                q,
            ),
        )
        for i in range(args.workers)
    ]
    for p in procs:
        p.start()
    results: list[tuple[str, float, bool]] = []
    for _ in procs:
        results.extend(q.get(timeout=args.seconds + 120))
    for p in procs:
        p.join(timeout=30)
    reqs = sim.requests("shared")[before:]
    refused = sum(1 for r in reqs if r.status == 429)
    answered = [r for r in results if r[2]]
    span = max(args.seconds, max((r[1] for r in results), default=0.0))
    p0 = [lat for pr, lat, ok in results if pr == "P0" and ok]
    return {
        "system": system,
        "load": load,
        "calls": len(results),
        "failed": len(results) - len(answered),
        "provider_429s": refused,
        "goodput_share": len(answered) / span / limit_rps,
        "p0_p99_s": pct(p0, 99),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rpm", type=float, default=600.0)
    ap.add_argument("--tpm", type=float, default=60_000.0)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--systems", default="router,unpaced,paced-local,paced-redis")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from llm_resilience_plugin.testing._simulator import ProviderSimulator
    from tests.redis.redis_server import running_redis

    rows = []
    with ProviderSimulator() as sim, tempfile.TemporaryDirectory(), running_redis() as redis:
        shared = f"{args.rpm:g} rpm / {args.tpm:g} tpm shared"
        print(f"{args.workers} workers, {shared}, offered 2x, {args.seconds:g} s\n")
        print("| system | load | calls | failed | provider 429s | goodput / limit | P0 p99 |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        plan = [(s, 2.0) for s in args.systems.split(",")]
        if "paced-redis" in args.systems:
            plan.append(("paced-redis", 0.5))
        for system, load in plan:
            row = _run(system, load, args, sim, redis.url)
            rows.append(row)
            print(
                f"| {system} | {load:g}x | {row['calls']} | {row['failed']} | {row['provider_429s']} "
                f"| {row['goodput_share']:.0%} | {row['p0_p99_s']:.2f} s |",
                flush=True,
            )
            time.sleep(2.0)  # the provider's buckets refill between runs
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
