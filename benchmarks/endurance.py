"""Endurance: RSS stays flat over a long run that exercises everything that used to keep memory
per call - a per-call ``api_key`` (secret registry), tenant-scoped idempotency keys (memory
store), a per-request budget (ledger keys), provider-chosen model names (OTel metrics),
``include_content`` logging of large prompts, and 100 kB error bodies. Against the simulator
over loopback, scaled down in time (a guard's clock runs 60x fast so budget keys age).

    python benchmarks/endurance.py [--seconds 120] [--concurrency 8]

Prints RSS samples and the slope after warm-up (MiB per 1,000 calls; ~0 means flat).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import tempfile
import time
from typing import Any

os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")

import llm_resilience_plugin  # noqa: F401  (offline LiteLLM settings first)
from llm_resilience_plugin import Budget, CallReport, CostGuard, ResilientRouter
from llm_resilience_plugin._redaction import SECRETS
from llm_resilience_plugin.observability import attach_router_logging, instrument
from llm_resilience_plugin.testing import Fault, ProviderSimulator

try:  # run as a script (python benchmarks/x.py) or imported as benchmarks.x
    from _common import write_json
except ImportError:  # pragma: no cover
    from benchmarks._common import write_json

PRICED = {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of RSS (MiB) per 1,000 calls."""
    n = len(points)
    if n < 2:
        return float("nan")
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return 1000 * sum((x - mx) * (y - my) for x, y in points) / var if var else float("nan")


class _Discard(logging.Handler):
    """Formats every record (as a real pipeline would) and drops it."""

    def emit(self, record: logging.LogRecord) -> None:
        self.format(record)


async def run(seconds: float, concurrency: int, sample_every: int, error_every: int = 100) -> dict[str, Any]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    fast = [time.time()]
    tmp = tempfile.TemporaryDirectory()
    with ProviderSimulator() as sim:
        model_list = [
            {
                "model_name": "g",
                "model_info": {"id": d},
                "litellm_params": {
                    "model": "openai/gpt-4o-mini",
                    "api_key": "sk-endurance",
                    "api_base": sim.api_base(d),
                    **PRICED,
                },
            }
            for d in ("a", "b")
        ]
        guard = CostGuard(
            [Budget.per_request(1.0), Budget.daily(1e6)],
            ledger=f"sqlite:///{tmp.name}/ledger.db",  # the spend log on disk, as in production
            now=lambda: fast[0],
            reservation_ttl=60,
        )
        router = ResilientRouter(
            model_list=model_list, guards=[guard], idempotency_store="memory", idempotency_ttl=30
        )
        reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[reader])
        undo = instrument(router, prometheus="off", otel="on", meter_provider=provider)
        logger = logging.getLogger("llm_resilience.endurance")
        logger.addHandler(_Discard())
        logger.setLevel(logging.INFO)
        logger.propagate = False
        detach = attach_router_logging(router, logger, include_content=True)
        big = "lorem ipsum " * 400  # ~5 kB of prompt per call, logged
        sim.set_default("b", Fault.http_error(400, message="echo: " + "x" * 100_000))
        calls = 0
        samples: list[tuple[int, float, float]] = []
        held: list[int] = []
        start = time.monotonic()

        async def worker(w: int) -> None:
            nonlocal calls
            while time.monotonic() - start < seconds:
                i = calls = calls + 1
                fast[0] += 1.0  # the guard's clock: one second per call
                messages = [{"role": "user", "content": f"{i} {big}"}]
                dep = "b" if error_every and i % error_every == 0 else "a"  # a 100 kB error body
                try:
                    await router.acompletion(
                        model="g",
                        messages=messages,
                        api_key=f"byok-tenant{i % 20:02d}-0123456789abcdef",  # 20 tenants bring keys
                        idempotency_key=f"order-{i}",
                        metadata={"tenant": f"t{i % 50}"},
                        avoid_deployments=["a" if dep == "b" else "b"],
                    )
                except Exception:
                    pass
                served = CallReport(f"x{i}", "g", False, 0.0, served_model=f"gpt-4o-mini-{i}")
                served.outcome, served.deployment_id = "success", "a"
                router.events.emit(served)  # a provider naming a new model every time
                if i % sample_every == 0:
                    sim.clear_log()  # the simulator shares the process: its request log is not ours
                    gc.collect()
                    samples.append((i, time.monotonic() - start, rss_mib()))
                    held.append(len(SECRETS))

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        detach()
        undo()
        provider.shutdown()
        router.close()
    tmp.cleanup()
    warm = [(n, rss) for n, _, rss in samples[len(samples) // 3 :]]
    return {
        "calls": calls,
        "seconds": round(time.monotonic() - start, 1),
        "samples": [{"calls": n, "t_s": round(t, 1), "rss_mib": round(r, 1)} for n, t, r in samples],
        "rss_first_mib": round(samples[0][2], 1) if samples else None,
        "rss_last_mib": round(samples[-1][2], 1) if samples else None,
        "slope_mib_per_1000_calls_after_warmup": round(slope(warm), 3),
        "secrets_held_max": max(held, default=0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--sample-every", type=int, default=250)
    ap.add_argument(
        "--error-every", type=int, default=100, help="one call in N meets a 100 kB error (0: none)"
    )
    ap.add_argument("--out", default="benchmarks/results/endurance.json")
    args = ap.parse_args()
    result = asyncio.run(run(args.seconds, args.concurrency, args.sample_every, args.error_every))
    for s in result["samples"]:
        print(f"{s['calls']:>7} calls  {s['t_s']:>6.1f} s  RSS {s['rss_mib']:>7.1f} MiB")
    print(
        f"{result['calls']} calls in {result['seconds']} s; RSS {result['rss_first_mib']} -> "
        f"{result['rss_last_mib']} MiB; slope after warm-up "
        f"{result['slope_mib_per_1000_calls_after_warmup']} MiB per 1,000 calls"
    )
    print("wrote", write_json(args.out, result))


if __name__ == "__main__":
    main()
