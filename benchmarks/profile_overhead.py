"""The plugin's own CPU per healthy call, and what it is made of.

Wall-clock ratios (benchmarks/overhead.py) need a quiet machine. This script measures CPU, which a
busy machine disturbs far less, in two ways:

- **stub** (default, no sockets, a few seconds): ``ResilientRouter(dispatch: router)``'s wrapped
  ``litellm.Router`` is replaced by a stub whose ``acompletion`` returns a real response captured
  once from the simulator. Everything a call then costs beyond the stub is the plugin's own
  work: ``ResilientRouter.acompletion`` minus the stub called directly, as the median over
  ``--rounds`` alternating rounds of ``--calls`` calls (``time.process_time``), one at a time and
  ``--concurrency`` at once (the stub yields to the loop once, as a request would). ``--profile``
  adds a cProfile of the plugin's path (every function's own time per call, whatever module it is
  in: with the stub, all of it is the plugin's doing). cProfile inflates call-heavy code: read it
  for shares, the CPU figure for size. Also printed: the GC-tracked objects each call holds while
  ``--concurrency`` calls are in flight - they bring the next collection closer, and with many
  LiteLLM requests in flight a collection of the older generation costs milliseconds (see
  docs/benchmarks.md).
- **live** (``--live``): both routers against the simulator (its own process), alternating blocks
  (ABBA) of ``--block`` calls; the plugin's own CPU is the median of (plugin - bare) per block
  pair. This also catches work the plugin makes LiteLLM do (kwargs, metadata, hooks), but its
  interval is wide on a shared machine.

    python benchmarks/profile_overhead.py [--rounds 15] [--calls 2000] [--concurrency 50]
                                          [--profile] [--top 25] [--embeddings]
                                          [--live] [--blocks 40] [--block 20] [--dispatch router]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import pstats
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import llm_resilience_plugin  # noqa: F401  (offline LiteLLM settings first)

try:  # run as a script (python benchmarks/x.py) or imported as benchmarks.x
    from overhead import MSG, ExternalSimulator, build
except ImportError:  # pragma: no cover
    from benchmarks.overhead import MSG, ExternalSimulator, build

Call = Callable[[], Awaitable[Any]]
PKG = "llm_resilience_plugin"


class StubRouter:
    """Stands in for ``litellm.Router``: answers every ``acompletion`` with one captured response."""

    def __init__(self, response: Any) -> None:
        self.response = response
        self.calls = 0
        self.count_at: int | None = None  # which call reads the GC's young-generation count
        self.young: int | None = None

    async def acompletion(self, model: str, messages: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.count_at:
            self.young = gc.get_count()[0]
        await asyncio.sleep(0)  # one trip through the loop, as a real request makes
        return self.response

    async def aembedding(self, model: str, input: Any, **kwargs: Any) -> Any:
        """``--embeddings``: the captured embedding response (``acompletion``'s bookkeeping)."""
        return await self.acompletion(model, input, **kwargs)


async def held_objects(call: Call, stub: StubRouter, concurrency: int) -> float:
    """GC-tracked objects each call holds while ``concurrency`` calls are in flight (the young
    generation's count when the last one reaches the stub, per call): what makes collections
    come sooner, and costlier ones, on a router with many calls in flight."""
    gc.collect()
    gc.disable()
    try:
        stub.calls, stub.count_at, stub.young = 0, concurrency, None
        start = gc.get_count()[0]
        await asyncio.gather(*(call() for _ in range(concurrency)))
        assert stub.young is not None
        return (stub.young - start) / concurrency
    finally:
        stub.count_at = None
        gc.enable()


def stubbed(router: Any, stub: StubRouter) -> Any:
    """``router`` (a ResilientRouter with ``dispatch: router``) sending every attempt to ``stub``.

    Attempts reach the wrapped ``litellm.Router`` only through the engine's dispatcher (its public
    ``router`` attribute), so the stub goes there; ``router.litellm_router`` (introspection, not on
    the call path) keeps the real one.
    """
    dispatcher = getattr(getattr(router, "engine", None), "dispatcher", None)
    if dispatcher is not None and hasattr(dispatcher, "router"):
        dispatcher.router = stub
    return router


async def _run(call: Call, n: int, concurrency: int) -> None:
    if concurrency <= 1:
        for _ in range(n):
            await call()
        return
    for start in range(0, n, concurrency):
        await asyncio.gather(*(call() for _ in range(min(concurrency, n - start))))


def _interval(values: list[float], n: int = 2000) -> tuple[float, float]:
    rng = random.Random(7)
    boots = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(n))
    return boots[int(0.025 * n)], boots[int(0.975 * n) - 1]


