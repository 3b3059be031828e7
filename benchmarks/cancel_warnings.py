"""Cancelled calls and "coroutine ... was never awaited": how many RuntimeWarnings N calls
cancelled early leave behind (counted after a ``gc.collect()``). Against the simulator over
loopback (20 ms latency): the caller cancelling after a random 0-4 ms (``cancel``), streams
cancelled the same way (``stream``), and blocking calls cut by ``close(grace=0)`` (``sync``).

    python benchmarks/cancel_warnings.py [--calls 1000] [--modes cancel,stream,sync]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import threading
import time
import warnings
from typing import Any

os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")

import llm_resilience_plugin  # noqa: F401  (offline LiteLLM settings first)
from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin.testing import Fault, ProviderSimulator

MSG = [{"role": "user", "content": "hi"}]


def _router(sim: ProviderSimulator) -> ResilientRouter:
    model_list = [
        {
            "model_name": "g",
            "litellm_params": {
                "model": "openai/gpt-4o-mini",
                "api_key": "sk-sim",
                "api_base": sim.api_base(d),
            },
            "model_info": {"id": d},
        }
        for d in ("a", "b")
    ]
    return ResilientRouter(model_list=model_list, policy={"deadline": 10, "attempt_timeout": 5})


async def _cancelled(router: ResilientRouter, calls: int, stream: bool) -> None:
    for _ in range(calls):
        task = asyncio.ensure_future(router.acompletion(model="g", messages=MSG, stream=stream))
        await asyncio.sleep(random.random() * 0.004)
        task.cancel()
        try:
            await task
        except BaseException:  # cancelled, as intended
            pass


def _sync_cut(sim: ProviderSimulator, calls: int) -> None:
    for _ in range(max(1, calls // 20)):
        router = _router(sim)

        def one(router: ResilientRouter = router) -> None:
            try:
                router.completion(model="g", messages=MSG)
            except Exception:  # RouterClosedError, as intended
                pass

        threads = [threading.Thread(target=one) for _ in range(20)]
        for t in threads:
            t.start()
        time.sleep(random.random() * 0.01)
        router.close(grace=0)
        for t in threads:
            t.join()


def count(calls: int, mode: str) -> dict[str, Any]:
    seen: list[str] = []
    with warnings.catch_warnings(record=True) as caught, ProviderSimulator() as sim:
        warnings.simplefilter("always", RuntimeWarning)
        for d in ("a", "b"):
            sim.set_default(d, Fault.ok(latency=0.02))
        started = time.perf_counter()
        if mode == "sync":
            _sync_cut(sim, calls)
        else:

            async def run() -> None:
                router = _router(sim)
                await _cancelled(router, calls, stream=mode == "stream")
                await router.aclose()

            asyncio.run(run())
        gc.collect()
        seen = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    return {
        "mode": mode,
        "calls": calls,
        "warnings": len(seen),
        "kinds": sorted(set(seen)),
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--modes", default="cancel,stream,sync")
    args = parser.parse_args()
    for mode in args.modes.split(","):
        out = count(args.calls, mode)
        print(
            f"{out['mode']:<7} {out['calls']} calls: {out['warnings']} RuntimeWarnings ({out['seconds']} s)"
        )
        for kind in out["kinds"]:
            print(f"    {kind}")


if __name__ == "__main__":
    main()
