"""One scenario against one system: the timeline driven on the simulator, the calls sent, each
call's outcome recorded, and the simulator's log read back.

Systems: ``plugin`` (a :class:`ResilientRouter` from the user's config) and ``litellm`` (a plain
``litellm.Router`` from the same ``model_list`` and ``router_settings``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llm_resilience_plugin.events import BreakerTransition, StreamRestart
from llm_resilience_plugin.policy import RouterSpec, local_router_settings, offline_spec
from llm_resilience_plugin.routing import get_report
from llm_resilience_plugin.testing._simulator import ProviderSimulator, RequestRecord
from llm_resilience_plugin.testing.chaos._scenario import RateLimit, Scenario
from llm_resilience_plugin.testing.chaos._target import Target, simulated_target

__all__ = [
    "CALL_CAP",
    "SYSTEMS",
    "CallResult",
    "Prepared",
    "RunResult",
    "call_tag",
    "execute",
    "prepare",
    "run_scenario",
    "timeline_events",
    "warm_up",
]

SYSTEMS = ("plugin", "litellm")
CALL_CAP = 90.0  # seconds: a call still running then is abandoned and counted as failed
_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Look up an order by its number.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "integer"}},
            "required": ["order_id"],
        },
    },
}


@dataclass(frozen=True)
class CallResult:
    """One call: when it started and ended (seconds from the scenario's start), how it went."""

    tag: str
    start: float
    end: float
    ok: bool
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    queued: float = 0.0
    """Seconds the plugin held the call back for a deployment's rate limit (its report's
    ``queued_s``; 0 for a plain Router)."""

    @property
    def latency(self) -> float:
        """Seconds the caller waited."""
        return self.end - self.start


@dataclass
class RunResult:
    """A scenario's run on one system: its calls, the upstream requests, breaker transitions."""

    scenario: Scenario
    system: str
    target: Target
    calls: list[CallResult]
    requests: list[RequestRecord]
    started_at: float
    transitions: list[tuple[str, float, str]] = field(default_factory=list)
    """(deployment id, seconds from start, new state), the plugin's breakers only."""

    def offset(self, record: RequestRecord) -> float:
        """A request's arrival, in seconds from the scenario's start."""
        return record.started_at - self.started_at


def call_tag(record: RequestRecord) -> str | None:
    """The call a logged request belongs to (``user`` / Anthropic ``metadata.user_id``)."""
    body = record.body
    user = body.get("user")
    if isinstance(user, str):
        return user
    meta = body.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("user_id"), str):
        return str(meta["user_id"])
    return None


def _messages(scenario: Scenario) -> list[dict[str, Any]]:
    words = ["Please", "look", "up", "order", "42", "and", "summarise", "it."]
    text = " ".join(words[i % len(words)] for i in range(scenario.prompt_words))
    return [{"role": "user", "content": text}]


def _cost_section(spec: RouterSpec, scenario: Scenario) -> dict[str, Any] | None:
    cost = dict(spec.cost) if spec.cost is not None else None
    if scenario.budget is not None:
        cost = {**(cost or {}), "budgets": [{"period": "day", "limit": scenario.budget}]}
        cost.pop("alert_at", None)
        cost.setdefault("unknown_model", [1e-6, 2e-6])  # simulated models may have no list price
    if cost is not None:
        cost["ledger"] = "memory"  # never the user's real ledger
    return cost


async def _judge_stream(stream: Any) -> tuple[bool, str | None, int, int]:
    parts: list[str] = []
    finish = None
    tools = False
    prompt = completion = 0
    async for chunk in stream:
        if isinstance(chunk, StreamRestart):
            if chunk.mode == "restart":
                parts, finish = [], None
            continue
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            prompt = getattr(usage, "prompt_tokens", 0) or prompt
            completion = getattr(usage, "completion_tokens", 0) or completion
        choices = getattr(chunk, "choices", None) or []
        if not choices:
            continue
        delta = getattr(choices[0], "delta", None)
        text = getattr(delta, "content", None)
        if text:
            parts.append(str(text))
        if getattr(delta, "tool_calls", None):
            tools = True
        if getattr(choices[0], "finish_reason", None):
            finish = choices[0].finish_reason
    ok = bool(parts or tools) and finish in ("stop", "length", "tool_calls")
    return ok, None if ok else f"incomplete stream (finish {finish})", prompt, completion


