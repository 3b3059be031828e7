"""Error-body lag: how long one provider error with a large body stalls the event loop.

A ticker measures the loop's lag (every 5 ms) while calls are answered by a ``400`` whose body
echoes ``--kb`` kB of input, as providers do. Beside it, the time the plugin itself spends
classifying (and scrubbing) each error; the rest is LiteLLM's (its own redaction of the body and
traceback, on the loop). The plugin's attempts get a long error body cut at the transport
(``error_body_bound``); the same calls made with ``litellm.acompletion`` directly get the whole
body, as the plugin's did before: that is the "whole body" line. Against the simulator over
loopback.

    python benchmarks/error_body_lag.py [--kb 100] [--calls 3]

Set ``LITELLM_DISABLE_REDACT_SECRETS=true`` or ``LITELLM_RUST=true`` in the environment to
compare LiteLLM's switches (see docs/trust.md for what the first one gives up).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")

import llm_resilience_plugin  # noqa: F401  (offline LiteLLM settings first)
from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin._engine import attempts
from llm_resilience_plugin.testing import Fault, ProviderSimulator


async def measure(kb: int, calls: int) -> dict[str, Any]:
    spent: list[float] = []
    real = attempts.classify

    def timed(exc: BaseException) -> Any:
        t0 = time.perf_counter()
        try:
            return real(exc)
        finally:
            spent.append(time.perf_counter() - t0)

    attempts.classify = timed  # type: ignore[assignment]
    try:
        with ProviderSimulator() as sim:
            dep = {
                "model_name": "g",
                "litellm_params": {
                    "model": "openai/gpt-4o-mini",
                    "api_key": "sk-sim",
                    "api_base": sim.api_base("a"),
                },
                "model_info": {"id": "a"},
            }
            router = ResilientRouter(model_list=[dep], policy={"deadline": 30, "attempt_timeout": 20})
            msg = [{"role": "user", "content": "hi"}]
            await router.acompletion(model="g", messages=msg)  # warm: imports, clients
            spent.clear()
            body = "The input was: " + "lorem ipsum dolor " * (kb * 1000 // 18)
            sim.set_default("a", Fault.http_error(400, message=body))
            lags: list[float] = []
            running = True

            async def ticker() -> None:
                while running:
                    t0 = time.perf_counter()
                    await asyncio.sleep(0.005)
                    lags.append(time.perf_counter() - t0 - 0.005)

            async def worst(call: Any) -> list[float]:
                out: list[float] = []
                for _ in range(calls):
                    before = len(lags)
                    try:
                        await call()
                    except Exception:  # the 400, as expected
                        pass
                    await asyncio.sleep(0.05)
                    out.append(max(lags[before:], default=0.0))
                return out

            def plain() -> Any:
                import litellm  # after the plugin (its offline settings)

                return litellm.acompletion(
                    model="openai/gpt-4o-mini", api_key="sk-sim", api_base=sim.api_base("a"), messages=msg
                )

            tick = asyncio.ensure_future(ticker())
            await asyncio.sleep(0.05)
            per_call = await worst(lambda: router.acompletion(model="g", messages=msg))
            whole = await worst(plain)
            running = False
            await tick
            await router.aclose()
    finally:
        attempts.classify = real  # type: ignore[assignment]
    return {
        "kb": kb,
        "calls": calls,
        "max_lag_s": [round(x, 3) for x in per_call],
        "whole_body_max_lag_s": [round(x, 3) for x in whole],
        "plugin_classify_s": [round(x, 4) for x in spent],
        "litellm_rust": os.environ.get("LITELLM_RUST"),
        "litellm_disable_redact_secrets": os.environ.get("LITELLM_DISABLE_REDACT_SECRETS"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kb", type=int, default=100)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    out = asyncio.run(measure(args.kb, args.calls))
    print(f"{out['kb']} kB error body, {out['calls']} calls")
    print(f"  worst loop lag per call, the plugin (body cut): {out['max_lag_s']} s")
    print(f"  worst loop lag per call, litellm.acompletion (whole body): {out['whole_body_max_lag_s']} s")
    print(f"  plugin's classification per error: {out['plugin_classify_s']} s")


if __name__ == "__main__":
    main()
