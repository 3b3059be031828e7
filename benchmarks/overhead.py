"""Overhead of ResilientRouter over a bare litellm.Router on healthy providers.

Both routers run in this process against the same simulator deployments; the simulator runs in
its own process, so client CPU is the routers' own work. The machine's speed drifts by more than
the effect being measured (one process's CPU per call moved 10-13 ms between identical 2 s rounds
on the 2-core development machine), so every figure is *paired*: the two systems alternate at a
fine grain and each ratio compares neighbours in time, never one long round with another.

- sequential: one call at a time, the systems alternating in blocks of ``--block`` calls (ABBA);
  the ratio is the median of per-pair block throughput ratios (bootstrap 95 % interval). Also
  printed: the ratio of summed times over all calls, where a single long pause (a full garbage
  collection lands on one call now and then) weighs in fully, and the median call's ratio.
- N-concurrent: batches of ``--batch`` calls at ``--concurrency`` alternate (ABBA); the ratio is
  the median of per-pair throughput ratios, with a bootstrap 95 % interval of that median.
- ``--instructions`` (needs valgrind): the client process is run under cachegrind for each system
  with two call counts; the difference is the instructions one call costs, independent of noise.

- direct dispatch (issue 19): "resilient" is the default ResilientRouter (direct dispatch where it
  is equivalent); the same run also pairs the bare Router with ResilientRouter(dispatch=router) and
  with ``litellm.acompletion`` on a deployment's own params (the ceiling); ``--no-direct`` skips them.

    python benchmarks/overhead.py [--pairs 300] [--block 10] [--batches 400] [--concurrency 50]
                                  [--embedding-pairs 150] [--instructions] [--no-direct]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import llm_resilience_plugin  # noqa: F401  (offline LiteLLM settings first)
from llm_resilience_plugin import ResilientRouter

try:  # run as a script (python benchmarks/x.py) or imported as benchmarks.x
    from _common import pct, write_json
    from _overhead_embeddings import embeddings_row
except ImportError:  # pragma: no cover
    from benchmarks._common import pct, write_json
    from benchmarks._overhead_embeddings import embeddings_row
try:
    from _overhead_observability import observability_rows, print_rows
except ImportError:  # pragma: no cover
    from benchmarks._overhead_observability import observability_rows, print_rows

MSG = [{"role": "user", "content": "Say hello in five words."}]
TARGET = 0.97  # the budget: at most 3 % lower throughput than the bare Router
Call = Callable[[], Awaitable[Any]]


class ExternalSimulator:
    """The simulator in its own process, so its work does not share this process's GIL."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llm_resilience_plugin.testing._simulator", "--port", "0"],
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


def build(kind: str, sim: Any) -> tuple[Any, Call]:
    """A router and a call function; both systems use the same deployments."""
    import litellm  # after llm_resilience_plugin: its env keeps LiteLLM offline

    if kind == "bare":
        router: Any = litellm.Router(model_list=model_list(sim), num_retries=0, disable_cooldowns=True)
    elif kind == "ceiling":  # litellm.acompletion with a deployment's own params: no router at all
        deployments = [{**d["litellm_params"], "max_retries": 0} for d in model_list(sim)]

        async def direct() -> Any:
            return await litellm.acompletion(messages=MSG, **random.choice(deployments))

        return None, direct
    else:  # "resilient": the default dispatch (direct where equivalent); "resilient-router": the Router's
        dispatch = {"resilient": "auto", "resilient-router": "router"}[kind]
        router = ResilientRouter(model_list=model_list(sim), policy={"dispatch": dispatch})

    async def call() -> Any:
        return await router.acompletion(model="primary", messages=MSG)

    return router, call


async def run_calls(call: Call, n: int, concurrency: int) -> tuple[float, list[float]]:
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


def bootstrap(values: list[Any], stat: Callable[[list[Any]], float], n: int = 2000) -> tuple[float, float]:
    """A 95 % percentile-bootstrap interval of ``stat`` over ``values``."""
    rng = random.Random(7)
    boots = sorted(stat(rng.choices(values, k=len(values))) for _ in range(n))
    return boots[int(0.025 * n)], boots[int(0.975 * n) - 1]


