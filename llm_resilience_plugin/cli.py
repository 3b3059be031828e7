"""``llm-resilience``: the demo, config checking, and the provider simulator from the shell."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from llm_resilience_plugin import _env  # noqa: F401  (offline LiteLLM settings before import)
from llm_resilience_plugin.errors import ConfigError


def _check(path: str, as_json: bool) -> int:
    from llm_resilience_plugin.policy import load_config

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


def _report(ledger: str, since: str | None, as_json: bool) -> int:
    from datetime import datetime

    from llm_resilience_plugin.cost import SQLiteLedger, open_ledger

    if ledger.startswith("sqlite:///"):
        path = ledger.removeprefix("sqlite:///")
        import os

        if not os.path.exists(path):
            raise ConfigError("--ledger", f"no ledger file at {path}; pass the URL your CostGuard uses")
    opened = open_ledger(ledger)
    if not isinstance(opened, SQLiteLedger) and not ledger.startswith("redis"):
        raise ConfigError("--ledger", "expected a persistent ledger URL such as sqlite:///spend.db")
    start = None
    if since is not None:
        try:
            start = datetime.fromisoformat(since).timestamp()
        except ValueError:
            raise ConfigError("--since", "expected an ISO date such as 2026-11-01") from None
    rep = opened.report(since=start)
    if as_json:
        print(json.dumps(rep.to_dict(), indent=2))
    else:
        print(rep)
    return 0


def _bench(which: str, extra: Sequence[str]) -> int:
    import runpy
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "benchmarks"
    script = root / f"{which}.py"
    if not script.exists():
        raise ConfigError("bench", f"{script} not found: run benchmarks from a source checkout")
    sys.argv = [str(script), *extra]
    runpy.run_path(str(script), run_name="__main__")
    return 0


def _simulator(host: str, port: int, deployments: str) -> int:
    from llm_resilience_plugin.testing._simulator import ProviderSimulator, parse_deployments, serve

    try:
        names = parse_deployments(deployments)
        simulator = ProviderSimulator(host=host, port=port)
    except ValueError as exc:
        raise ConfigError("simulator", str(exc)) from None
    return serve(simulator, names)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llm-resilience",
        description="Resilience for LiteLLM's Router: try the demo, check a config, run the simulator.",
        epilog="Examples:\n"
        "  llm-resilience demo                         # the incident demo, no API keys\n"
        "  llm-resilience check router.yaml            # validate a config, print the policy\n"
        "  llm-resilience report --ledger sqlite:///spend.db --since 2026-11-01\n"
        "  llm-resilience bench chaos --calls 100      # benchmarks (from a source checkout)\n"
        "  llm-resilience simulator --port 8900 --deployments a,b",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    d = sub.add_parser("demo", help="run a scripted incident against the built-in simulator")
    d.add_argument("--calls", type=int, default=12, help="calls per phase (default 12)")
    c = sub.add_parser("check", help="validate a LiteLLM/plugin YAML and print the effective policy")
    c.add_argument("config", help="path to a LiteLLM proxy-style YAML with an optional resilience: section")
    c.add_argument("--json", action="store_true", help="print JSON instead of text")
    r = sub.add_parser("report", help="print spend from a cost-guard ledger (by day, model, scope)")
    r.add_argument("--ledger", required=True, help="the ledger URL, e.g. sqlite:///spend.db")
    r.add_argument("--since", help="only spend from this ISO date on")
    r.add_argument("--json", action="store_true")
    b = sub.add_parser("bench", help="run a benchmark from benchmarks/ (overhead, chaos, scale)")
    b.add_argument("which", choices=["overhead", "chaos", "scale"])
    b.add_argument("args", nargs=argparse.REMAINDER, help="passed to the benchmark (see its --help)")
    # The same options as the simulator's own parser (testing._simulator.build_parser; a test keeps
    # them equal), declared here so the other commands do not import aiohttp to build the parser.
    s = sub.add_parser(
        "simulator",
        help="run the provider simulator standalone (until Ctrl-C or SIGTERM)",
        description="Serve a fault-injecting OpenAI-compatible chat-completions endpoint.",
    )
    s.add_argument("--host", default="127.0.0.1", help="interface to bind (127.0.0.1)")
    s.add_argument("--port", type=int, default=0, help="TCP port (0: pick a free one)")
    s.add_argument(
        "--deployments",
        default="a",
        help="comma-separated deployment names to pre-register and print (a)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            if args.calls < 1:
                parser.error("--calls must be at least 1")
            from llm_resilience_plugin.demo import run_demo

            return asyncio.run(run_demo(args.calls))
        if args.command == "check":
            return _check(args.config, args.json)
        if args.command == "report":
            return _report(args.ledger, args.since, args.json)
        if args.command == "bench":
            return _bench(args.which, args.args)
        if args.command == "simulator":
            return _simulator(args.host, args.port, args.deployments)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    parser.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