def _judge(resp: Any, scenario: Scenario) -> tuple[bool, str | None, int, int]:
    choices = getattr(resp, "choices", None) or []
    usage = getattr(resp, "usage", None)
    prompt = getattr(usage, "prompt_tokens", 0) or 0
    completion = getattr(usage, "completion_tokens", 0) or 0
    if not choices:
        return False, "no choices", prompt, completion
    message = choices[0].message
    if scenario.tools and not getattr(message, "tool_calls", None):
        return False, "tool call lost", prompt, completion
    if not (message.content or getattr(message, "tool_calls", None)):
        return False, "empty answer", prompt, completion
    return True, None, prompt, completion


class _Caller:
    """Sends one scenario's calls through one router and records each one."""

    def __init__(self, router: Any, scenario: Scenario, primary: str, t0: float, prefix: str) -> None:
        self.router = router
        self.scenario = scenario
        self.primary = primary
        self.t0 = t0
        self.prefix = prefix
        self.messages = _messages(scenario)

    async def one(self, i: int) -> CallResult:
        sc = self.scenario
        tag = f"{self.prefix}-{i}"
        kwargs: dict[str, Any] = {"max_tokens": sc.max_tokens, "user": tag}
        if sc.tools:
            kwargs["tools"] = [_TOOL]
        start = time.monotonic() - self.t0
        answer: Any = None
        try:
            if sc.stream:
                kwargs["stream_options"] = {"include_usage": True}

                async def streamed() -> tuple[bool, str | None, int, int]:
                    nonlocal answer
                    stream = answer = await self.router.acompletion(
                        model=self.primary, messages=self.messages, stream=True, **kwargs
                    )
                    return await _judge_stream(stream)

                ok, error, pt, ct = await asyncio.wait_for(streamed(), CALL_CAP)
            else:
                resp = answer = await asyncio.wait_for(
                    self.router.acompletion(model=self.primary, messages=self.messages, **kwargs),
                    CALL_CAP,
                )
                ok, error, pt, ct = _judge(resp, sc)
        except TimeoutError:
            ok, error, pt, ct = False, f"still running after {CALL_CAP:g} s", 0, 0
        except Exception as exc:
            answer = exc
            ok, error, pt, ct = False, type(exc).__name__, 0, 0
        end = time.monotonic() - self.t0
        report = get_report(answer) if answer is not None else None
        queued = report.queued_s if report is not None else 0.0
        return CallResult(tag, start, end, ok, error, pt, ct, queued)


def timeline_events(target: Target, scenario: Scenario) -> list[tuple[float, str, Any]]:
    """The timeline as (seconds from start, simulator deployment, behaviour), in time order."""
    healthy = scenario.healthy.behavior()
    events: list[tuple[float, str, Any]] = []
    for selector, phases in scenario.timeline.items():
        for dep in target.select(selector):
            for phase in phases:
                events.append((phase.at, dep.sim_name, phase.fault.behavior()))
                if phase.until is not None:
                    events.append((phase.until, dep.sim_name, healthy))
    events.sort(key=lambda e: e[0])
    return events


async def _drive(sim: ProviderSimulator, events: list[tuple[float, str, Any]], t0: float) -> None:
    """Apply the timeline's later events, each at its time."""
    for at, name, behavior in events:
        delay = t0 + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        sim.set_default(name, behavior)


async def _load(caller: _Caller, scenario: Scenario, progress: Callable[[], None]) -> list[CallResult]:
    async def tracked(i: int) -> CallResult:
        result = await caller.one(i)
        progress()
        return result

    if scenario.rate is not None:
        tasks = []
        for i in range(scenario.calls):
            delay = caller.t0 + i / scenario.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(tracked(i)))
        return list(await asyncio.gather(*tasks))
    sem = asyncio.Semaphore(scenario.concurrency or 4)

    async def limited(i: int) -> CallResult:
        async with sem:
            return await tracked(i)

    return list(await asyncio.gather(*(limited(i) for i in range(scenario.calls))))