async def sequential(systems: dict[str, Call], pairs: int, block: int) -> dict[str, Any]:
    """One call at a time, the systems alternating in blocks of ``block`` calls (ABBA)."""
    wall: dict[str, list[float]] = {"bare": [], "resilient": []}
    cpu: dict[str, list[float]] = {"bare": [], "resilient": []}
    clock, cpu_clock = time.perf_counter, time.process_time
    for i in range(pairs):
        for kind in ("bare", "resilient") if i % 2 == 0 else ("resilient", "bare"):
            call = systems[kind]
            for _ in range(block):
                c0, w0 = cpu_clock(), clock()
                await call()
                wall[kind].append(clock() - w0)
                cpu[kind].append(cpu_clock() - c0)
    call_pairs = list(zip(wall["bare"], wall["resilient"], strict=True))
    # per block pair: plugin throughput / bare throughput over the block's calls
    blocks = [
        sum(wall["bare"][j : j + block]) / sum(wall["resilient"][j : j + block])
        for j in range(0, len(wall["bare"]), block)
    ]

    def ratio(ps: list[tuple[float, float]]) -> float:  # all calls: one slow call weighs in fully
        return sum(b for b, _ in ps) / sum(r for _, r in ps)

    def median_ratio(ps: list[tuple[float, float]]) -> float:  # the typical call, outliers aside
        return statistics.median(b for b, _ in ps) / statistics.median(r for _, r in ps)

    lo, hi = bootstrap(blocks, statistics.median)
    alo, ahi = bootstrap(call_pairs, ratio)
    mlo, mhi = bootstrap(call_pairs, median_ratio, n=500)
    return {
        "pairs": pairs,
        "block": block,
        "bare_calls_per_s": len(wall["bare"]) / sum(wall["bare"]),
        "plugin_calls_per_s": len(wall["resilient"]) / sum(wall["resilient"]),
        "ratio": statistics.median(blocks),
        "ci95": [lo, hi],
        "all_calls_ratio": ratio(call_pairs),
        "all_calls_ci95": [alo, ahi],
        "median_call_ratio": median_ratio(call_pairs),
        "median_call_ci95": [mlo, mhi],
        "added_p50_ms": (pct(wall["resilient"], 50) - pct(wall["bare"], 50)) * 1e3,
        "added_p99_ms": (pct(wall["resilient"], 99) - pct(wall["bare"], 99)) * 1e3,
        "cpu_ms_per_call": [statistics.fmean(cpu["bare"]) * 1e3, statistics.fmean(cpu["resilient"]) * 1e3],
        "added_cpu_ms_median_pair": statistics.median(
            r - b for b, r in zip(cpu["bare"], cpu["resilient"], strict=True)
        )
        * 1e3,
    }


async def concurrent(systems: dict[str, Call], batches: int, batch: int, concurrency: int) -> dict[str, Any]:
    """Batches alternate (ABBA: bare, plugin, plugin, bare, ...); each pair is a bare batch and a
    plugin batch measured back to back."""
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    thr: dict[str, list[float]] = {"bare": [], "resilient": []}
    lat: dict[str, list[float]] = {"bare": [], "resilient": []}
    for i in range(batches):
        got: dict[str, tuple[float, float]] = {}
        for kind in ("bare", "resilient") if i % 2 == 0 else ("resilient", "bare"):
            gc.collect()
            c0 = time.process_time()
            elapsed, latencies = await run_calls(systems[kind], batch, concurrency)
            got[kind] = (batch / elapsed, time.process_time() - c0)
            thr[kind].append(batch / elapsed)
            lat[kind].extend(latencies)
        ratios.append(got["resilient"][0] / got["bare"][0])
        cpu_ratios.append(got["bare"][1] / got["resilient"][1])
    lo, hi = bootstrap(ratios, statistics.median)
    return {
        "pairs": batches,
        "batch": batch,
        "concurrency": concurrency,
        "bare_calls_per_s": statistics.median(thr["bare"]),
        "plugin_calls_per_s": statistics.median(thr["resilient"]),
        "ratio": statistics.median(ratios),
        "ci95": [lo, hi],
        "cpu_ratio": statistics.median(cpu_ratios),
        "cpu_ratio_ci95": list(bootstrap(cpu_ratios, statistics.median)),
        "added_p50_ms": (pct(lat["resilient"], 50) - pct(lat["bare"], 50)) * 1e3,
        "added_p99_ms": (pct(lat["resilient"], 99) - pct(lat["bare"], 99)) * 1e3,
    }


# -- instruction counts (cachegrind) ---------------------------------------------------------------


