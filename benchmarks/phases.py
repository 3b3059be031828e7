"""Where a live call's wall time goes: the plugin's share before and after the wrapped Router.

``profile_overhead.py`` measures the plugin's own CPU in a hot loop around a stub; this script
measures the plugin's wall time inside real calls against the simulator, where LiteLLM's work
between two calls leaves the plugin's code and data cold. The wrapped ``litellm.Router``'s
``acompletion`` (``ResilientRouter(dispatch: router)``) or ``litellm.acompletion`` (the default,
direct dispatch) is timed from inside, so each call splits into: plugin before the request,
LiteLLM, plugin after it. One call at a time; medians and p90 over ``--calls`` after a warm-up.

``--paired N`` also runs N block pairs (10 sequential calls each, alternating order) of a bare
``litellm.Router`` against: the Router a ``ResilientRouter(dispatch: router)`` wraps, called
plainly and with the kwargs the dispatcher sends (a metadata entry and an ``httpx.Timeout``), and
the ``ResilientRouter`` itself; each line is the median throughput ratio to the bare Router.

    python benchmarks/phases.py [--calls 400] [--warmup 50] [--dispatch router|auto] [--paired 40]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import llm_resilience_plugin  # noqa: F401  (first: keeps LiteLLM offline)
from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin.testing import ProviderSimulator

MSG = [{"role": "user", "content": "hi"}]


def _timed(fn: Callable[..., Awaitable[Any]], marks: dict[str, float]) -> Callable[..., Awaitable[Any]]:
    """``fn`` noting when it was entered and when it returned."""

    async def timed(*args: Any, **kwargs: Any) -> Any:
        marks["in"] = time.perf_counter()
        out = await fn(*args, **kwargs)
        marks["out"] = time.perf_counter()
        return out

    return timed


def _summary(name: str, values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[int(0.9 * len(ordered))]
    return f"{name}: median {statistics.median(ordered):.1f} µs, p90 {p90:.1f} µs"


async def _run(
    router: ResilientRouter, marks: dict[str, float], calls: int, warmup: int
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"before": [], "litellm": [], "after": []}
    for i in range(warmup + calls):
        t0 = time.perf_counter()
        await router.acompletion(model="g", messages=MSG)
        t1 = time.perf_counter()
        if i >= warmup:
            out["before"].append((marks["in"] - t0) * 1e6)
            out["litellm"].append((marks["out"] - marks["in"]) * 1e6)
            out["after"].append((t1 - marks["out"]) * 1e6)
    return out


async def _paired(
    bare: Any, router: ResilientRouter, inner: Any, pairs: int, block: int = 10
) -> dict[str, float]:
    """Median bare/variant time ratio per block pair (a throughput ratio: above 1 is faster)."""
    import httpx

    timeout = httpx.Timeout(30.0, connect=5.0)
    n = iter(range(10**9))

    async def with_kwargs() -> Any:
        md = {"llm_resilience_attempt": f"probe:{next(n)}"}
        return await inner.acompletion(model="g", messages=MSG, metadata=md, timeout=timeout)

    variants: dict[str, Callable[[], Awaitable[Any]]] = {
        "wrapped Router, plain": lambda: inner.acompletion(model="g", messages=MSG),
        "wrapped Router, dispatcher's kwargs": with_kwargs,
        "ResilientRouter(dispatch: router)": lambda: router.acompletion(model="g", messages=MSG),
    }

    async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
        t = time.perf_counter()
        for _ in range(block):
            await fn()
        return time.perf_counter() - t

    async def plain() -> Any:
        return await bare.acompletion(model="g", messages=MSG)

    for fn in (plain, *variants.values()):
        for _ in range(20):
            await fn()
    ratios: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(pairs):
        for name, fn in variants.items():
            if i % 2:
                b = await timed(plain)
                v = await timed(fn)
            else:
                v = await timed(fn)
                b = await timed(plain)
            ratios[name].append(b / v)
    return {name: statistics.median(r) for name, r in ratios.items()}


def main() -> None:
    import litellm  # after the package: it keeps LiteLLM offline

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--dispatch", choices=("router", "auto"), default="router")
    ap.add_argument("--paired", type=int, default=0, help="block pairs of the paired probe (0: skip)")
    args = ap.parse_args()
    paired: dict[str, float] = {}
    marks: dict[str, float] = {}
    with ProviderSimulator() as sim:
        model_list = [
            {
                "model_name": "g",
                "model_info": {"id": "a"},
                "litellm_params": {
                    "model": "openai/gpt-4o-mini",
                    "api_base": sim.api_base("a"),
                    "api_key": "sk-x",
                },
            }
        ]
        router = ResilientRouter(model_list=model_list, policy={"dispatch": args.dispatch})
        original = litellm.acompletion
        try:
            if args.dispatch == "router":
                inner = router.engine.dispatcher.router  # type: ignore[attr-defined]
                inner.acompletion = _timed(inner.acompletion, marks)
            else:  # direct dispatch calls LiteLLM's module function
                litellm.acompletion = _timed(original, marks)  # type: ignore[assignment]
            split = asyncio.run(_run(router, marks, args.calls, args.warmup))
            if args.paired:
                litellm.acompletion = original  # type: ignore[assignment]
                probe = ResilientRouter(model_list=model_list, policy={"dispatch": "router"})
                bare = litellm.Router(model_list=model_list, num_retries=0, disable_cooldowns=True)
                try:
                    wrapped = probe.engine.dispatcher.router  # type: ignore[attr-defined]
                    paired = asyncio.run(_paired(bare, probe, wrapped, args.paired))
                finally:
                    probe.close()
        finally:
            litellm.acompletion = original  # type: ignore[assignment]
            router.close()
    print(f"dispatch: {args.dispatch}, {args.calls} sequential calls against the simulator")
    for name in ("before", "litellm", "after"):
        print("  " + _summary(name, split[name]))
    if paired:
        print(f"throughput against a bare litellm.Router ({args.paired} block pairs of 10 calls, median):")
        for name, ratio in paired.items():
            print(f"  {name}: {ratio:.3f}")


if __name__ == "__main__":
    main()