def _build(system: str, spec: RouterSpec, raw_settings: dict[str, Any], target: Target, sc: Scenario) -> Any:
    if system == "plugin":
        from llm_resilience_plugin.routing import ResilientRouter

        update: dict[str, Any] = {"model_list": target.model_list, "cost": _cost_section(spec, sc)}
        local = offline_spec(spec.model_copy(update=update))  # nothing leaves the machine
        return ResilientRouter.from_spec(local, seed=7, shared_state=False)
    import litellm

    settings, _ = local_router_settings(raw_settings)
    return litellm.Router(model_list=target.model_list, **settings)


@dataclass
class Prepared:
    """A run ready to start: the config pointed at the simulator, the router built and warmed up
    (built before any run starts: building is synchronous and would stall the runs in progress)."""

    sim: ProviderSimulator
    scenario: Scenario
    system: str
    target: Target
    router: Any
    events: list[tuple[float, str, Any]]
    limits: list[tuple[str, RateLimit]]

    def close(self) -> None:
        """Close the router (the plugin's; a plain Router has nothing to close)."""
        if self.system == "plugin":
            self.router.close()


def prepare(
    sim: ProviderSimulator,
    spec: RouterSpec,
    raw_settings: dict[str, Any],
    scenario: Scenario,
    system: str,
    *,
    primary: str,
) -> Prepared:
    """Point the config at ``sim`` (deployments ``<scenario>-<system>-<id>``, healthy) and build
    the system's router; a bad selector fails here, before any call."""
    prefix = f"{scenario.name}-{system}"
    target = simulated_target(
        spec.model_list,
        base_url=sim.base_url,
        prefix=prefix,
        primary=primary,
        fallbacks=spec.fallback_chain(primary, None),
    )
    events = timeline_events(target, scenario)
    limits = [(d.sim_name, lim) for sel, lim in scenario.limits.items() for d in target.select(sel)]
    for dep in target.deployments:
        sim.set_default(dep.sim_name, scenario.healthy.behavior())
    router = _build(system, spec, raw_settings, target, scenario)
    return Prepared(sim, scenario, system, target, router, events, limits)


async def warm_up(p: Prepared, calls: int = 2) -> None:
    """A few healthy calls (not measured): clients opened, lazy imports done, as in production."""
    caller = _Caller(
        p.router, p.scenario, p.target.primary, time.monotonic(), f"warmup-{p.scenario.name}-{p.system}"
    )
    for i in range(calls):
        await caller.one(i)


async def execute(p: Prepared, progress: Callable[[], None] = lambda: None) -> RunResult:
    """Inject the timeline, send the scenario's calls, read the simulator's log; closes the router."""
    sim, scenario, system, target, router = p.sim, p.scenario, p.system, p.target, p.router
    transitions: list[tuple[str, float, str]] = []
    t0 = time.monotonic()
    for _, name, behavior in (e for e in p.events if e[0] <= 0):
        sim.set_default(name, behavior)
    for name, lim in p.limits:  # full buckets at the start: the warm-up spent none of them
        sim.rate_limit(
            name, lim.rpm, lim.tpm, burst_s=lim.burst_s, retry_after=lim.retry_after, headers=lim.headers
        )
    if system == "plugin":

        def on_event(event: Any) -> None:
            if isinstance(event, BreakerTransition):
                transitions.append((event.deployment_id, time.monotonic() - t0, event.new_state))

        router.subscribe(on_event)
    caller = _Caller(router, scenario, target.primary, t0, f"{scenario.name}-{system}")
    driver = asyncio.create_task(_drive(sim, [e for e in p.events if e[0] > 0], t0))
    try:
        calls = await _load(caller, scenario, progress)
    finally:
        driver.cancel()
        p.close()
    names = {d.sim_name for d in target.deployments}
    requests = [r for r in sim.requests() if r.deployment in names and r.started_at >= t0]
    return RunResult(scenario, system, target, calls, requests, t0, transitions)


async def run_scenario(
    sim: ProviderSimulator,
    spec: RouterSpec,
    raw_settings: dict[str, Any],
    scenario: Scenario,
    system: str,
    *,
    primary: str,
    progress: Callable[[], None] = lambda: None,
    warmup: int = 2,
) -> RunResult:
    """Run ``scenario`` on ``system`` against ``sim``: prepare, warm up, execute."""
    p = prepare(sim, spec, raw_settings, scenario, system, primary=primary)
    try:
        await warm_up(p, warmup)
    except BaseException:
        p.close()
        raise
    return await execute(p, progress)
