"""The scripted incident behind ``llm-resilience demo``.

A LangChain chain on :class:`ResilientChatModel` and the same chain on a plain LiteLLM Router
(``ChatLiteLLMRouter``, LiteLLM's defaults plus the same fallbacks) run side by side through one
incident on the built-in simulator: a provider that hangs under concurrent traffic, a 429 storm, a
provider outage and its recovery, a slow stream, and a tenant budget reaching its limit. Each
system has its own copy of every deployment, and every fault is applied to both copies, so the
two see the same failures. After each phase one line says what to notice, in numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

PRICE = {"input_cost_per_token": 1.5e-7, "output_cost_per_token": 6e-7}
BACKUP_PRICE = {"input_cost_per_token": 2.5e-6, "output_cost_per_token": 1e-5}
BUDGET_PER_CALL = 0.00001  # the tenant's daily budget is this times the calls per phase
PATIENCE = 8.0  # seconds a caller waits in the "provider hangs" phase before giving up
SYSTEMS = ("plugin", "plain Router")
PREFIX = {"plugin": "plugin", "plain Router": "plain"}


@dataclass
class Tally:
    """What one system did (in one phase, or over the whole demo)."""

    latencies: list[float] = field(default_factory=list)
    ok: int = 0
    failed: int = 0
    refused: int = 0
    upstream: int = 0  # requests the simulator received
    errors: Counter[str] = field(default_factory=Counter)

    def add(self, other: Tally) -> None:
        """Fold a phase's tally into this one."""
        self.latencies += other.latencies
        self.ok += other.ok
        self.failed += other.failed
        self.refused += other.refused
        self.upstream += other.upstream
        self.errors.update(other.errors)

    def p(self, pct: float) -> float:
        """The ``pct`` percentile latency in milliseconds."""
        return _pct(self.latencies, pct) * 1e3

    def counts(self) -> str:
        """``"12 ok / 0 failed / 0 refused"``: the one vocabulary of the progress and the summary."""
        return f"{self.ok} ok / {self.failed} failed / {self.refused} refused"


@dataclass
class Phase:
    """One step of the incident: how to break the providers, and how to call them."""

    name: str
    calls: int
    setup: Callable[[], None]
    notice: Callable[[dict[str, Tally]], str]
    stream: bool = False
    tenant: str | None = None
    wait_before: float = 0.0
    concurrent: bool = False  # all calls at once (traffic), instead of one after another
    patience: float | None = None  # callers give up after this many seconds


@dataclass
class Incident:
    """What the demo saw outside the tallies: breaker transitions, retries, refusals, alerts."""

    t_start: float = field(default_factory=time.monotonic)
    transitions: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    refusals: list[Any] = field(default_factory=list)
    alerts: list[Any] = field(default_factory=list)
    plain_spend: float = 0.0


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
        parts = "  ".join(f"{k}: {t.counts()}" for k, t in tallies.items())
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


