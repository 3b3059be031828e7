"""Python function calls per successful ``acompletion``: a count, not a time, so a busy machine
does not move it.

Against the project's simulator (its own process), the bare ``litellm.Router`` and
``ResilientRouter`` (``dispatch: router``, and with ``--direct`` the default direct dispatch) each
run ``--warm`` calls, then ``--calls`` calls one at a time under cProfile. Printed per system:
every call cProfile saw (Python functions, each coroutine resume counted, and builtins) per
completion, and the plugin's share: calls of its own functions plus the calls they make to any
other function (builtins, LiteLLM, the stdlib, the generated ``__init__`` of its dataclasses),
with ``--top`` rows of each by count. The raw profiler entries are keyed by code object, so the
generated ``__init__`` methods (which pstats would merge under one ``<string>:2(__init__)``) are
told apart.

A count is a proxy: a builtin call costs far less than a Python frame, and bytecode inside a
function is not counted at all (see instructions.py and profile_overhead.py for CPU). The
plugin's share is the same from run to run; "vs bare" is not quite: the event loop's iterations
per call (``_run_once``, ``select``, ...) follow the request's timing, which moves a system's total
by some tens of calls between runs.

    python benchmarks/calls_probe.py [--calls 200] [--warm 50] [--top 40] [--direct]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import inspect
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from types import CodeType
from typing import Any

import llm_resilience_plugin  # noqa: F401  (offline LiteLLM settings first)

try:  # run as a script (python benchmarks/x.py) or imported as benchmarks.x
    from overhead import ExternalSimulator, build
except ImportError:  # pragma: no cover
    from benchmarks.overhead import ExternalSimulator, build

PKG = "llm_resilience_plugin"
Call = Callable[[], Awaitable[Any]]
SYSTEMS = {"bare": "bare", "router dispatch": "resilient-router", "direct dispatch": "resilient"}


def generated_names() -> dict[int, str]:
    """Names for the generated methods (dataclass ``__init__``, ...) of the plugin's classes, by
    the id of their code object."""
    names: dict[int, str] = {}
    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith(PKG):
            continue
        for obj in list(vars(mod).values()):
            if not (inspect.isclass(obj) and obj.__module__.startswith(PKG)):
                continue
            for meth in ("__init__", "__new__", "__eq__", "__repr__", "__hash__"):
                code = getattr(obj.__dict__.get(meth), "__code__", None)
                if isinstance(code, CodeType) and not code.co_filename.startswith("/"):
                    names[id(code)] = f"{obj.__name__}.{meth} (generated)"
    return names


def label(code: CodeType | str, generated: dict[int, str]) -> str:
    """A short name for a profiler entry's code (a builtin's is a string already)."""
    if isinstance(code, str):
        return code
    if id(code) in generated:
        return generated[id(code)]
    where = code.co_filename
    where = where.rsplit(PKG, 1)[1] if PKG in where else where.split("site-packages/")[-1]
    return f"{where.split('python3.11/')[-1]}:{code.co_firstlineno}({code.co_name})"


def is_plugin(code: CodeType | str) -> bool:
    return not isinstance(code, str) and PKG in code.co_filename


async def profiled(call: Call, n: int) -> list[Any]:
    """cProfile's raw entries over ``n`` sequential calls."""
    gc.collect()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        await call()
    prof.disable()
    return prof.getstats()  # type: ignore[no-any-return]


def count(entries: list[Any], generated: dict[int, str]) -> dict[str, Any]:
    """All calls, Python-level calls, and the plugin's own functions and what they call."""
    own: Counter[str] = Counter()
    callees: Counter[str] = Counter()
    python_callees = 0
    for e in entries:
        if not is_plugin(e.code):
            continue
        own[label(e.code, generated)] += e.callcount
        for sub in e.calls or ():
            if not is_plugin(sub.code):
                callees[label(sub.code, generated)] += sub.callcount
                python_callees += 0 if isinstance(sub.code, str) else sub.callcount
    return {
        "all": sum(e.callcount for e in entries),
        "python": sum(e.callcount for e in entries if not isinstance(e.code, str)),
        "own": own,
        "callees": callees,
        "plugin": sum(own.values()) + sum(callees.values()),
        "plugin_python": sum(own.values()) + python_callees,
    }


async def measure(args: argparse.Namespace) -> None:
    sim = ExternalSimulator()
    try:
        kinds = {k: v for k, v in SYSTEMS.items() if args.direct or v != "resilient"}
        built = {label_: build(kind, sim) for label_, kind in kinds.items()}
        generated = generated_names()
        for _, call in built.values():
            for _ in range(args.warm):
                await call()
        counts = {}
        for name, (_, call) in built.items():
            counts[name] = count(await profiled(call, args.calls), generated)
        for router, _ in built.values():
            if router is not None and hasattr(router, "engine"):
                router.close()
    finally:
        sim.stop()
    n = args.calls
    bare = counts["bare"]
    print(f"calls per successful acompletion ({n} sequential calls after {args.warm} to warm up, cProfile)")
    print("| system | all calls | Python-level | vs bare | plugin's own + what it calls | of which Python |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, c in counts.items():
        delta = "-" if name == "bare" else f"{(c['all'] - bare['all']) / n:+.1f}"
        print(
            f"| {name} | {c['all'] / n:.1f} | {c['python'] / n:.1f} | {delta} | "
            f"{c['plugin'] / n:.1f} | {c['plugin_python'] / n:.1f} |"
        )
    for name, c in counts.items():
        if name == "bare" or not args.top:
            continue
        print(f"\n{name}: the plugin's functions (a coroutine counts each resume), calls per completion")
        for what, k in c["own"].most_common(args.top):
            print(f"  {k / n:6.2f}  {what}")
        print(f"{name}: what they call outside the plugin")
        for what, k in c["callees"].most_common(args.top):
            print(f"  {k / n:6.2f}  {what}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200, help="profiled calls per system")
    ap.add_argument("--warm", type=int, default=50, help="calls per system before profiling")
    ap.add_argument("--top", type=int, default=40, help="rows per breakdown (0: none)")
    ap.add_argument("--direct", action="store_true", help="also the default (direct) dispatch")
    asyncio.run(measure(ap.parse_args()))


if __name__ == "__main__":
    main()
