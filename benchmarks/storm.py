"""Rate-limit storm benchmark: N concurrent calls into deployments whose provider allows R requests
a second (the simulator's token bucket: burst R, refilled at R/s, 429 above it, with or without
``Retry-After``), on defaults, beside a plain ``litellm.Router`` and ``Router(num_retries=5)`` in
the same run.

Setups (each system gets its own simulator deployments, so no system eats another's limit):
  single    one deployment in the group asked for (one API key)
  siblings  two limited deployments in the group
  fallback  one limited deployment, and a fallback group of one limited deployment
  rpm       one deployment with ``rpm`` in its ``litellm_params`` (the limit known in advance),
            provider allowing a little more than that rpm

Per row: calls failed, upstream requests per call, provider 429s, wall time, p50/p99 latency.

    python benchmarks/storm.py [--calls 100] [--rate 10] [--setups single,siblings,fallback,rpm]
                               [--no-retry-after] [--json benchmarks/results/storm.json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import llm_resilience_plugin  # noqa: F401  (offline LiteLLM settings first)
from benchmarks._common import pct, write_json
from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator

os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
MSG = [{"role": "user", "content": "hello"}]
_ids = itertools.count()


@dataclass
class Row:
    setup: str
    system: str
    calls: int
    failed: int
    requests_per_call: float
    provider_429s: int
    wall_s: float
    p50_s: float
    p99_s: float

    def line(self) -> str:
        return (
            f"| {self.setup} | {self.system} | {100 * self.failed / self.calls:.1f} % "
            f"| {self.requests_per_call:.2f} | {self.provider_429s} | {self.wall_s:.1f} s "
            f"| {self.p50_s:.2f} s | {self.p99_s:.2f} s |"
        )


def _entry(sim: ProviderSimulator, group: str, dep: str, **params: Any) -> dict[str, Any]:
    return {
        "model_name": group,
        "litellm_params": {
            "model": "openai/gpt-4o-mini",
            "api_base": sim.api_base(dep),
            "api_key": "sk-bench",
            **params,
        },
        "model_info": {"id": dep},
    }


def _layout(
    setup: str, sim: ProviderSimulator, tag: str, rate: float
) -> tuple[list[dict[str, Any]], list[str], Any]:
    """(model list, the limited deployments, fallbacks) of one setup for one system."""
    a, b = f"{tag}-a", f"{tag}-b"
    if setup == "single":
        return [_entry(sim, "primary", a)], [a], None
    if setup == "siblings":
        return [_entry(sim, "primary", a), _entry(sim, "primary", b)], [a, b], None
    if setup == "fallback":
        return [_entry(sim, "primary", a), _entry(sim, "backup", b)], [a, b], [{"primary": ["backup"]}]
    if setup == "rpm":
        return [_entry(sim, "primary", a, rpm=int(rate * 60))], [a], None
    raise SystemExit(f"unknown setup {setup!r}")


async def _run_one(
    setup: str, system: str, sim: ProviderSimulator, calls: int, rate: float, retry_after: float | None
) -> Row:
    import litellm

    tag = f"{system}-{setup}-{next(_ids)}"
    model_list, limited, fallbacks = _layout(setup, sim, tag, rate)
    for dep in limited:
        sim.set_default(dep, Fault.ok(ttft=0.05))
    kwargs: dict[str, Any] = {"fallbacks": fallbacks} if fallbacks else {}
    if system == "plugin":
        router: Any = ResilientRouter(model_list, **kwargs)
    elif system == "router":
        router = litellm.Router(model_list=model_list, **kwargs)
    else:
        router = litellm.Router(model_list=model_list, num_retries=5, **kwargs)
    # One healthy call first (clients built, nothing measured), then the limit and the storm.
    await router.acompletion(model="primary", messages=MSG)
    # The provider allows ``rate`` requests a second; with an rpm set, a quarter more than it.
    provider_rate = rate * 1.25 if setup == "rpm" else rate
    for dep in limited:
        sim.token_bucket(dep, rate=provider_rate, burst=max(1, int(provider_rate)), retry_after=retry_after)
    before = {dep: sim.count(dep) for dep in limited}
    latencies: list[float] = []
    failed = 0

    async def one() -> None:
        nonlocal failed
        t = time.monotonic()
        try:
            await router.acompletion(model="primary", messages=MSG)
        except Exception:
            failed += 1
        latencies.append(time.monotonic() - t)

    t0 = time.monotonic()
    await asyncio.gather(*(one() for _ in range(calls)))
    wall = time.monotonic() - t0
    sent = sum(sim.count(dep) - before[dep] for dep in limited)
    refused = sum(1 for dep in limited for r in sim.requests(dep)[before[dep] :] if r.status == 429)
    if system == "plugin":
        router.close()
    return Row(
        setup, system, calls, failed, sent / calls, refused, wall, pct(latencies, 50), pct(latencies, 99)
    )


def _quiet() -> None:
    """LiteLLM logs every failed fallback at ERROR: the table is the output."""
    for name in ("LiteLLM Router", "LiteLLM", "LiteLLM Proxy"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


async def main_async(args: argparse.Namespace) -> list[Row]:
    _quiet()
    rows: list[Row] = []
    retry_after = None if args.no_retry_after else 1.0
    with ProviderSimulator() as sim:
        for setup in args.setups.split(","):
            for system in ("router", "router-retries5", "plugin"):
                rows.append(await _run_one(setup, system, sim, args.calls, args.rate, retry_after))
                print(rows[-1].line(), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--rate", type=float, default=10.0, help="requests a second each deployment allows")
    p.add_argument("--setups", default="single,siblings,fallback,rpm")
    p.add_argument("--no-retry-after", action="store_true", help="429s without a Retry-After header")
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = p.parse_args()
    ra = "no Retry-After" if args.no_retry_after else "Retry-After: 1"
    print(f"{args.calls} concurrent calls, {args.rate:g} requests/s per deployment, {ra}\n")
    print("| setup | system | calls failed | requests per call | provider 429s | wall | p50 | p99 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    rows = asyncio.run(main_async(args))
    if args.json:
        write_json(args.json, {"args": vars(args), "rows": [asdict(r) for r in rows]})


if __name__ == "__main__":
    main()