class _QuietRefusals(logging.Filter):
    """Drop LangChain's ``Error in CostGuardCallbackHandler...`` warning for a budget refusal:
    the demo reports refusals itself (the refusal still reaches the caller as an exception)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (
            str(record.msg).startswith("Error in %s.%s callback")
            and args[:1] == ("CostGuardCallbackHandler",)
            and "BudgetExceededError" in str(args[2:3])
        )


@contextlib.contextmanager
def _langchain_refusals_quiet() -> Iterator[None]:
    lg = logging.getLogger("langchain_core.callbacks.manager")
    quiet = _QuietRefusals()
    lg.addFilter(quiet)
    try:
        yield
    finally:
        lg.removeFilter(quiet)


def _phases(calls: int, sim: Any, inc: Incident, budget: float) -> list[Phase]:
    """The incident, phase by phase, each with the sentence a user should take away from it."""
    from llm_resilience_plugin.testing._simulator import Fault

    def both(dep: str, behaviour: Any) -> None:
        for prefix in PREFIX.values():
            sim.set_default(f"{prefix}-{dep}", behaviour)

    def storm() -> None:
        sim.reset()  # the hang is over
        for prefix in PREFIX.values():
            sim.token_bucket(f"{prefix}-primary-a", rate=4, burst=2, retry_after=1)

    def outage() -> None:
        for prefix in PREFIX.values():
            sim.outage(f"{prefix}-primary-a", 2.5, Fault.server_error(503))
            sim.outage(f"{prefix}-primary-b", 2.5, Fault.server_error(503))

    def hang() -> None:
        sim.reset()
        both("primary-a", Fault.silence(max_hold=30))
        both("primary-b", Fault.silence(max_hold=30))

    def slow_stream() -> None:
        sim.reset()
        both("primary-a", Fault.slow_first_token(2.5))

    def opened() -> int:
        return sum("-> open" in line for line in inc.transitions)

    def why_outage(t: dict[str, Tally]) -> str:
        n = opened() - before_outage[0]
        return f"{n} breaker(s) opened, so the plugin stopped calling the dead deployments" if n else ""

    def why_hang(t: dict[str, Tally]) -> str:
        if not t["plain Router"].failed:
            return ""
        return (
            f"LiteLLM's default timeout is {_litellm_timeout():g} s, so the plain Router's callers waited "
            f"until they gave up at {PATIENCE:g} s; the plugin's 2 s attempt timeout sent them to backup"
        )

    def why_stream(t: dict[str, Tally]) -> str:
        if t["plugin"].p(95) >= t["plain Router"].p(95):
            return ""
        return "the plugin's 0.6 s first-chunk timeout restarted each late stream on another deployment"

    def why_budget(t: dict[str, Tally]) -> str:
        return (
            f"the plugin's cost guard keeps tenant acme within ${budget:.5f} a day; the plain Router "
            f"has no budget (~${inc.plain_spend:.6f} spent)"
        )

    before_outage = [0]

    def outage_and_count() -> None:
        before_outage[0] = opened()
        outage()

    return [
        Phase("healthy", calls, sim.reset, _notice()),
        Phase(
            f"primary hangs, {calls} callers at once",
            calls,
            hang,
            _notice(why_hang),
            concurrent=True,
            patience=PATIENCE,
        ),
        # After the hang the plugin's breakers are open (1 s reset): let them probe first.
        Phase("429 storm on primary-a", calls, storm, _notice(), wait_before=1.2),
        Phase("provider outage (primary down 2.5 s)", calls, outage_and_count, _notice(why_outage)),
        Phase("recovery", calls, sim.reset, _notice(), wait_before=1.2),
        Phase(
            "slow first token on primary-a (stream)",
            calls,
            slow_stream,
            _notice(why_stream),
            stream=True,
        ),
        Phase("tenant budget reaching its limit", calls, sim.reset, _notice(why_budget), tenant="acme"),
    ]


def _notice(why: Callable[[dict[str, Tally]], str] | None = None) -> Callable[[dict[str, Tally]], str]:
    """The phase's line: where the two systems differed (answers, requests sent, p95), then why."""

    def notice(t: dict[str, Tally]) -> str:
        p, n = t["plugin"], t["plain Router"]
        bits = []
        if p.ok != n.ok:
            bits.append(f"answered: plugin {p.ok}/{len(p.latencies)}, plain Router {n.ok}/{len(n.latencies)}")
        if p.refused != n.refused:
            bits.append(f"refused before sending: plugin {p.refused}, plain Router {n.refused}")
        if min(p.upstream, n.upstream) and max(p.upstream, n.upstream) >= 1.5 * min(p.upstream, n.upstream):
            bits.append(f"upstream requests: plugin {p.upstream}, plain Router {n.upstream}")
        if max(p.p(95), n.p(95)) >= 1.5 * min(p.p(95), n.p(95)) + 50:
            bits.append(f"p95: plugin {p.p(95):.0f} ms, plain Router {n.p(95):.0f} ms")
        reason = why(t) if why is not None else ""
        return "; ".join(bits or ["no real difference in this phase"]) + (f" - {reason}" if reason else "")

    return notice


def _litellm_timeout() -> float:
    import litellm

    return float(litellm.request_timeout)


