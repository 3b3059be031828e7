"""The scripted incident behind ``llm-resilience demo``.

A LangChain chain on :class:`ResilientChatModel` and the same chain on a plain LiteLLM Router
(``ChatLiteLLMRouter``, LiteLLM's defaults plus the same fallbacks) run side by side through one
incident on the built-in simulator: a 429 storm, a provider outage and its recovery, a slow
stream, and a tenant budget nearing its limit. Each system has its own copy of every deployment,
and every fault is applied to both copies, so the two see the same failures.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

PRICE = {"input_cost_per_token": 1.5e-7, "output_cost_per_token": 6e-7}
BACKUP_PRICE = {"input_cost_per_token": 2.5e-6, "output_cost_per_token": 1e-5}
TENANT_BUDGET = 0.00012


@dataclass
class Tally:
    """What one system did during the demo."""

    latencies: list[float] = field(default_factory=list)
    ok: int = 0
    failed: int = 0
    refused: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    served: Counter[str] = field(default_factory=Counter)


@dataclass
class Phase:
    name: str
    calls: int
    setup: Callable[[], None]
    stream: bool = False
    tenant: str | None = None
    wait_before: float = 0.0


def _deployments(sim: Any, prefix: str) -> list[dict[str, Any]]:
    def dep(group: str, name: str, model: str, price: dict[str, float]) -> dict[str, Any]:
        dep_id = f"{prefix}-{name}"
        return {
            "model_name": group,
            "litellm_params": {
                "model": model,
                "api_base": sim.api_base(dep_id),
                "api_key": "sk-demo",
                **price,
            },
            "model_info": {"id": dep_id},
        }

    return [
        dep("primary", "primary-a", "openai/gpt-4o-mini", PRICE),
        dep("primary", "primary-b", "openai/gpt-4o-mini", PRICE),
        dep("backup", "backup-a", "openai/gpt-4o", BACKUP_PRICE),
    ]


class _Progress:
    """One line per phase, redrawn in place on a terminal."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()

    def update(self, name: str, done: int, total: int, tallies: dict[str, Tally]) -> None:
        if not self.tty and done < total:
            return
        width = 20
        bar = "#" * (width * done // total) + "." * (width - width * done // total)
        parts = "  ".join(f"{k}: {t.ok} ok / {t.failed + t.refused} failed" for k, t in tallies.items())
        line = f"  {name:<40} [{bar}] {done:>3}/{total}  {parts}"
        self.out.write(("\r" + line) if self.tty else line + "\n")
        if self.tty and done >= total:
            self.out.write("\n")
        self.out.flush()


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def run_demo(calls_per_phase: int = 12, out: TextIO = sys.stdout) -> int:
    import litellm
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_litellm import ChatLiteLLMRouter

    from llm_resilience_plugin.cost._guard import Budget, BudgetAlert, CostGuard
    from llm_resilience_plugin.errors import BudgetExceededError
    from llm_resilience_plugin.events import BreakerTransition, Event, FallbackTaken, RetryScheduled
    from llm_resilience_plugin.langchain import ResilientChatModel
    from llm_resilience_plugin.langchain._callbacks import CostGuardCallbackHandler
    from llm_resilience_plugin.routing import ResilientRouter
    from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator

    prompt = ChatPromptTemplate.from_messages([("user", "In one sentence: {question}")])
    alerts: list[BudgetAlert] = []
    transitions: list[str] = []
    counts: Counter[str] = Counter()
    t_start = time.monotonic()

    with ProviderSimulator() as sim:
        router = ResilientRouter(
            model_list=_deployments(sim, "plugin"),
            fallbacks=[{"primary": ["backup"]}],
            policy={
                "deadline": 10,
                "attempt_timeout": 2.0,
                "first_chunk_timeout": 0.6,
                "backoff": {"initial": 0.05, "maximum": 0.5},
                "breaker": {"fail_max": 3, "reset_timeout": 1.0},
            },
        )
        guard = CostGuard(
            budgets=[Budget.scoped("tenant", TENANT_BUDGET, period="day")],
            ledger="memory",
            alert_at=0.8,
            on_alert=alerts.append,
            router=router,
        )

        def on_event(e: Event) -> None:
            if isinstance(e, BreakerTransition):
                transitions.append(
                    f"{time.monotonic() - t_start:5.1f}s  {e.deployment_id}: {e.old_state} -> {e.new_state}"
                )
            elif isinstance(e, RetryScheduled):
                counts["retries"] += 1
            elif isinstance(e, FallbackTaken):
                counts["fallbacks"] += 1

        router.subscribe(on_event)
        plugin_chain = (
            prompt | ResilientChatModel(router=router, model="primary", max_tokens=20) | StrOutputParser()
        )
        plain_router = litellm.Router(
            model_list=_deployments(sim, "plain"), fallbacks=[{"primary": ["backup"]}]
        )
        plain_chain = (
            prompt
            | ChatLiteLLMRouter(router=plain_router, model="primary", max_tokens=20)
            | StrOutputParser()
        )
        handler = CostGuardCallbackHandler(guard)
        systems = {"plugin": plugin_chain, "plain Router": plain_chain}
        tallies = {k: Tally() for k in systems}
        plain_spend = 0.0

        def both(dep: str, behaviour: Any) -> None:
            for prefix in ("plugin", "plain"):
                sim.set_default(f"{prefix}-{dep}", behaviour)

        def storm() -> None:
            for prefix in ("plugin", "plain"):
                sim.token_bucket(f"{prefix}-primary-a", rate=4, burst=2, retry_after=1)

        def outage() -> None:
            for prefix in ("plugin", "plain"):
                sim.outage(f"{prefix}-primary-a", 2.5, Fault.server_error(503))
                sim.outage(f"{prefix}-primary-b", 2.5, Fault.server_error(503))

        def slow_stream() -> None:
            both("primary-a", Fault.slow_first_token(2.5))

        def healthy() -> None:
            both("primary-a", Fault.ok())

        def calm() -> None:
            sim.reset()

        phases = [
            Phase("healthy", calls_per_phase, calm),
            Phase("429 storm on primary-a", calls_per_phase, storm),
            Phase("provider outage (primary down 2.5 s)", calls_per_phase, outage, wait_before=0.0),
            Phase("recovery", calls_per_phase, calm, wait_before=1.2),
            Phase("slow first token on primary-a (stream)", calls_per_phase, slow_stream, stream=True),
            Phase("tenant budget nearing its limit", calls_per_phase, healthy, tenant="acme"),
        ]
        progress = _Progress(out)
        out.write("llm-resilience demo: one incident, two systems, the built-in simulator (no API keys)\n")
        out.write("  plugin       = ResilientChatModel in a LangChain chain (primary -> backup)\n")
        out.write(
            "  plain Router = the same chain on ChatLiteLLMRouter, LiteLLM defaults + the same fallbacks\n\n"
        )

        async def one(system: str, chain: Any, phase: Phase, i: int) -> None:
            nonlocal plain_spend
            tally = tallies[system]
            config: dict[str, Any] = {"metadata": {}}
            if phase.tenant and system == "plugin":
                config = {"callbacks": [handler], "metadata": {"tenant": phase.tenant}}
            question = f"why do retries need jitter? (call {i})"
            t = time.monotonic()
            try:
                if phase.stream:
                    async for _ in chain.astream({"question": question}, config=config):
                        pass
                else:
                    await chain.ainvoke({"question": question}, config=config)
                tally.ok += 1
                if phase.tenant and system == "plain Router":
                    plain_spend += _estimate_cost(PRICE, question)
            except BudgetExceededError:
                tally.refused += 1
            except Exception as exc:
                tally.failed += 1
                tally.errors[type(exc).__name__] += 1
            tally.latencies.append(time.monotonic() - t)

        for phase in phases:
            phase.setup()
            if phase.wait_before:
                await asyncio.sleep(phase.wait_before)
            for i in range(phase.calls):
                await asyncio.gather(*(one(s, c, phase, i) for s, c in systems.items()))
                progress.update(phase.name, i + 1, phase.calls, tallies)
        router.close()
        upstream = {
            "plugin": sum(1 for r in sim.requests() if r.deployment.startswith("plugin-")),
            "plain Router": sum(1 for r in sim.requests() if r.deployment.startswith("plain-")),
        }
        spent = guard.report().total

    _summary(
        out, tallies, counts, transitions, alerts, upstream, spent, plain_spend, time.monotonic() - t_start
    )
    return 0 if tallies["plugin"].failed == 0 else 1


def _estimate_cost(price: dict[str, float], text: str) -> float:
    tokens_in = 20 + len(text) // 4
    return tokens_in * price["input_cost_per_token"] + 20 * price["output_cost_per_token"]


def _summary(
    out: TextIO,
    tallies: dict[str, Tally],
    counts: Counter[str],
    transitions: list[str],
    alerts: list[Any],
    upstream: dict[str, int],
    spent: float,
    plain_spend: float,
    elapsed: float,
) -> None:
    out.write("\nbreaker transitions (plugin):\n")
    for line in transitions or ["  (none)"]:
        out.write(f"  {line}\n")
    for a in alerts:
        head = f"\nbudget alert: {a.budget} [{a.scope}] crossed {a.threshold:.0%}"
        out.write(f"{head}: ${a.spent:.6f} of ${a.limit:.6f}\n")
    out.write("\n| | plugin | plain Router |\n|---|---:|---:|\n")
    rows: list[tuple[str, Callable[[Tally, str], str]]] = [
        ("calls", lambda t, s: str(len(t.latencies))),
        ("success rate", lambda t, s: f"{t.ok / max(1, len(t.latencies)):.1%}"),
        ("failed", lambda t, s: str(t.failed)),
        ("refused by budget (nothing sent)", lambda t, s: str(t.refused)),
        ("p50 latency", lambda t, s: f"{statistics.median(t.latencies) * 1e3:.0f} ms"),
        ("p95 latency", lambda t, s: f"{_pct(t.latencies, 95) * 1e3:.0f} ms"),
        ("p99 latency", lambda t, s: f"{_pct(t.latencies, 99) * 1e3:.0f} ms"),
        ("upstream requests", lambda t, s: str(upstream[s])),
    ]
    for label, fn in rows:
        cells = (fn(tallies["plugin"], "plugin"), fn(tallies["plain Router"], "plain Router"))
        out.write(f"| {label} | {cells[0]} | {cells[1]} |\n")
    out.write(f"| retries / fallbacks | {counts['retries']} / {counts['fallbacks']} | (not reported) |\n")
    out.write(f"| breaker transitions | {len(transitions)} | (no breakers) |\n")
    out.write(
        f"| tenant spend vs ${TENANT_BUDGET:.5f} budget | ${spent:.6f} | ~${plain_spend:.6f} (no budget) |\n"
    )
    errors = tallies["plain Router"].errors
    if errors:
        out.write("\nplain Router errors: " + ", ".join(f"{k} x{v}" for k, v in errors.most_common()) + "\n")
    out.write(f"\ndemo finished in {elapsed:.1f} s\n")
