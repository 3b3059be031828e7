"""Instructions per call (callgrind), not wall time: what one call costs the client process.

Wall-time ratios need a quiet machine; an instruction count does not care how busy the machine is.
The client runs under ``valgrind --tool=callgrind --instr-atstart=no``: imports, set-up and warm-up
run uninstrumented; then, for every variant in turn (``--rounds`` rounds, the order reversed every
other round), the counters are zeroed, ``--calls`` calls run (``--concurrency`` at once) and the
count is dumped under the variant's name, through callgrind's client requests (a ten-line C
helper compiled here with ``gcc``). Each call's background work (LiteLLM's logging worker) is
drained inside its segment. The simulator runs in its own, uninstrumented process: only the
client's instructions are counted, so the simulator adds no noise. Also counted per segment: the
garbage collector's runs per generation, and the new keys in LiteLLM's HTTP-client cache (it builds
an SDK client, with its own connection pool, per distinct ``timeout`` value).

Under callgrind a call takes ~100x longer, so latency-driven behaviour (learned timeouts) sees
slow answers: read a variant's count together with its new clients.

Variants (all against the same simulator deployments, group ``primary`` with two deployments):

- ``bare``: ``litellm.Router.acompletion(model=, messages=)``, the Router's retries and cooldowns off;
- ``bare+metadata``: the same with a new ``metadata={attempt token}`` dict per call, as
  ``RouterDispatcher`` used to send on every attempt;
- ``bare+timeout``: the same with the ``httpx.Timeout(attempt, connect=5)`` the dispatcher sends;
- ``bare+timeout-float``: the same with the attempt timeout as a plain float;
- ``bare+both``: metadata and ``httpx.Timeout`` together;
- ``inner``: the ``litellm.Router`` a ``ResilientRouter(dispatch: router)`` wraps, called plainly
  (what its construction changes);
- ``inner+kwargs``: the same with exactly the kwargs ``RouterDispatcher.attempt_kwargs`` builds for
  an attempt (the default 30 s attempt timeout, 5 s connect);
- ``router``: ``ResilientRouter(dispatch: router)``;
- ``direct``: the default ``ResilientRouter`` (direct dispatch), for reference;
- ``stub`` / ``router+stub``: profile_overhead.py's stub Router (answers a captured response) alone
  and under ``ResilientRouter(dispatch: router)``: the difference is the plugin's own work.
- ``direct+stub``: the default ``ResilientRouter`` (direct dispatch) with ``litellm.acompletion``
  swapped for the same stub during each call: the plugin's own work plus the Router's shaping of
  the request that a direct attempt reproduces (against ``stub``).

    python benchmarks/instructions.py [--calls 30] [--stub-calls 1000] [--rounds 2] [--concurrency 1]
                                      [--variants bare,router,...] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import llm_resilience_plugin  # noqa: F401  (offline LiteLLM settings first)

try:  # run as a script (python benchmarks/x.py) or imported as benchmarks.x
    from _common import write_json
    from overhead import MSG, ExternalSimulator, build, model_list
except ImportError:  # pragma: no cover
    from benchmarks._common import write_json
    from benchmarks.overhead import MSG, ExternalSimulator, build, model_list

Call = Callable[[], Awaitable[Any]]
VARIANTS = (
    "bare",
    "bare+metadata",
    "bare+timeout",
    "bare+timeout-float",
    "bare+both",
    "inner",
    "inner+kwargs",
    "router",
    "direct",
    "stub",
    "router+stub",
    "direct+stub",
)
ATTEMPT_TIMEOUT = 30.0  # the policy's default attempt timeout
CONNECT_TIMEOUT = 5.0

_HELPER_C = """
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void cg_zero(void) { CALLGRIND_ZERO_STATS; }
void cg_dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
"""


def compile_helper(directory: Path) -> Path:
    """The client-request helper as a shared library (needs gcc and valgrind's headers)."""
    src, lib = directory / "cg_helper.c", directory / "cg_helper.so"
    src.write_text(_HELPER_C)
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


class _Sim:
    """The simulator's address, as ``overhead.build`` expects it (the parent runs the simulator)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def api_base(self, deployment: str) -> str:
        return f"{self.base_url}/{deployment}/v1"


async def systems(base_url: str, names: list[str]) -> tuple[dict[str, Call], list[Any]]:
    """The call function of each variant, and the ResilientRouters to close at the end."""
    import httpx
    import litellm

    sim = _Sim(base_url)
    bare = litellm.Router(model_list=model_list(sim), num_retries=0, disable_cooldowns=True)
    timeout = httpx.Timeout(ATTEMPT_TIMEOUT, connect=CONNECT_TIMEOUT)
    counter = iter(range(10**9))

    def token() -> dict[str, str]:  # a new dict per attempt, as the dispatcher built one
        return {"_llm_resilience_attempt": f"1:c{next(counter):x}:{next(counter)}"}

    extra: dict[str, Callable[[], dict[str, Any]]] = {
        "bare": dict,
        "bare+metadata": lambda: {"metadata": token()},
        "bare+timeout": lambda: {"timeout": timeout},
        "bare+timeout-float": lambda: {"timeout": ATTEMPT_TIMEOUT},
        "bare+both": lambda: {"metadata": token(), "timeout": timeout},
    }
    calls: dict[str, Call] = {}
    closers: list[Any] = []
    stub: Any = None
    if {"stub", "router+stub", "direct+stub"} & set(names):  # one real response, replayed by the stub
        try:
            from profile_overhead import StubRouter
        except ImportError:  # pragma: no cover
            from benchmarks.profile_overhead import StubRouter
        stub = StubRouter(await bare.acompletion(model="primary", messages=MSG))
    for name in names:
        if name in extra:
            more = extra[name]

            async def call(more: Callable[[], dict[str, Any]] = more) -> Any:
                return await bare.acompletion(model="primary", messages=MSG, **more())

            calls[name] = call
        elif name in ("stub", "router+stub", "direct+stub"):
            calls[name] = stub_call(name, sim, stub, closers)
        elif name.startswith("inner"):
            router, _ = build("resilient-router", sim)
            closers.append(router)
            inner, dispatcher = router.litellm_router, router.engine.dispatcher

            def kwargs(name: str = name, dispatcher: Any = dispatcher) -> dict[str, Any]:
                if name == "inner":
                    return {}
                tok = next(iter(token().values()))
                return dict(dispatcher.attempt_kwargs(False, tok, ATTEMPT_TIMEOUT, CONNECT_TIMEOUT, {}))

            async def call_inner(inner: Any = inner, kwargs: Callable[[], dict[str, Any]] = kwargs) -> Any:
                return await inner.acompletion(model="primary", messages=MSG, **kwargs())

            calls[name] = call_inner
        else:
            router, call = build({"router": "resilient-router", "direct": "resilient"}[name], sim)
            closers.append(router)
            calls[name] = call
    return calls, closers


def stub_call(name: str, sim: _Sim, stub: Any, closers: list[Any]) -> Call:
    """A call of profile_overhead.py's stub Router, alone or through the plugin."""
    try:
        from profile_overhead import stubbed
    except ImportError:  # pragma: no cover
        from benchmarks.profile_overhead import stubbed
    if name == "stub":

        async def alone() -> Any:
            return await stub.acompletion(model="primary", messages=MSG)

        return alone
    if name == "direct+stub":
        import litellm

        router, _ = build("resilient", sim)
        closers.append(router)

        async def send(**kwargs: Any) -> Any:  # what the direct dispatcher calls
            return await stub.acompletion(**kwargs)

        async def direct() -> Any:
            real, litellm.acompletion = litellm.acompletion, send
            try:
                return await router.acompletion(model="primary", messages=MSG)
            finally:
                litellm.acompletion = real

        return direct
    router, call = build("resilient-router", sim)
    closers.append(router)
    stubbed(router, stub)
    return call


async def _batch(call: Call, n: int, concurrency: int) -> None:
    for start in range(0, n, concurrency):
        await asyncio.gather(*(call() for _ in range(min(concurrency, n - start))))


async def _drain() -> None:
    """Let the calls' background work (LiteLLM's logging worker, callbacks) finish."""
    from litellm.litellm_core_utils.logging_worker import GLOBAL_LOGGING_WORKER

    for _ in range(3):
        await GLOBAL_LOGGING_WORKER.flush()
        await asyncio.sleep(0.05)


def _client_keys() -> set[str]:
    """The keys of LiteLLM's HTTP-client cache: a new key is a new SDK client (and connection pool)."""
    import litellm

    return set(getattr(litellm.in_memory_llm_clients_cache, "cache_dict", {}))


def _calls(args: argparse.Namespace, name: str) -> int:
    """Calls per segment: the stub variants are ~500x cheaper, so they run more."""
    return args.stub_calls if "stub" in name else args.calls


class _GcCount:
    def __init__(self) -> None:
        self.runs = [0, 0, 0]

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.runs[info["generation"]] += 1


async def client(args: argparse.Namespace) -> dict[str, Any]:
    """Under callgrind: warm every variant, then count each one's segments."""
    lib = ctypes.CDLL(args.helper)
    lib.cg_dump.argtypes = [ctypes.c_char_p]
    calls, closers = await systems(args.base_url, args.variants)
    for call in calls.values():  # uninstrumented warm-up: connections, caches, code paths
        await _batch(call, 20, args.concurrency)
    await _drain()
    lib.cg_start()
    gc_runs: dict[str, list[list[int]]] = {name: [] for name in calls}
    new_clients: dict[str, list[int]] = {name: [] for name in calls}
    for r in range(args.rounds):
        order = list(calls) if r % 2 == 0 else list(reversed(calls))
        for name in order:
            await _batch(calls[name], args.concurrency, args.concurrency)  # instrumented warm-up
            await _drain()
            gc.collect()
            counter = _GcCount()
            keys = _client_keys()
            gc.callbacks.append(counter)
            lib.cg_zero()
            await _batch(calls[name], _calls(args, name), args.concurrency)
            await _drain()
            lib.cg_dump(f"{name}#{r}".encode())
            gc.callbacks.remove(counter)
            gc_runs[name].append(counter.runs)
            new_clients[name].append(len(_client_keys() - keys))
    for router in closers:
        router.close()
    return {"gc": gc_runs, "clients": new_clients}


_TOTAL = re.compile(r"^(?:totals|summary):\s+(\d+)", re.M)
_LABEL = re.compile(r"^desc: Trigger: Client Request: (\S+)#(\d+)$", re.M)


def read_dumps(directory: Path) -> dict[str, list[int]]:
    """Instructions per segment, by variant, from callgrind's dump files."""
    out: dict[str, list[int]] = {}
    for path in sorted(directory.glob("callgrind.out*")):
        text = path.read_text(errors="replace")
        label, total = _LABEL.search(text), _TOTAL.search(text)
        if label is None or total is None:
            continue  # the final dump at exit, or a thread's
        out.setdefault(label.group(1), []).append(int(total.group(1)))
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run the client under callgrind against a simulator; instructions per call per variant."""
    for tool in ("valgrind", "gcc"):
        if shutil.which(tool) is None:
            sys.exit(f"this benchmark needs {tool}")
    sim = ExternalSimulator()
    try:
        with tempfile.TemporaryDirectory(prefix="instr-") as tmp:
            work = Path(tmp)
            helper = compile_helper(work)
            cmd = [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={work}/callgrind.out.%p",
                sys.executable,
                os.path.abspath(__file__),
                "--client",
                "--base-url",
                sim.base_url,
                "--helper",
                str(helper),
                "--gc-out",
                str(work / "gc.json"),
                "--calls",
                str(args.calls),
                "--stub-calls",
                str(args.stub_calls),
                "--rounds",
                str(args.rounds),
                "--concurrency",
                str(args.concurrency),
                "--variants",
                ",".join(args.variants),
            ]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"the client failed under valgrind:\n{done.stderr[-3000:]}")
            counts = read_dumps(work)
            side = json.loads((work / "gc.json").read_text())
    finally:
        sim.stop()
    rows: dict[str, Any] = {}
    for name in args.variants:
        per_call = [c / _calls(args, name) for c in counts.get(name, [])]
        rows[name] = {
            "instructions_per_call": statistics.median(per_call) if per_call else None,
            "segments": per_call,
            "gc_runs_per_segment": side["gc"].get(name),
            "new_litellm_clients_per_segment": side["clients"].get(name),
        }
    return {
        "calls": args.calls,
        "stub_calls": args.stub_calls,
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        "variants": rows,
    }


def print_table(result: dict[str, Any]) -> None:
    rows = result["variants"]
    print(
        f"instructions per call ({result['rounds']} rounds of {result['calls']} calls, stub variants "
        f"{result['stub_calls']}, {result['concurrency']} at once; callgrind, client process only)"
    )
    print(
        "| variant | instructions per call | vs bare (stub) | spread over rounds | GC runs per segment "
        "(gen 0/1/2) | new LiteLLM clients per segment |"
    )
    print("|---|---:|---:|---:|---|---|")
    for name, row in rows.items():
        ipc = row["instructions_per_call"]
        if ipc is None:
            print(f"| {name} | - | - | - | - | - |")
            continue
        base = (rows.get("stub" if "stub" in name else "bare") or {}).get("instructions_per_call")
        delta = f"{(ipc - base) / 1e3:+.0f} k" if base is not None and name not in ("bare", "stub") else "-"
        spread = f"{(max(row['segments']) - min(row['segments'])) / 1e3:.0f} k"
        gc_runs = "; ".join("/".join(str(n) for n in runs) for runs in row["gc_runs_per_segment"] or [])
        clients = ", ".join(str(n) for n in row["new_litellm_clients_per_segment"] or [])
        print(f"| {name} | {ipc / 1e6:.3f} M | {delta} | {spread} | {gc_runs} | {clients} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=30, help="calls per counted segment")
    ap.add_argument("--stub-calls", type=int, default=1000, help="calls per segment of the stub variants")
    ap.add_argument("--rounds", type=int, default=2, help="segments per variant (order reversed each round)")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS)
    )
    ap.add_argument("--out", default="benchmarks/results/instructions.json")
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--base-url", help=argparse.SUPPRESS)
    ap.add_argument("--helper", help=argparse.SUPPRESS)
    ap.add_argument("--gc-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variants: {sorted(unknown)}")
    if args.client:
        side = asyncio.run(client(args))
        Path(args.gc_out).write_text(json.dumps(side))
        return
    result = measure(args)
    print_table(result)
    print(f"JSON: {write_json(args.out, result)}")


if __name__ == "__main__":
    main()
