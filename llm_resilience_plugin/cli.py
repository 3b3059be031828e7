"""``llm-resilience``: the demo, config checking, spend reports and the provider simulator from the shell."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from llm_resilience_plugin import _env  # noqa: F401  (offline LiteLLM settings before import)
from llm_resilience_plugin._problems import Problem, closest, shape_problems
from llm_resilience_plugin._redaction import is_secret_key, mask_url, register_secret, scrub
from llm_resilience_plugin.errors import ConfigError

ENV_PREFIX = "os.environ/"
EXIT_CONFIG = 2  # a caller's mistake: a bad config or argument
EXIT_FAILED = 1  # the command could not do its work (a ledger unreachable)
EXIT_PIPE = 141  # the reader of our output went away (``| head``), as a shell reports SIGPIPE


class CommandError(Exception):
    """The command could not do its work for a reason outside the caller's input (one line)."""


# -- check ------------------------------------------------------------------------------------------


def _strings(value: Any, field: str) -> Iterator[tuple[str, str, str]]:
    """``(field, key, string)`` for every string under ``value`` (``key``: its mapping key)."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if isinstance(v, str):
                yield f"{field}.{k}", str(k), v
            else:
                yield from _strings(v, f"{field}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{field}[{i}]")


def _env_problems(raw: Mapping[str, Any], without_secrets: bool = False) -> list[Problem]:
    """``os.environ/NAME`` references whose variable is unset or empty (named, never printed;
    warnings ``without_secrets``: a CI job checking a config has no keys), and every secret in
    the config registered for scrubbing from what this command prints."""
    from llm_resilience_plugin.policy._proxy_sections import PROXY_SECTIONS

    exported = raw.get("environment_variables")
    exported = exported if isinstance(exported, Mapping) else {}
    for value in exported.values():  # the proxy exports them: often keys, never printed
        if isinstance(value, str | int | float) and not isinstance(value, bool) and str(value):
            register_secret(str(value))
    problems = []
    for section in ("model_list", "router_settings", "cost", *PROXY_SECTIONS):
        proxy = section in PROXY_SECTIONS  # not read by the router: never more than a warning
        severity: Any = "warning" if without_secrets or proxy else "error"
        for field, key, value in _strings(raw.get(section), section):
            if not value.startswith(ENV_PREFIX):
                if is_secret_key(key):
                    register_secret(value)
                continue
            name = value.removeprefix(ENV_PREFIX)
            resolved = os.environ.get(name)
            if resolved:
                register_secret(resolved)
                continue
            why = "not set" if resolved is None else "empty"
            note = " (LiteLLM proxy's section; ResilientRouter does not read it)" if proxy else ""
            if not proxy and name in exported:
                note = (
                    " (environment_variables sets it for LiteLLM's proxy only: ResilientRouter does "
                    "not apply that section; export it)"
                )
            problems.append(
                Problem(field, f"environment variable {name} is {why} (read by {value}){note}", severity)
            )
    return problems


def _provider_problems(model_list: Any) -> list[Problem]:
    """Deployments whose provider LiteLLM cannot tell from the model name (``notaprovider/x``)."""
    import litellm

    problems = []
    for i, d in enumerate(model_list if isinstance(model_list, list) else []):
        params = d.get("litellm_params") if isinstance(d, Mapping) else None
        model = params.get("model") if isinstance(params, Mapping) else None
        if not isinstance(model, str):
            continue  # already reported by the policy checks
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # LiteLLM prints its provider list
                litellm.get_llm_provider(
                    model=model,
                    custom_llm_provider=params.get("custom_llm_provider"),  # type: ignore[union-attr]
                    api_base=params.get("api_base"),  # type: ignore[union-attr]
                )
        except Exception:
            provider = model.split("/", 1)[0] if "/" in model else ""
            known = [str(getattr(p, "value", p)) for p in litellm.provider_list]
            hint = closest(provider, known).removeprefix("; ") if provider else ""
            what = f"provider {provider!r} in {model!r}" if provider else f"provider of {model!r}"
            problems.append(
                Problem(
                    f"model_list[{i}].litellm_params.model",
                    f"LiteLLM does not know the {what}"
                    + (f" ({hint})" if hint else "")
                    + "; write '<provider>/<model>' (e.g. openai/gpt-4o-mini) or set custom_llm_provider",
                )
            )
    return problems


def _build(spec: Any) -> tuple[Any, list[Problem], dict[str, Any]]:
    """Build the router (and the cost guard, on a memory ledger) offline, as ``from_config`` would;
    also which dispatcher each group uses and why."""
    from llm_resilience_plugin.cost import cost_guard_from_config
    from llm_resilience_plugin.policy import offline_spec
    from llm_resilience_plugin.routing import ResilientRouter

    spec = offline_spec(spec)  # check never hands LiteLLM a Redis, cache or webhook of the config
    guard = None
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            guard = cost_guard_from_config(spec.cost, ledger="memory") if spec.cost is not None else None
            router = ResilientRouter.from_spec(
                spec.model_copy(update={"cost": None}),
                guards=[guard] if guard is not None else None,
                shared_state=False,  # check never connects to Redis
            )
    except ConfigError as e:
        field = (
            e.field if e.field.startswith(("cost", "model_list", "router_settings")) else f"cost.{e.field}"
        )
        if e.field.startswith("observability."):  # the policy's section, as the config file names it
            field = f"resilience.{e.field}"
        return guard, [Problem(field, e.message)], {}
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        return (
            guard,
            [Problem("model_list", f"litellm.Router refused the config: {type(e).__name__}: {first}")],
            {},
        )
    dispatch = router.dispatch_plan()
    router.close()
    return guard, _unbounded_warnings(guard), dispatch


def _unbounded_warnings(guard: Any) -> list[Problem]:
    """Deployments the cost guard bounds with its conservative default (no maximum output known)."""
    from llm_resilience_plugin.cost import UNKNOWN_MAX_OUTPUT

    return [
        Problem(
            "cost.default_max_tokens",
            f"deployment {dep!r}: no maximum output is known, so a call without max_tokens is "
            f"reserved {UNKNOWN_MAX_OUTPUT} output tokens; set cost.default_max_tokens or the "
            "deployment's model_info.max_output_tokens",
            "warning",
        )
        for dep in (guard.estimator.unbounded if guard is not None else [])
    ]


def _describe(spec: Any, guard: Any, dispatch: dict[str, Any] | None = None) -> dict[str, Any]:
    """The effective policy per group, and the cost section, as plain data (no secret)."""
    out: dict[str, Any] = {"groups": {}, "cost": None}
    for group in spec.groups:
        deps = [
            {
                "id": (d.get("model_info") or {}).get("id", "(generated)"),
                "model": d["litellm_params"]["model"],
                "api_base": mask_url(d["litellm_params"].get("api_base")),
                "rate_limit": rate_limit_of(spec, d),
            }
            for d in spec.model_list
            if d["model_name"] == group
        ]
        out["groups"][group] = {
            "deployments": deps,
            "fallbacks": spec.fallback_chain(group, None),
            "context_window_fallbacks": spec.context_window_fallbacks.get(group, []),
            "content_policy_fallbacks": spec.content_policy_fallbacks.get(group, []),
            "policy": spec.policy.for_group(group).model_dump(mode="json"),
            "dispatch": (dispatch or {}).get(group),
        }
    if guard is not None:
        out["cost"] = {
            "ledger": mask_url(str(spec.cost.get("ledger", "memory"))),
            "budgets": [
                {"name": b.name, "limit": b.limit, "period": b.period, "scope": b.scope}
                for b in guard.budgets
            ],
            "alert_at": list(guard.alert_at),
            "timezone": str(guard.tz),
        }
    return out


def rate_limit_of(spec: Any, d: Mapping[str, Any]) -> dict[str, Any]:
    """A deployment's effective rate limit as ``check`` shows it: its value and where it comes from."""
    from llm_resilience_plugin._engine.limits import configured_limits

    pacing = spec.policy.pacing
    dep_id = (d.get("model_info") or {}).get("id")
    override = pacing.limits_for(dep_id, d["model_name"])
    params = d.get("litellm_params") or {}
    lim = configured_limits(params, override.model_dump() if override else None)
    if not pacing.enabled:
        return {"paced": False, "source": "pacing off (429s retried with backoff and Retry-After)"}
    adaptive = pacing.concurrency_for(dep_id, d["model_name"])
    concurrency = adaptive.model_dump() if adaptive is not None else None
    if lim is None:
        how = "learned from 429s and rate-limit headers" if pacing.learn else "none (not learned)"
        return {"paced": True, "rpm": None, "tpm": None, "source": how, "concurrency": concurrency}
    source = "pacing.limits" if override else "litellm_params"
    return {
        "concurrency": concurrency,
        "paced": True,
        "rpm": round(lim.requests_per_s * 60, 3) if lim.requests_per_s else None,
        "tpm": round(lim.tokens_per_s * 60, 1) if lim.tokens_per_s else None,
        "burst": lim.request_burst,
        "headroom": pacing.headroom,
        "source": source,
    }


