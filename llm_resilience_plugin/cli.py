"""``llm-resilience``: the demo, config checking, and the provider simulator from the shell."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from llm_resilience_plugin import _env  # noqa: F401  (offline LiteLLM settings before import)
from llm_resilience_plugin.errors import ConfigError, ResilienceError

DEMO_MSG = [{"role": "user", "content": "Summarise why circuit breakers matter, briefly."}]


def _demo_model_list(sim: Any) -> list[dict[str, Any]]:
    def dep(group: str, dep_id: str) -> dict[str, Any]:
        return {
            "model_name": group,
            "litellm_params": {
                "model": "openai/gpt-4o-mini",
                "api_base": sim.api_base(dep_id),
                "api_key": "sk-simulated",
            },
            "model_info": {"id": dep_id},
        }

    return [dep("primary", "primary-a"), dep("primary", "primary-b"), dep("backup", "backup-a")]


async def _demo(calls_per_phase: int, quiet: bool) -> int:
    from llm_resilience_plugin.breakers import BreakerTransition
    from llm_resilience_plugin.events import Event
    from llm_resilience_plugin.router import ResilientRouter, get_report
    from llm_resilience_plugin.simulator import Fault, ProviderSimulator

    policy = {
        "deadline": 8,
        "attempt_timeout": 1.0,
        "backoff": {"initial": 0.05, "maximum": 0.5},
        "breaker": {"fail_max": 3, "reset_timeout": 1.0},
    }
    transitions: list[str] = []
    outcomes: Counter[str] = Counter()
    latencies: list[float] = []
    upstream = 0
    with ProviderSimulator() as sim:
        router = ResilientRouter(
            model_list=_demo_model_list(sim), fallbacks=[{"primary": ["backup"]}], policy=policy
        )

        def on_event(event: Event) -> None:
            if isinstance(event, BreakerTransition):
                transitions.append(f"{event.deployment_id}: {event.old_state} -> {event.new_state}")

        router.subscribe(on_event)

        def storm() -> None:
            sim.set_default("primary-a", Fault.rate_limit(retry_after=0.2))

        def outage() -> None:
            sim.set_default("primary-a", Fault.server_error(503))
            sim.set_default("primary-b", Fault.server_error(503))

        def silent() -> None:
            sim.set_default("primary-a", Fault.ok())
            sim.set_default("primary-b", Fault.silence(max_hold=5))

        def recover() -> None:
            sim.set_default("primary-b", Fault.ok())

        phases: list[tuple[str, Callable[[], None]]] = [
            ("healthy", lambda: None),
            ("429 storm on primary-a", storm),
            ("primary outage (both deployments 503)", outage),
            ("primary-b silent (no response)", silent),
            ("recovery", recover),
        ]
        print("llm-resilience demo: ResilientRouter over the built-in provider simulator (no API keys)")
        print("groups: primary = [primary-a, primary-b], backup = [backup-a]; fallbacks: primary -> backup\n")
        for name, setup in phases:
            setup()
            if name in ("recovery", "primary-b silent (no response)"):
                await asyncio.sleep(1.1)  # let open breakers reach their probe time
            served: Counter[str] = Counter()
            phase_fail = 0
            for _ in range(calls_per_phase):
                t = time.perf_counter()
                try:
                    resp = await router.acompletion(model="primary", messages=DEMO_MSG)
                    rep = get_report(resp)
                    assert rep is not None
                    served[f"{rep.served_group}/{rep.deployment_id}"] += 1
                    upstream += rep.upstream_requests
                    outcomes["success"] += 1
                except ResilienceError as exc:
                    phase_fail += 1
                    outcomes["failure"] += 1
                    rep = getattr(exc, "report", None)
                    upstream += rep.upstream_requests if rep else 0
                latencies.append(time.perf_counter() - t)
            served_txt = ", ".join(f"{k} x{v}" for k, v in served.most_common())
            print(
                f"- {name:<40} ok {calls_per_phase - phase_fail}/{calls_per_phase}  served by: {served_txt}"
            )
        router.close()
    total = sum(outcomes.values())
    lat = sorted(latencies)
    print("\nbreaker transitions:")
    for line in transitions:
        print(f"  {line}")
    print("\nsummary:")
    print(f"  success rate        {outcomes['success'] / total:.1%} ({outcomes['success']}/{total})")
    print(f"  upstream requests   {upstream} ({upstream / total:.2f} per call)")
    print(
        f"  latency p50/p95     {statistics.median(lat) * 1e3:.0f} ms / "
        f"{lat[int(0.95 * (len(lat) - 1))] * 1e3:.0f} ms"
    )
    return 0 if outcomes["failure"] == 0 else 1


def _check(path: str, as_json: bool) -> int:
    from llm_resilience_plugin.config import load_config

    spec = load_config(path)
    out: dict[str, Any] = {"groups": {}}
    for group in spec.groups:
        pol = spec.policy.for_group(group)
        deps = [
            {
                "id": (d.get("model_info") or {}).get("id", "(generated)"),
                "model": d["litellm_params"]["model"],
                "api_base": d["litellm_params"].get("api_base"),
            }
            for d in spec.model_list
            if d["model_name"] == group
        ]
        out["groups"][group] = {
            "deployments": deps,
            "fallbacks": spec.fallback_chain(group, None),
            "context_window_fallbacks": spec.context_window_fallbacks.get(group, []),
            "content_policy_fallbacks": spec.content_policy_fallbacks.get(group, []),
            "policy": pol.model_dump(mode="json"),
        }
    if as_json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{path}: OK ({len(spec.model_list)} deployments, {len(spec.groups)} model groups)")
    for group, g in out["groups"].items():
        p = g["policy"]
        print(f"\n[{group}]")
        for d in g["deployments"]:
            print(f"  deployment {d['id']}: {d['model']} @ {d['api_base'] or 'provider default'}")
        print(f"  fallbacks: {g['fallbacks'] or '-'}; context window: {g['context_window_fallbacks'] or '-'}")
        print(f"  deadline {p['deadline']}s, attempt timeout {p['attempt_timeout']}s")
        b = p["breaker"]
        print(f"  breaker: fail_max {b['fail_max']}, reset_timeout {b['reset_timeout']}s")
        for cls, cp in p["classes"].items():
            print(f"  {cls:<15} {cp['action']:<9} retries {cp['max_retries']}")
    return 0


def _simulator(argv: Sequence[str]) -> int:
    from llm_resilience_plugin.simulator import main as sim_main

    return sim_main(list(argv))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llm-resilience",
        description="Resilience for LiteLLM's Router: try the demo, check a config, run the simulator.",
        epilog="Examples:\n  llm-resilience demo\n  llm-resilience check router.yaml\n"
        "  llm-resilience simulator --port 8900 --deployments a,b",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    d = sub.add_parser("demo", help="run a scripted incident against the built-in simulator")
    d.add_argument("--calls", type=int, default=12, help="calls per phase (default 12)")
    d.add_argument("--quiet", action="store_true")
    c = sub.add_parser("check", help="validate a LiteLLM/plugin YAML and print the effective policy")
    c.add_argument("config", help="path to a LiteLLM proxy-style YAML with an optional resilience: section")
    c.add_argument("--json", action="store_true", help="print JSON instead of text")
    s = sub.add_parser("simulator", help="run the provider simulator standalone", add_help=False)
    s.add_argument("args", nargs=argparse.REMAINDER)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            if args.calls < 1:
                parser.error("--calls must be at least 1")
            return asyncio.run(_demo(args.calls, args.quiet))
        if args.command == "check":
            return _check(args.config, args.json)
        if args.command == "simulator":
            return _simulator(args.args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    parser.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