async def run_demo(calls_per_phase: int = 12, out: TextIO = sys.stdout) -> int:
    """Run the incident on both systems and print the progress, a line per phase and a summary.

    Exit code 0 when the plugin failed no call (a budget refusal is not a failure).
    """
    try:
        from langchain_litellm import ChatLiteLLMRouter
    except ImportError:
        out.write(
            "the demo compares against langchain-litellm's ChatLiteLLMRouter: "
            "run bash scripts/demo.sh from a checkout, or pip install -e '.[demo]' there "
            "(or pip install langchain-litellm)\n"
        )
        return 2
    from llm_resilience_plugin._litellm import CapabilityWarning

    # A LiteLLM without a capability (e.g. direct dispatch) changes no figure the demo compares.
    with _langchain_refusals_quiet(), warnings.catch_warnings():
        warnings.simplefilter("ignore", CapabilityWarning)
        return await _run(calls_per_phase, out, ChatLiteLLMRouter)


async def _run(calls_per_phase: int, out: TextIO, chat_litellm_router: Any) -> int:
    import litellm
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate

    from llm_resilience_plugin.cost import Budget, CostGuard
    from llm_resilience_plugin.errors import BudgetExceededError
    from llm_resilience_plugin.events import BreakerTransition, Event, FallbackTaken, RetryScheduled
    from llm_resilience_plugin.langchain import CostGuardCallbackHandler, ResilientChatModel
    from llm_resilience_plugin.routing import ResilientRouter
    from llm_resilience_plugin.testing._simulator import ProviderSimulator

    prompt = ChatPromptTemplate.from_messages([("user", "In one sentence: {question}")])
    inc = Incident()
    budget = BUDGET_PER_CALL * calls_per_phase

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
            budgets=[Budget.scoped("tenant", budget, period="day")],
            ledger="memory",
            alert_at=0.8,
            on_alert=inc.alerts.append,
            router=router,
        )

        def on_event(e: Event) -> None:
            if isinstance(e, BreakerTransition):
                at = time.monotonic() - inc.t_start
                inc.transitions.append(f"{at:5.1f}s  {e.deployment_id}: {e.old_state} -> {e.new_state}")
            elif isinstance(e, RetryScheduled):
                inc.counts["retries"] += 1
            elif isinstance(e, FallbackTaken):
                inc.counts["fallbacks"] += 1

        router.subscribe(on_event)
        plugin_chain = (
            prompt | ResilientChatModel(router=router, model="primary", max_tokens=20) | StrOutputParser()
        )
        plain_router = litellm.Router(
            model_list=_deployments(sim, "plain"), fallbacks=[{"primary": ["backup"]}]
        )
        plain_chain = (
            prompt
            | chat_litellm_router(router=plain_router, model="primary", max_tokens=20)
            | StrOutputParser()
        )
        handler = CostGuardCallbackHandler(guard)
        chains = {"plugin": plugin_chain, "plain Router": plain_chain}
        totals = {k: Tally() for k in SYSTEMS}
        progress = _Progress(out)
        out.write("llm-resilience demo: one incident, two systems, the built-in simulator (no API keys)\n")
        out.write("  plugin       = ResilientChatModel in a LangChain chain (primary -> backup)\n")
        out.write(
            "  plain Router = the same chain on ChatLiteLLMRouter, LiteLLM defaults + the same fallbacks\n\n"
        )

        async def one(system: str, phase: Phase, i: int, tally: Tally) -> None:
            chain = chains[system]
            config: dict[str, Any] = {"metadata": {}}
            if phase.tenant and system == "plugin":
                config = {"callbacks": [handler], "metadata": {"tenant": phase.tenant}}
            question = f"why do retries need jitter? (call {i})"

            async def call() -> None:
                if phase.stream:
                    async for _ in chain.astream({"question": question}, config=config):
                        pass
                else:
                    await chain.ainvoke({"question": question}, config=config)

            t = time.monotonic()
            try:
                await asyncio.wait_for(call(), phase.patience)
                tally.ok += 1
                if phase.tenant and system == "plain Router":
                    inc.plain_spend += _estimate_cost(PRICE, question)
            except BudgetExceededError as exc:
                tally.refused += 1
                inc.refusals.append(exc)
            except TimeoutError:
                tally.failed += 1
                tally.errors[f"gave up after {phase.patience:g} s"] += 1
            except Exception as exc:
                tally.failed += 1
                tally.errors[type(exc).__name__] += 1
            tally.latencies.append(time.monotonic() - t)

        for phase in _phases(calls_per_phase, sim, inc, budget):
            phase.setup()
            if phase.wait_before:
                await asyncio.sleep(phase.wait_before)
            tallies = {k: Tally() for k in SYSTEMS}
            refused_before = len(inc.refusals)
            if phase.concurrent:
                await asyncio.gather(
                    *(one(s, phase, i, tallies[s]) for i in range(phase.calls) for s in SYSTEMS)
                )
                progress.update(phase.name, phase.calls, phase.calls, tallies)
            else:
                for i in range(phase.calls):
                    await asyncio.gather(*(one(s, phase, i, tallies[s]) for s in SYSTEMS))
                    progress.update(phase.name, i + 1, phase.calls, tallies)
            for system in SYSTEMS:  # every request the simulator saw in this phase
                tallies[system].upstream = sum(
                    1 for r in sim.requests() if r.deployment.startswith(f"{PREFIX[system]}-")
                )
                totals[system].add(tallies[system])
            sim.clear_log()
            out.write(f"    notice: {phase.notice(tallies)}\n")
            _explain_refusals(out, inc.refusals[refused_before:])
        router.close()
        spent = guard.report().total
        guard.close()

    _summary(out, totals, inc, spent, budget, time.monotonic() - inc.t_start)
    return 0 if totals["plugin"].failed == 0 else 1