def rate_limit_line(r: Mapping[str, Any]) -> str:
    """One deployment's rate limit in words."""
    if not r.get("paced"):
        return r["source"]
    c = r.get("concurrency")
    adaptive = (
        f"; in flight: adaptive {c['min']}..{c['max']} from {c['initial']} (tolerance {c['tolerance']:g})"
        if c
        else ""
    )
    if r.get("rpm") is None and r.get("tpm") is None:
        return f"no limit configured: {r['source']}{adaptive}"
    parts = [f"{r['rpm']:g} rpm" if r.get("rpm") else "", f"{r['tpm']:g} tpm" if r.get("tpm") else ""]
    shown = ", ".join(p for p in parts if p)
    return (
        f"{shown} ({r['source']}), paced at {r['headroom']:.0%}, lowered only where the provider's "
        f"headers prove it too high{adaptive}"
    )


def stream_timeouts_line(p: Mapping[str, Any]) -> str:
    """The stream limits ``llm-resilience check`` prints, a learned one marked as a static default."""
    from llm_resilience_plugin._engine.learned import FLOOR, HEADROOM, MIN_SAMPLES

    first, idle = p["first_chunk_timeout"], p["stream_idle_timeout"]
    text = f"first chunk {first}s{'*' if p['learn_stream_timeouts'] else ''}, idle {idle}s"
    text += "*" if p["learn_idle_timeouts"] else ""
    if p["learn_stream_timeouts"] or p["learn_idle_timeouts"]:
        text += (
            f" (*static default: learned from the group's streams after {MIN_SAMPLES},"
            f" {HEADROOM:g} x p95, at least {FLOOR:g}s, the idle one only for recovered streams;"
            " the attempt timeout when a call has nowhere else to go)"
        )
    return text


