"""The four systems the chaos benchmark compares, each read by three kinds of caller.

Systems (same deployments, same workload):
  bare      litellm.Router with LiteLLM's defaults (+ the same fallbacks)
  tuned     litellm.Router tuned: num_retries=2, allowed_fails=2, cooldown_time=5, timeout=30,
            stream_timeout=10 (the plugin's attempt and stream timeouts), fallbacks
  langchain ChatLiteLLMRouter(...).with_retry(3 tries, jitter).with_fallbacks([...]) over a Router
            with num_retries=0 and LiteLLM's default timeout (LangChain's own tools)
  plugin    ResilientRouter on its default policy (plus what a scenario pins)

Callers: ``completion`` (non-stream call), ``stream`` (a plain chunk loop on the router's stream,
reading only ``chunk.choices``; every system on its defaults), ``astream`` (LangChain ``astream``
of the chat model, the chunks summed), ``lc`` (LangChain ``ainvoke`` over a streaming chat model:
``ChatLiteLLMRouter(streaming=True)`` or ``ResilientChatModel(streaming=True)``, defaults).

An answer counts only when complete: exactly one deployment's full text (one of its samples),
finish reason ``stop``. A call that ends with ``stop`` on any other text is **garbled**: it looks
complete, but is not one deployment's answer (two spliced, a gap, a repeat).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import llm_resilience_plugin  # noqa: F401  (offline LiteLLM settings first)
from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin.events import AttemptRecord, BreakerTransition, StreamRestart

try:  # run as a script (python benchmarks/x.py) or imported as benchmarks.x
    from _chaos_scenarios import Scenario, answer_text
except ImportError:  # pragma: no cover
    from benchmarks._chaos_scenarios import Scenario, answer_text

__all__ = [
    "MSG",
    "SYSTEMS",
    "Cell",
    "Outcome",
    "System",
    "build",
]

MSG = [{"role": "user", "content": "Give me one paragraph about resilience."}]
SYSTEMS = ("bare", "tuned", "langchain", "plugin")

# The tuned Router's timeouts: the plugin's attempt timeout and its stream timeouts.
TUNED_TIMEOUT = 30.0
TUNED_STREAM_TIMEOUT = 10.0


class Addresses(Protocol):
    """Where a simulator deployment is served (a ProviderSimulator or the benchmark's child process)."""

    def api_base(self, deployment: str) -> str: ...


@dataclass(frozen=True)
class Outcome:
    """One call: a complete answer or not, which deployment's answer, or the error's type."""

    ok: bool
    deployment: str | None = None
    error: str | None = None
    markers: tuple[str, ...] = ()
    """Chunk consumers on the plugin: restart markers the stream yielded (none on its defaults)."""
    garbled: bool = False
    """Ended with ``stop`` on a text that is no deployment's answer."""


@dataclass(frozen=True)
class Cell:
    """One (scenario, system, caller) run; its simulator deployments carry its own prefix, so
    cells never share one (they may run at the same time)."""

    scenario: Scenario
    system: str
    consumer: str

    def dep(self, name: str) -> str:
        """The simulator deployment standing for the scenario's ``name`` in this cell."""
        return f"{self.scenario.name}-{self.system}-{self.consumer}-{name}"

    def answer(self, name: str, draw: int = 0) -> str:
        """The full answer of the scenario's deployment ``name`` in this cell (its ``draw``-th sample)."""
        return answer_text(self.dep(name), self.scenario.same_model, draw)

    def judge(self, text: Any, finish: Any) -> Outcome:
        """Complete (one deployment's exact answer, finish ``stop``), garbled, or not complete."""
        for name in self.scenario.deployments:
            if any(text == self.answer(name, d) for d in range(self.scenario.draws)):
                if finish == "stop":
                    return Outcome(True, name)
                return Outcome(False, name, f"finish_reason={finish}")
        if finish == "stop":
            return Outcome(False, None, "garbled", garbled=True)
        return Outcome(False, None, "incomplete text" if text else "no text")


@dataclass
class System:
    """A built system: one call as the cell's caller makes it, and how to close it."""

    call: Callable[[], Awaitable[Outcome]]
    close: Callable[[], None] = lambda: None
    opened: list[tuple[str, float, str]] = field(default_factory=list)
    """Plugin only: breaker transitions to or from open (deployment id, monotonic time, new state)."""
    sent: list[tuple[str, float, bool]] = field(default_factory=list)
    """Plugin only: attempts it sent (deployment id, monotonic time the attempt opened, probe)."""


def model_list(sim: Addresses, cell: Cell) -> list[dict[str, Any]]:
    """LiteLLM's model_list for the cell: one openai/ deployment per simulator deployment."""
    return [
        {
            "model_name": group,
            "litellm_params": {
                "model": "openai/gpt-4o-mini",
                "api_base": sim.api_base(cell.dep(d)),
                "api_key": "sk-sim",
                "input_cost_per_token": 1e-6,
                "output_cost_per_token": 2e-6,
            },
            "model_info": {"id": cell.dep(d), "supports_assistant_prefill": d in cell.scenario.prefill},
        }
        for group, deps in cell.scenario.groups.items()
        for d in deps
    ]


def _choice(obj: Any) -> Any:
    choices = getattr(obj, "choices", None) or []
    return choices[0] if choices else None


async def _read_stream(cell: Cell, stream: Any) -> Outcome:
    """A plain chunk loop: concatenates ``chunk.choices[0].delta.content``; anything else in the
    stream (a restart marker) is counted and skipped, as a loop that does not know it would."""
    parts: list[str] = []
    finish = None
    markers: list[str] = []
    async for chunk in stream:
        if isinstance(chunk, StreamRestart):
            markers.append(chunk.mode)
            continue
        choice = _choice(chunk)
        if choice is None:
            continue
        text = getattr(getattr(choice, "delta", None), "content", None)
        if text:
            parts.append(text)
        if getattr(choice, "finish_reason", None):
            finish = choice.finish_reason
    return dataclasses.replace(cell.judge("".join(parts), finish), markers=tuple(markers))


def _judge_message(cell: Cell, message: Any) -> Outcome:
    meta = getattr(message, "response_metadata", None) or {}
    return cell.judge(message.content, meta.get("finish_reason"))


async def _read_lc_stream(cell: Cell, chunks: Any) -> Outcome:
    """LangChain ``astream``: the chunks summed, judged like an ``ainvoke`` answer."""
    total: Any = None
    async for chunk in chunks:
        total = chunk if total is None else total + chunk
    if total is None:
        return Outcome(False, None, "no chunks")
    return _judge_message(cell, total)


def _litellm_router(cell: Cell, sim: Addresses, **settings: Any) -> Any:
    import litellm  # after llm_resilience_plugin: its env keeps LiteLLM offline

    return litellm.Router(model_list=model_list(sim, cell), **settings)


def _direct(cell: Cell, router: Any) -> Callable[[], Awaitable[Outcome]]:
    """A completion or a chunk consumer on ``router.acompletion`` (LiteLLM's or the plugin's)."""
    group = cell.scenario.primary
    request = cell.scenario.request
    if cell.consumer == "stream":

        async def stream() -> Outcome:
            return await _read_stream(
                cell, await router.acompletion(model=group, messages=MSG, stream=True, **request)
            )

        return stream

    async def completion() -> Outcome:
        choice = _choice(await router.acompletion(model=group, messages=MSG, **request))
        return cell.judge(choice.message.content, choice.finish_reason)

    return completion


def _over_router(cell: Cell, router: Any) -> Callable[[], Awaitable[Outcome]]:
    """bare/tuned: the Router called directly, or through LangChain's ChatLiteLLMRouter."""
    if cell.consumer not in ("lc", "astream"):
        return _direct(cell, router)
    from langchain_litellm import ChatLiteLLMRouter

    chat = ChatLiteLLMRouter(
        router=router, model=cell.scenario.primary, streaming=True, **cell.scenario.request
    )
    return _over_chat(cell, chat)


def _over_chat(cell: Cell, chat: Any) -> Callable[[], Awaitable[Outcome]]:
    """LangChain callers of a chat model (or runnable): ``astream`` summed, or ``ainvoke``."""
    if cell.consumer == "astream":

        async def astream() -> Outcome:
            return await _read_lc_stream(cell, chat.astream(MSG))

        return astream

    async def lc() -> Outcome:
        return _judge_message(cell, await chat.ainvoke(MSG))

    return lc


def _langchain(cell: Cell, sim: Addresses) -> System:
    """LangChain's own tools: with_retry on each group, with_fallbacks across groups."""
    from langchain_litellm import ChatLiteLLMRouter

    router = _litellm_router(cell, sim, num_retries=0)
    streaming = cell.consumer != "completion"

    def model(group: str) -> Any:
        return ChatLiteLLMRouter(
            router=router, model=group, max_retries=0, streaming=streaming, **cell.scenario.request
        ).with_retry(stop_after_attempt=3, wait_exponential_jitter=True)

    primary = cell.scenario.primary
    chain = cell.scenario.fallbacks[0][primary]
    runnable = model(primary).with_fallbacks([model(g) for g in chain])
    if cell.consumer in ("stream", "astream"):  # its stream is LangChain's astream

        async def stream() -> Outcome:
            return await _read_lc_stream(cell, runnable.astream(MSG))

        return System(stream)

    async def invoke() -> Outcome:
        return _judge_message(cell, await runnable.ainvoke(MSG))

    return System(invoke)


def _plugin(cell: Cell, sim: Addresses) -> System:
    """The plugin on its defaults: its router directly, or its chat model."""
    policy: dict[str, Any] = dict(cell.scenario.plugin_policy)
    router = ResilientRouter(
        model_list=model_list(sim, cell), fallbacks=cell.scenario.fallbacks, policy=policy
    )
    opened: list[tuple[str, float, str]] = []
    sent: list[tuple[str, float, bool]] = []
    wall_to_monotonic = time.time() - time.monotonic()

    def on_event(e: Any) -> None:
        if isinstance(e, BreakerTransition) and "open" in (e.new_state, e.old_state):
            opened.append((e.deployment_id, time.monotonic(), e.new_state))
        elif isinstance(e, AttemptRecord) and e.outcome != "skipped" and e.deployment_id:
            sent.append((e.deployment_id, e.started_at - wall_to_monotonic, e.probe))

    router.subscribe(on_event)
    if cell.consumer not in ("lc", "astream"):
        return System(_direct(cell, router), router.close, opened, sent)
    from llm_resilience_plugin.langchain import ResilientChatModel

    chat = ResilientChatModel(
        router=router, model=cell.scenario.primary, streaming=True, **cell.scenario.request
    )
    return System(_over_chat(cell, chat), router.close, opened, sent)


def build(cell: Cell, sim: Addresses) -> System:
    """The cell's system, ready to call."""
    sc = cell.scenario
    if cell.system == "bare":
        return System(_over_router(cell, _litellm_router(cell, sim, fallbacks=sc.fallbacks)))
    if cell.system == "tuned":
        router = _litellm_router(
            cell,
            sim,
            fallbacks=sc.fallbacks,
            num_retries=2,
            allowed_fails=2,
            cooldown_time=5,
            timeout=TUNED_TIMEOUT,
            stream_timeout=TUNED_STREAM_TIMEOUT,
            retry_after=0,
        )
        return System(_over_router(cell, router))
    if cell.system == "langchain":
        return _langchain(cell, sim)
    if cell.system == "plugin":
        return _plugin(cell, sim)
    raise ValueError(f"unknown system {cell.system!r}; choose from {', '.join(SYSTEMS)}")