def _explain_refusals(out: TextIO, refusals: list[Any]) -> None:
    """The phase's budget refusals in the demo's words (what was refused, and why)."""
    if not refusals:
        return
    e = refusals[0]
    out.write(
        f"       refused before sending: {len(refusals)} call(s) - budget {e.budget}: spent "
        f"${e.spent:.6f} + this call's worst case ${e.reservation:.6f} > limit ${e.limit:.6f}\n"
    )


def _estimate_cost(price: dict[str, float], text: str) -> float:
    tokens_in = 20 + len(text) // 4
    return tokens_in * price["input_cost_per_token"] + 20 * price["output_cost_per_token"]


def _summary(
    out: TextIO, totals: dict[str, Tally], inc: Incident, spent: float, budget: float, elapsed: float
) -> None:
    out.write("\nbreaker transitions (plugin):\n")
    for line in inc.transitions or ["  (none)"]:
        out.write(f"  {line}\n")
    for a in inc.alerts:
        head = f"\nbudget alert: {a.budget} [{a.scope}] crossed {a.threshold:.0%}"
        out.write(f"{head}: ${a.spent:.6f} of ${a.limit:.6f}\n")
    out.write("\n| | plugin | plain Router |\n|---|---:|---:|\n")
    rows: list[tuple[str, Callable[[Tally], str]]] = [
        ("calls", lambda t: str(len(t.latencies))),
        ("ok", lambda t: str(t.ok)),
        ("success rate", lambda t: f"{t.ok / max(1, len(t.latencies)):.1%}"),
        ("failed", lambda t: str(t.failed)),
        ("refused (budget, nothing sent)", lambda t: str(t.refused)),
        ("p50 latency", lambda t: f"{statistics.median(t.latencies) * 1e3:.0f} ms"),
        ("p95 latency", lambda t: f"{t.p(95):.0f} ms"),
        ("p99 latency", lambda t: f"{t.p(99):.0f} ms"),
        ("upstream requests (all phases)", lambda t: str(t.upstream)),
    ]
    for label, fn in rows:
        out.write(f"| {label} | {fn(totals['plugin'])} | {fn(totals['plain Router'])} |\n")
    out.write(
        f"| retries / fallbacks | {inc.counts['retries']} / {inc.counts['fallbacks']} | (not reported) |\n"
    )
    out.write(f"| breaker transitions | {len(inc.transitions)} | (no breakers) |\n")
    out.write(
        f"| tenant spend vs ${budget:.5f} budget | ${spent:.6f} | ~${inc.plain_spend:.6f} (no budget) |\n"
    )
    for system in SYSTEMS:
        errors = totals[system].errors
        if errors:
            listed = ", ".join(f"{k} x{v}" for k, v in errors.most_common())
            out.write(f"\n{system} failures: {listed}\n")
    out.write(f"\ndemo finished in {elapsed:.1f} s\n")
