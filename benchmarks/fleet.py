"""Fleet pacing benchmark: 4 worker processes share one deployment whose provider (the simulator)
enforces an RPM and a TPM limit; together they offer twice the limit with mixed priority tiers
(20 % P0, 80 % P3). Systems, each in its own run:

  router        plain litellm.Router with the limits as LiteLLM's rpm/tpm (routing weights)
  unpaced       ResilientRouter with pacing off (pacing.enabled: false)
  paced-local   ResilientRouter paced in each process (each thinks it has the whole limit)
  paced-redis   ResilientRouter paced on one redis-server shared by the four (the fleet's limit)

Each worker warms its router up on an unlimited deployment, then all start at one wall-clock time.
Per run: provider 429s, goodput (calls answered while the load was offered, a second, against the
limit), calls failed (by exception type), and the P0 p50/p99 latency, beside those of the
Redis-paced fleet at half the limit. The provider answers in --latency seconds.

    python -m benchmarks.fleet [--seconds 15] [--rpm 600] [--tpm 60000] [--workers 4]
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


def _worker(args: dict[str, Any], ready: Any, go: Any, out: Any) -> None:
    """One worker process: its own router, warmed up, then calls at its share of the offered rate
    from the common start time (wall clock, so the four workers' timelines line up)."""
    import llm_resilience_plugin  # noqa: F401  (offline LiteLLM settings first)
    from llm_resilience_plugin import ResilientRouter

    for name in ("LiteLLM Router", "LiteLLM"):
        logging.getLogger(name).setLevel(logging.CRITICAL)

    def deployment(group: str, dep_id: str, limited: bool) -> dict[str, Any]:
        base = args["api_base"] + dep_id + "/v1"
        params: dict[str, Any] = {"model": "openai/gpt-4o-mini", "api_base": base, "api_key": "sk-fleet"}
        if limited:
            params.update(rpm=args["rpm"], tpm=args["tpm"])
        return {"model_name": group, "litellm_params": params, "model_info": {"id": dep_id}}

    model_list = [deployment("primary", "shared", True), deployment("warm", "warm", False)]
    system = args["system"]

    async def run() -> list[tuple[str, float, float, bool, str]]:
        import litellm

        if system == "router":
            router: Any = litellm.Router(model_list=model_list)
        else:
            policy: dict[str, Any] = {"deadline": args["deadline"]}
            if system == "unpaced":
                policy["pacing"] = {"enabled": False}
            settings = {"redis_url": args["redis_url"]} if system == "paced-redis" else None
            router = ResilientRouter(model_list, router_settings=settings, policy=policy)
        # Warm up off the limited deployment: clients, imports and the first-call costs of a new
        # process are not what the fleet is measured on.
        for _ in range(3):
            await router.acompletion(model="warm", messages=MSG, max_tokens=4)
        ready.put(os.getpid())
        start = go.get()
        await asyncio.sleep(max(0.0, start - time.time()))
        rng = random.Random(args["seed"])
        results: list[tuple[str, float, float, bool, str]] = []

        async def one(priority: str, max_tokens: int) -> None:
            t = time.time()
            kind = ""
            try:
                if system == "router":
                    await router.acompletion(model="primary", messages=MSG, max_tokens=max_tokens)
                else:
                    await router.acompletion(
                        model="primary", messages=MSG, max_tokens=max_tokens, priority=priority
                    )
                ok = True
            except Exception as exc:
                ok, kind = False, type(exc).__name__
            results.append((priority, t, time.time(), ok, kind))

        tasks = []
        interval = 1.0 / args["rate"]
        n = 0
        while time.time() - start < args["seconds"]:
            priority = "P0" if rng.random() < 0.2 else "P3"
            tasks.append(asyncio.ensure_future(one(priority, rng.choice(args["max_tokens"]))))
            n += 1
            await asyncio.sleep(max(0.0, start + n * interval - time.time()))
        await asyncio.gather(*tasks)
        if system != "router":
            router.close()
        return results

    out.put(asyncio.run(run()))


def _run(system: str, load: float, args: argparse.Namespace, sim: Any, redis_url: str) -> dict[str, Any]:
    from benchmarks._common import pct

    limit_rps = args.rpm / 60.0
    sim.rate_limit("shared", rpm=args.rpm, tpm=args.tpm, retry_after=1.0)
    ctx = mp.get_context("spawn")
    ready, go, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    per_worker = load * limit_rps / args.workers
    base = sim.base_url + "/"
    procs = [
        ctx.Process(
            target=_worker,
            args=(
                {
                    "system": system,
                    "api_base": base,
                    "rpm": args.rpm,
                    "tpm": args.tpm,
                    "rate": per_worker,
                    "seconds": args.seconds,
                    "deadline": args.deadline,
                    "max_tokens": [int(x) for x in args.max_tokens.split(",")],
                    "seed": i,
                    "redis_url": redis_url,
                },
                ready,
                go,
                out,
            ),
        )
        for i in range(args.workers)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)
    time.sleep(1.5)  # the provider's buckets refill after the warm-ups and the last run
    before = sim.count("shared")
    start = time.time() + 0.5
    for _ in procs:
        go.put(start)
    results: list[tuple[str, float, float, bool, str]] = []
    for _ in procs:
        results.extend(out.get(timeout=args.seconds + args.deadline + 120))
    for p in procs:
        p.join(timeout=30)
    reqs = sim.requests("shared")[before:]
    refused = sum(1 for r in reqs if r.status == 429)
    # Goodput: answers to the requests sent while the load was offered (those that came back by
    # its end plus one answer time), a second, against the limit.
    end = start + args.seconds + args.latency
    in_window = sum(1 for r in results if r[3] and r[2] <= end)
    p0 = [e - t for pr, t, e, ok, _ in results if pr == "P0" and ok]
    kinds: dict[str, int] = {}
    for r in results:
        if not r[3]:
            kinds[r[4]] = kinds.get(r[4], 0) + 1
    return {
        "system": system,
        "load": load,
        "calls": len(results),
        "failed": len(results) - sum(1 for r in results if r[3]),
        "failures": kinds,
        "provider_429s": refused,
        "goodput_share": in_window / args.seconds / limit_rps,
        "p0_p99_s": pct(p0, 99),
        "p0_p50_s": pct(p0, 50),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rpm", type=float, default=600.0)
    ap.add_argument("--tpm", type=float, default=60_000.0)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--deadline", type=float, default=30.0, help="the plugin's deadline per call")
    ap.add_argument("--latency", type=float, default=0.2, help="the provider's answer time (s)")
    ap.add_argument("--max-tokens", default="32", help="max_tokens per call, drawn from this list")
    ap.add_argument("--systems", default="router,unpaced,paced-local,paced-redis")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from llm_resilience_plugin.testing import Fault, ProviderSimulator
    from tests.redis.redis_server import running_redis

    rows = []
    with ProviderSimulator() as sim, tempfile.TemporaryDirectory(), running_redis() as redis:
        sim.set_default("shared", Fault.ok(latency=args.latency))
        shared = f"{args.rpm:g} rpm / {args.tpm:g} tpm shared"
        print(
            f"{args.workers} workers, {shared}, answers in {args.latency:g} s, 20 % P0 / 80 % P3, "
            f"offered for {args.seconds:g} s, deadline {args.deadline:g} s\n"
        )
        print("| system | offered | calls | failed | provider 429s | goodput / limit | P0 p50 | P0 p99 |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        plan = [(s, 2.0) for s in args.systems.split(",")]
        if "paced-redis" in args.systems:
            plan.append(("paced-redis", 0.5))
        for system, load in plan:
            row = _run(system, load, args, sim, redis.url)
            rows.append(row)
            why = ", ".join(f"{n} {k}" for k, n in sorted(row["failures"].items()))
            print(
                f"| {system} | {load:g}x | {row['calls']} | {row['failed']}{f' ({why})' if why else ''} "
                f"| {row['provider_429s']} | {row['goodput_share']:.0%} | {row['p0_p50_s']:.2f} s "
                f"| {row['p0_p99_s']:.2f} s |",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