class GcTimer:
    """CPU seconds spent in the garbage collector, and collections per generation."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.process_time()
        else:
            self.seconds += time.process_time() - self._t0
            self.collections[info["generation"]] += 1


async def paired_cpu(systems: dict[str, Call], rounds: int, calls: int, concurrency: int) -> dict[str, Any]:
    """CPU µs per call of each system, alternating (ABBA); the plugin's own = median pair difference.
    Also the GC's CPU µs per call and its collections per generation, per system."""
    per: dict[str, list[float]] = {"bare": [], "resilient": []}
    timers = {kind: GcTimer() for kind in per}
    for i in range(rounds):
        for kind in ("bare", "resilient") if i % 2 == 0 else ("resilient", "bare"):
            gc.collect()
            gc.callbacks.append(timers[kind])
            c0 = time.process_time()
            await _run(systems[kind], calls, concurrency)
            per[kind].append((time.process_time() - c0) / calls * 1e6)
            gc.callbacks.remove(timers[kind])
    diffs = [r - b for b, r in zip(per["bare"], per["resilient"], strict=True)]
    return {
        "bare_us": statistics.median(per["bare"]),
        "plugin_us": statistics.median(per["resilient"]),
        "own_us": statistics.median(diffs),
        "own_ci95": _interval(diffs),
        "gc_us": {k: t.seconds / (rounds * calls) * 1e6 for k, t in timers.items()},
        "gc_collections": {k: t.collections for k, t in timers.items()},
    }


def _where(key: tuple[str, int, str]) -> str:
    filename, line, name = key
    if PKG in filename:
        return f"{PKG}{filename.rsplit(PKG, 1)[1]}:{line}({name})"
    if filename == "~":
        return name
    for marker in ("site-packages/", "python3.11/"):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
    return f"{filename}:{line}({name})"


async def profile(call: Call, calls: int, concurrency: int, top: int) -> None:
    """Print the top functions by own time per call on the plugin's path."""
    prof = cProfile.Profile()
    gc.collect()
    prof.enable()
    await _run(call, calls, concurrency)
    prof.disable()
    stats: dict[Any, Any] = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = sorted(
        ((_where(k), v[2] / calls * 1e6, v[3] / calls * 1e6, v[1] / calls) for k, v in stats.items()),
        key=lambda r: -r[1],
    )
    total = sum(r[1] for r in rows)
    ours = sum(r[1] for r in rows if r[0].startswith(PKG))
    print(
        f"  under cProfile: {total:.0f} µs/call in all ({ours:.0f} in {PKG}'s own functions); "
        f"top {top} by own time (µs/call, cumulative, calls/call):"
    )
    for name, tt, ct, n in rows[:top]:
        print(f"    {tt:6.1f}  {ct:7.1f}  {n:5.1f}  {name}")


async def stub_mode(args: argparse.Namespace) -> None:
    sim = ExternalSimulator()
    try:  # one real response, captured and replayed
        _, bare_call = build("bare", sim)
        response = await bare_call()
        plugin_router, _ = build("resilient-router", sim)  # the stub stands in for the Router it wraps
    finally:
        sim.stop()
    stub = StubRouter(response)
    stubbed(plugin_router, stub)

    async def bare() -> Any:
        return await stub.acompletion(model="primary", messages=MSG)

    async def plugin() -> Any:
        return await plugin_router.acompletion(model="primary", messages=MSG)

    systems = {"bare": bare, "resilient": plugin}
    for conc in sorted({1, args.concurrency}):
        for call in systems.values():
            await _run(call, 500, conc)
        cpu = await paired_cpu(systems, args.rounds, args.calls, conc)
        print(
            f"stub, concurrency {conc} ({args.rounds} rounds of {args.calls} calls): stub alone "
            f"{cpu['bare_us']:.1f} µs, through the plugin {cpu['plugin_us']:.1f} µs; plugin's own "
            f"{cpu['own_us']:.1f} µs/call (95 % interval {cpu['own_ci95'][0]:.1f}-{cpu['own_ci95'][1]:.1f})"
        )
        if args.profile:
            await profile(plugin, min(args.calls, 2000), conc, args.top)
    held = {k: await held_objects(c, stub, args.concurrency) for k, c in systems.items()}
    print(
        f"GC-tracked objects held per call in flight ({args.concurrency} at once): stub alone "
        f"{held['bare']:.1f}, through the plugin {held['resilient']:.1f}; the plugin's own "
        f"{held['resilient'] - held['bare']:.1f}"
    )
    plugin_router.close()