def _litellm_section() -> dict[str, Any]:
    """The installed LiteLLM, the supported range and which internal capabilities it has."""
    from llm_resilience_plugin import _litellm

    found = _litellm.internals()
    return {
        "version": found.version,
        "supported": _litellm.SUPPORTED,
        "capabilities": {
            c.name: {"available": c.available, "missing": c.missing, "instead": c.instead}
            for c in found.capabilities.values()
        },
    }


def _proxy_sections(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The proxy's sections present: how many keys each has, and which the router reads (none)."""
    from llm_resilience_plugin.policy._proxy_sections import PROXY_SECTIONS, ROUTER_READS

    return {
        name: {"keys": len(raw[name]), "read_by_router": list(ROUTER_READS[name])}
        for name in PROXY_SECTIONS
        if isinstance(raw.get(name), Mapping)
    }


def _print_litellm(section: Mapping[str, Any]) -> None:
    print(f"\n[litellm] {section['version']} (supported litellm{section['supported']})")
    for name, c in section["capabilities"].items():
        if c["available"]:
            print(f"  {name}: yes")
        else:
            print(f"  {name}: no ({c['missing']}; {c['instead']})")


def _print_policy(path: str, spec: Any, out: dict[str, Any]) -> None:
    print(f"{path}: OK ({len(spec.model_list)} deployments, {len(spec.groups)} model groups)")
    for group, g in out["groups"].items():
        p = g["policy"]
        print(f"\n[{group}]")
        for d in g["deployments"]:
            print(f"  deployment {d['id']}: {d['model']} @ {d['api_base'] or 'provider default'}")
            print(f"    rate limit: {rate_limit_line(d['rate_limit'])}")
        print(f"  fallbacks: {g['fallbacks'] or '-'}; context window: {g['context_window_fallbacks'] or '-'}")
        print(f"  deadline {p['deadline']}s, attempt timeout {p['attempt_timeout']}s")
        print(f"  streams: {stream_timeouts_line(p)}")
        if g.get("dispatch"):
            print(f"  dispatch: {g['dispatch']['dispatcher']} ({g['dispatch']['reason']})")
        b = p["breaker"]
        print(f"  breaker: fail_max {b['fail_max']}, reset_timeout {b['reset_timeout']}s")
        for cls, cp in p["classes"].items():
            print(f"  {cls:<15} {cp['action']:<9} retries {cp['max_retries']}")
    cost = out["cost"]
    if cost is not None:
        print(f"\n[cost] ledger {cost['ledger']}, alerts at {cost['alert_at']}, timezone {cost['timezone']}")
        for b in cost["budgets"]:
            scope = f" per {b['scope']}" if b["scope"] else ""
            print(f"  budget {b['name']}: ${b['limit']:g} per {b['period']}{scope}")
    if out.get("proxy_sections"):
        listed = ", ".join(f"{k} ({v['keys']} keys)" for k, v in out["proxy_sections"].items())
        print(
            f"\n[proxy] {listed}: LiteLLM proxy's sections, checked; ResilientRouter reads none of their keys"
        )
    if out.get("litellm"):
        _print_litellm(out["litellm"])


def _check(path: str, as_json: bool, without_secrets: bool = False) -> int:
    from llm_resilience_plugin.cost import cost_config_problems
    from llm_resilience_plugin.policy import config_problems, read_config
    from llm_resilience_plugin.policy._proxy_sections import proxy_section_problems
    from llm_resilience_plugin.testing.chaos import chaos_problems

    raw = read_config(path)
    spec, problems = config_problems(raw, source=path)
    # Walked further only when config_problems could walk it (no recursive alias, no NaN).
    if isinstance(raw, Mapping) and not any(shape_problems(v, str(k)) for k, v in raw.items()):
        problems += _env_problems(raw, without_secrets)
        if isinstance(raw.get("cost"), Mapping):
            problems += cost_config_problems(raw["cost"])
        problems += _provider_problems(raw.get("model_list"))
        problems += chaos_problems(raw, spec.groups if spec is not None else ())
        problems += proxy_section_problems(raw)
    errors = [p for p in problems if p.severity == "error"]
    guard: Any = None
    dispatch: dict[str, Any] = {}
    out: dict[str, Any] = {"groups": {}, "cost": None}
    if not errors and spec is not None:
        guard, built, dispatch = _build(spec)
        problems += built
        errors += [p for p in built if p.severity == "error"]
    if not errors and spec is not None:
        out = _describe(spec, guard, dispatch)
        out["litellm"] = _litellm_section()
        out["proxy_sections"] = _proxy_sections(raw)
    if guard is not None:
        guard.close()
    warnings = len(problems) - len(errors)
    if as_json:
        doc = {
            "config": path,
            "ok": not errors,
            "errors": len(errors),
            "warnings": warnings,
            "problems": [{"severity": p.severity, "field": p.field, "message": p.message} for p in problems],
            **out,
        }
        print(scrub(json.dumps(doc, indent=2)))
    else:
        stream = sys.stderr if errors else sys.stdout
        if problems:
            print(f"{path}: {len(errors)} error(s), {warnings} warning(s)", file=stream)
            for p in problems:
                print(scrub(f"  {p.severity:<8} {p.field}: {p.message}"), file=stream)
        if not errors:
            with contextlib.redirect_stdout(buffer := io.StringIO()):
                _print_policy(path, spec, out)
            print(scrub(buffer.getvalue()), end="")
    return EXIT_CONFIG if errors else 0


# -- report -----------------------------------------------------------------------------------------


def _sqlite_path(url: str) -> str | None:
    if url.startswith("sqlite:///"):
        return url.removeprefix("sqlite:///")
    return url if url.endswith((".db", ".sqlite", ".sqlite3")) else None


def _ledger_url(ledger: str | None, config: str | None) -> str:
    """The ledger to read: ``--ledger``, else the ``cost.ledger`` of ``--config``."""
    if ledger is not None:
        return ledger
    if config is None:
        raise ConfigError(
            "--ledger", "pass the ledger URL (sqlite:///spend.db) or --config with a cost: section"
        )
    from llm_resilience_plugin.policy import read_config

    raw = read_config(config)
    cost = raw.get("cost") if isinstance(raw, Mapping) else None
    url = cost.get("ledger") if isinstance(cost, Mapping) else None
    if not isinstance(url, str):
        raise ConfigError("--config", f"{config} has no cost.ledger to read; pass --ledger")
    if url.startswith(ENV_PREFIX):
        name = url.removeprefix(ENV_PREFIX)
        url = os.environ.get(name) or ""
        if not url:
            raise ConfigError("cost.ledger", f"environment variable {name} is not set or empty")
    return url


def _open_report(url: str, create: bool, since: float | None) -> Any:
    """Open the ledger and read its report (``ConfigError``/``CommandError`` as one line)."""
    import sqlite3

    from llm_resilience_plugin.cost import LedgerUnavailableError, open_ledger

    path = _sqlite_path(url)
    if url in ("memory", "memory://", ":memory:"):
        raise ConfigError(
            "--ledger", "a memory ledger lives inside its process; report reads sqlite:/// or redis://"
        )
    if path is not None and not Path(path).expanduser().exists() and not create:
        raise ConfigError(
            "--ledger",
            f"no ledger file at {path} (a typo?); pass the URL your CostGuard writes to, "
            "or --create to start an empty one",
        )
    if path is not None and Path(path).expanduser().is_dir():
        raise ConfigError("--ledger", f"{path} is a folder, not a ledger file")
    try:
        opened = open_ledger(url)
        try:
            return opened.report(since=since)
        finally:
            opened.close()
    except LedgerUnavailableError as e:
        raise CommandError(f"cannot read the Redis ledger at {mask_url(url)}: {e.reason}") from None
    except sqlite3.Error as e:
        raise CommandError(f"cannot read {path} as a ledger: {e}") from None
    except ConfigError:
        raise
    except Exception as e:  # redis-py and socket errors: one line, not a traceback
        raise CommandError(f"cannot read the ledger at {mask_url(url)}: {type(e).__name__}: {e}") from None


def _report(ledger: str | None, config: str | None, since: str | None, as_json: bool, create: bool) -> int:
    from datetime import datetime

    start = None
    if since is not None:
        try:
            start = datetime.fromisoformat(since).timestamp()
        except ValueError:
            raise ConfigError("--since", "expected an ISO date such as 2026-11-01") from None
    rep = _open_report(_ledger_url(ledger, config), create, start)
    declared = _declared_budgets(config, rep) if config is not None else None
    if as_json:
        doc = rep.to_dict()
        if declared is not None:
            doc["declared_budgets"] = declared
        print(json.dumps(doc, indent=2))
        return 0
    print(rep)
    if declared is not None:
        print(f"budgets declared in {config}:" if declared else f"no budgets declared in {config}")
        for b in declared:
            scope = f" per {b['scope']}" if b["scope"] else ""
            now = f"; current windows: spent ${b['spent']:.6f}, reserved ${b['reserved']:.6f}"
            print(f"  {b['name']:<32} ${b['limit']:g} per {b['period']}{scope}{now}")
    return 0


def _declared_budgets(config: str, rep: Any) -> list[dict[str, Any]]:
    """The budgets the config's ``cost:`` section declares, each with what the ledger's current
    windows hold for it (a budget nothing was charged to yet shows $0)."""
    from llm_resilience_plugin.cost import CostConfig
    from llm_resilience_plugin.policy import read_config

    raw = read_config(config)
    cost = raw.get("cost") if isinstance(raw, Mapping) else None
    try:
        budgets = [b.budget() for b in CostConfig.model_validate(dict(cost or {})).budgets]
    except Exception:
        raise ConfigError("--config", f"{config}: invalid cost section; run llm-resilience check") from None
    out = []
    for b in budgets:
        usage = [u for u in rep.budgets if u.budget == b.name]
        out.append(
            {
                "name": b.name,
                "limit": b.limit,
                "period": b.period,
                "scope": b.scope,
                "spent": sum(u.spent for u in usage),
                "reserved": sum(u.reserved for u in usage),
            }
        )
    return out


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
        "  llm-resilience check router.yaml            # every problem at once, then the policy\n"
        "  llm-resilience report --ledger sqlite:///spend.db --since 2026-11-01\n"
        "  llm-resilience report --config router.yaml  # the ledger of its cost: section\n"
        "  llm-resilience simulator --port 8900 --deployments a,b\n"
        "  llm-resilience chaos router.yaml --json chaos.json --plot chaos.png\n"
        "\n"
        "Benchmarks (overhead, chaos, scale) are not installed with the package: run them from a\n"
        "source checkout, e.g. python benchmarks/chaos.py --help",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    d = sub.add_parser("demo", help="run a scripted incident against the built-in simulator")
    d.add_argument("--calls", type=int, default=12, help="calls per phase (default 12)")
    c = sub.add_parser(
        "check",
        help="validate a LiteLLM/plugin YAML offline and print the effective policy",
        description="Report every problem of a config at once (exit 2 if any is an error), then the "
        "effective policy per model group. Builds the router offline; never prints a secret.",
    )
    c.add_argument("config", help="a LiteLLM proxy-style YAML with optional resilience: and cost: sections")
    c.add_argument("--json", action="store_true", help="print JSON instead of text")
    c.add_argument(
        "--no-secrets",
        action="store_true",
        help="for CI without the keys: an unset os.environ/ variable is a warning, not an error",
    )
    r = sub.add_parser("report", help="print spend from a cost-guard ledger (by day, model, scope)")
    where = r.add_mutually_exclusive_group(required=True)
    where.add_argument("--ledger", help="the ledger URL, e.g. sqlite:///spend.db or redis://host:6379/0")
    where.add_argument("--config", help="a router YAML whose cost: section names the ledger")
    r.add_argument("--since", help="only spend from this ISO date on")
    r.add_argument("--json", action="store_true")
    r.add_argument("--create", action="store_true", help="create a missing SQLite ledger file (reports $0)")
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
    k = sub.add_parser(
        "chaos",
        help="replay failure scenarios against your config: the plugin beside a plain LiteLLM Router",
        description="Point every deployment of a router YAML at the built-in simulator, run the "
        "scenario catalogue (or --scenario files) against the plugin and a plain LiteLLM Router, and "
        "print a scorecard. Exit 1 when the YAML's chaos: thresholds are missed, 2 on a config error.",
    )
    k.add_argument("config", help="a LiteLLM proxy-style YAML (chaos: {min_success, max_p99_s} optional)")
    k.add_argument(
        "--scenario", action="append", default=[], metavar="FILE", help="a scenario YAML (repeatable)"
    )
    k.add_argument("--only", default="", help="comma-separated scenario names to run")
    k.add_argument("--json", metavar="PATH", help="write the results as JSON")
    k.add_argument("--plot", metavar="PATH", help="write the timeline plot (.png, or .html)")
    k.add_argument("--quick", action="store_true", help="a smoke run: half the calls")
    return p


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command == "demo":
        if args.calls < 1:
            parser.error("--calls must be at least 1")
        from llm_resilience_plugin.demo import run_demo

        return asyncio.run(run_demo(args.calls))
    if args.command == "check":
        return _check(args.config, args.json, args.no_secrets)
    if args.command == "report":
        return _report(args.ledger, args.config, args.since, args.json, args.create)
    if args.command == "simulator":
        return _simulator(args.host, args.port, args.deployments)
    if args.command == "chaos":
        from llm_resilience_plugin.testing.chaos import run_chaos

        only = [n for n in args.only.split(",") if n]
        return run_chaos(args.config, args.scenario, json_path=args.json, plot_path=args.plot,
                         quick_run=args.quick, only=only)  # fmt: skip
    parser.print_help()
    return EXIT_CONFIG


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = _run(parser, args)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except ConfigError as exc:
        print(f"error: {scrub(str(exc))}", file=sys.stderr)
        return EXIT_CONFIG
    except CommandError as exc:
        print(f"error: {scrub(str(exc))}", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:
        # `llm-resilience report --json | head -1`: the reader left; say nothing more, and keep
        # Python from failing again when it flushes stdout at exit.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE


if __name__ == "__main__":
    raise SystemExit(main())