async def _client(kind: str, calls: int, concurrency: int) -> None:
    """One system alone, for cachegrind: setup, then ``calls`` calls."""
    sim = ExternalSimulator()
    try:
        router, call = build(kind, sim)
        await run_calls(call, calls, concurrency)
        if kind.startswith("resilient"):
            router.close()
    finally:
        sim.stop()


def _instructions(kind: str, calls: int, concurrency: int) -> int:
    cmd = [
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
        sys.executable,
        os.path.abspath(__file__),
        "--client",
        kind,
        str(calls),
        str(concurrency),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    m = re.search(r"I\s+refs:\s+([\d,]+)", out)
    if m is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{out[-2000:]}")
    return int(m.group(1).replace(",", ""))


def instructions(small: int, large: int, concurrency: int) -> dict[str, Any]:
    """Instructions per call = (count with ``large`` calls - count with ``small``) / difference;
    setup and import cancel out. Two valgrind processes run at a time."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(k, n) for k in ("bare", "resilient") for n in (small, large)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        found = pool.map(lambda job: _instructions(job[0], job[1], concurrency), jobs)
        counts = dict(zip(jobs, found, strict=True))
    per_call = {k: (counts[(k, large)] - counts[(k, small)]) / (large - small) for k in ("bare", "resilient")}
    return {
        "calls": [small, large],
        "concurrency": concurrency,
        "bare_instructions_per_call": per_call["bare"],
        "plugin_instructions_per_call": per_call["resilient"],
        "ratio": per_call["bare"] / per_call["resilient"],
    }


# -- main ------------------------------------------------------------------------------------------


# Direct dispatch (issue 19): ResilientRouter / bare Router >= 1.2, with the Router dispatch and the
# direct litellm.acompletion ceiling measured beside it against the same bare Router.
DIRECT_TARGET = 1.2
MORE = {"router dispatch": "resilient-router", "litellm.acompletion ceiling": "ceiling"}


async def compare_more(sim: Any, bare: Call, args: argparse.Namespace) -> dict[str, Any]:
    """Each of :data:`MORE` against the bare Router, paired (ABBA) like the main rows."""
    out: dict[str, Any] = {}
    for label, kind in MORE.items():
        router, call = build(kind, sim)
        await run_calls(call, 100, args.concurrency)
        pair = {"bare": bare, "resilient": call}
        out[f"sequential [{label}]"] = await sequential(pair, args.pairs, args.block)
        out[f"{args.concurrency}-concurrent [{label}]"] = await concurrent(
            pair, args.batches, args.batch or args.concurrency, args.concurrency
        )
        if router is not None:
            router.close()
    return out


def direct_verdict(ratio: float, ci: list[float]) -> str:
    if ci[0] >= DIRECT_TARGET:
        return "meets 1.2"
    if ci[1] < DIRECT_TARGET:
        return "misses 1.2"
    return "inconclusive (interval spans 1.2)"


def litellm_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("litellm")


def verdict(ratio: float, ci: list[float] | None = None) -> str:
    if ci is None:
        return "meets the budget" if ratio >= TARGET else "misses the budget"
    if ci[0] >= TARGET:
        return "meets the budget"
    if ci[1] < TARGET:
        return "misses the budget"
    return "inconclusive (interval spans 0.97)"


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    sim = ExternalSimulator()
    try:
        built = {kind: build(kind, sim) for kind in ("bare", "resilient")}
        systems = {kind: call for kind, (_, call) in built.items()}
        for call in systems.values():  # warm connections, client caches and code paths
            await run_calls(call, 100, args.concurrency)
        results: dict[str, Any] = {"sequential": await sequential(systems, args.pairs, args.block)}
        results[f"{args.concurrency}-concurrent"] = await concurrent(
            systems, args.batches, args.batch or args.concurrency, args.concurrency
        )
        plan = built["resilient"][0].dispatch_plan()["primary"]
        results["dispatch"] = {"litellm": litellm_version(), **plan}
        built["resilient"][0].close()
        if args.observability:  # instrumentation off / not installed / on (_overhead_observability.py)
            rows = await observability_rows(model_list(sim), args.observability, args.block)
            results["observability"] = rows
        if args.direct:  # the same run: the Router dispatch and the litellm.acompletion ceiling
            results.update(await compare_more(sim, systems["bare"], args))
        if args.embedding_pairs:  # aembedding, both systems in this run (_overhead_embeddings.py)
            results["embeddings, sequential"] = await embeddings_row(
                sim, args.embedding_pairs, args.block, sequential, run_calls
            )
        return results
    finally:
        sim.stop()


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--client":  # one system under cachegrind
        asyncio.run(_client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=300, help="sequential block pairs")
    ap.add_argument("--block", type=int, default=10, help="calls per sequential block")
    ap.add_argument("--batches", type=int, default=400, help="concurrent batch pairs")
    ap.add_argument("--batch", type=int, default=0, help="calls per batch (default: = concurrency)")
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--embedding-pairs", type=int, default=150, help="embedding block pairs (0: skip)")
    ap.add_argument("--instructions", action="store_true", help="also count instructions (valgrind)")
    ap.add_argument(
        "--no-direct",
        dest="direct",
        action="store_false",
        help="skip the router-dispatch and litellm.acompletion-ceiling rows",
    )
    ap.add_argument("--out", default="benchmarks/results/overhead.json")
    ap.add_argument("--observability", type=int, default=0, metavar="PAIRS", help="observability rows")
    args = ap.parse_args()
    results = asyncio.run(measure(args))
    if args.instructions:
        if shutil.which("valgrind") is None:
            sys.exit("--instructions needs valgrind (apt-get install valgrind)")
        results["instructions"] = instructions(20, 220, args.concurrency)

    print("| measurement | bare | plugin | plugin / bare (95 % interval) | added p50 / p99 | verdict |")
    print("|---|---:|---:|---:|---:|---|")
    dispatch = results.pop("dispatch")
    for label, r in results.items():
        if label == "observability":
            continue
        if label == "instructions":
            print(
                f"| instructions per call, {r['concurrency']} concurrent | "
                f"{r['bare_instructions_per_call'] / 1e6:.2f} M | "
                f"{r['plugin_instructions_per_call'] / 1e6:.2f} M | {r['ratio']:.3f} | - | "
                f"{verdict(r['ratio'])} |"
            )
            continue
        print(
            f"| throughput, {label} | {r['bare_calls_per_s']:.1f}/s | {r['plugin_calls_per_s']:.1f}/s | "
            f"{r['ratio']:.3f} ({r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}) | "
            f"{r['added_p50_ms']:+.2f} / {r['added_p99_ms']:+.2f} ms | {verdict(r['ratio'], r['ci95'])} |"
        )
    seq = results["sequential"]
    conc = results[f"{args.concurrency}-concurrent"]
    if dispatch["dispatcher"] == "direct":
        for label in ("sequential", f"{args.concurrency}-concurrent"):
            r = results[label]
            print(
                f"\ndirect dispatch target, {label}: ResilientRouter / bare Router {r['ratio']:.3f} "
                f"({r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}): {direct_verdict(r['ratio'], r['ci95'])}"
            )
    else:  # the Router sends every attempt: the budget is the 0.97 of the rows above
        print(
            f"\nlitellm {dispatch['litellm']}: attempts go through the Router ({dispatch['reason']}); "
            f"the target here is {TARGET} (the verdicts above), not the direct-dispatch {DIRECT_TARGET}"
        )
    print(
        f"\nsequential, all calls (ratio of summed times): {seq['all_calls_ratio']:.3f} "
        f"({seq['all_calls_ci95'][0]:.3f}-{seq['all_calls_ci95'][1]:.3f}); "
        f"median call: {seq['median_call_ratio']:.3f} "
        f"({seq['median_call_ci95'][0]:.3f}-{seq['median_call_ci95'][1]:.3f}); "
        f"{args.concurrency}-concurrent, client CPU per batch: {conc['cpu_ratio']:.3f} "
        f"({conc['cpu_ratio_ci95'][0]:.3f}-{conc['cpu_ratio_ci95'][1]:.3f})"
    )
    print(
        f"client CPU per sequential call: bare {seq['cpu_ms_per_call'][0]:.2f} ms, plugin "
        f"{seq['cpu_ms_per_call'][1]:.2f} ms "
        f"(median pair difference {seq['added_cpu_ms_median_pair']:+.3f} ms)"
    )
    if "observability" in results:
        print_rows(results["observability"])
    out = write_json(args.out, {"target": TARGET, "dispatch": dispatch, "results": results})
    print(f"JSON: {out}")


if __name__ == "__main__":
    main()