async def embeddings_stub_mode(args: argparse.Namespace) -> None:
    """``--embeddings``: the stub method on ``aembedding`` (two texts, no cost guard: the
    benchmark's embeddings row); ``--profile`` shows where the plugin's time goes."""
    try:
        from _overhead_embeddings import TEXTS, build_embeddings
    except ImportError:  # pragma: no cover
        from benchmarks._overhead_embeddings import TEXTS, build_embeddings
    sim = ExternalSimulator()
    try:
        _, bare_call = build_embeddings("bare", sim)
        response = await bare_call()
        plugin_router, _ = build_embeddings("resilient", sim)
    finally:
        sim.stop()
    stub = StubRouter(response)
    stubbed(plugin_router, stub)
    via = getattr(plugin_router.engine.dispatcher, "via_router", None)  # non-chat calls go via the Router
    if via is not None and hasattr(via, "router"):
        via.router = stub

    async def bare() -> Any:
        return await stub.aembedding(model="embed", input=TEXTS)

    async def plugin() -> Any:
        return await plugin_router.aembedding(model="embed", input=TEXTS)

    systems = {"bare": bare, "resilient": plugin}
    for call in systems.values():
        await _run(call, 500, 1)
    cpu = await paired_cpu(systems, args.rounds, args.calls, 1)
    print(
        f"stub aembedding ({args.rounds} rounds of {args.calls} calls): stub alone {cpu['bare_us']:.1f} µs, "
        f"through the plugin {cpu['plugin_us']:.1f} µs; plugin's own {cpu['own_us']:.1f} µs/call "
        f"(95 % interval {cpu['own_ci95'][0]:.1f}-{cpu['own_ci95'][1]:.1f})"
    )
    if args.profile:
        await profile(plugin, min(args.calls, 2000), 1, args.top)
    plugin_router.close()


async def live_mode(args: argparse.Namespace) -> None:
    sim = ExternalSimulator()
    try:
        plugin_kind = "resilient-router" if args.dispatch == "router" else "resilient"
        built = {"bare": build("bare", sim), "resilient": build(plugin_kind, sim)}
        systems = {kind: call for kind, (_, call) in built.items()}
        for call in systems.values():  # warm connections, caches, code paths
            await _run(call, 100, max(args.concurrency, 1))
        for conc in sorted({1, args.concurrency}):
            cpu = await paired_cpu(systems, args.blocks, args.block if conc == 1 else conc, conc)
            print(
                f"live, concurrency {conc} ({args.blocks} block pairs): bare {cpu['bare_us']:.0f} µs, "
                f"plugin {cpu['plugin_us']:.0f} µs; plugin's own {cpu['own_us']:+.0f} µs/call "
                f"(95 % interval {cpu['own_ci95'][0]:+.0f} to {cpu['own_ci95'][1]:+.0f})"
            )
            print(
                f"  GC: bare {cpu['gc_us']['bare']:.0f} µs/call, collections per generation "
                f"{cpu['gc_collections']['bare']}; plugin {cpu['gc_us']['resilient']:.0f} µs/call, "
                f"{cpu['gc_collections']['resilient']}"
            )
        built["resilient"][0].close()
    finally:
        sim.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15, help="stub: round pairs")
    ap.add_argument("--calls", type=int, default=2000, help="stub: calls per round")
    ap.add_argument("--concurrency", type=int, default=50, help="calls in flight at once (besides 1)")
    ap.add_argument("--profile", action="store_true", help="stub: also show where the time goes (cProfile)")
    ap.add_argument("--top", type=int, default=25, help="rows of the profile")
    ap.add_argument("--live", action="store_true", help="against the simulator instead of the stub")
    ap.add_argument("--embeddings", action="store_true", help="stub: aembedding instead of acompletion")
    ap.add_argument("--blocks", type=int, default=40, help="live: block pairs")
    ap.add_argument("--block", type=int, default=20, help="live: sequential calls per block")
    ap.add_argument(
        "--dispatch",
        choices=("router", "auto"),
        default="router",
        help="live: the plugin's dispatch (router: the wrapped Router; auto: direct where equivalent)",
    )
    args = ap.parse_args()
    if args.embeddings:
        asyncio.run(embeddings_stub_mode(args))
        return
    asyncio.run(live_mode(args) if args.live else stub_mode(args))


if __name__ == "__main__":
    main()
