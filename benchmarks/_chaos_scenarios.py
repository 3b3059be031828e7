"""The chaos benchmark's scenarios: the deployments of a call, what the simulator does to them, and
how calls arrive. Every deployment answers a known 60-word text naming it, so a truncated or
spliced answer is told from a complete one by its text, and the deployment that answered by its
name (the first word; the last one where the deployments serve the same model and repeat each
other word for word up to it)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import llm_resilience_plugin  # noqa: F401  (offline LiteLLM settings first)
from llm_resilience_plugin.testing import Behavior, Fault

__all__ = [
    "HEALTHY_CHUNK_DELAY",
    "HEALTHY_TTFT",
    "Load",
    "Scenario",
    "Scriptable",
    "Target",
    "answer_text",
    "healthy",
    "scenarios",
]

# A healthy deployment: first token after 0.2 s, then one word every 10 ms (60 words: ~0.8 s).
HEALTHY_TTFT = 0.2
HEALTHY_CHUNK_DELAY = 0.01
ANSWER_WORDS = 60

_FILLER = (
    "resilience means the answer arrives whole even when a provider stumbles midway so the caller "
    "never sees a truncated sentence or a spliced paragraph and every retry stays inside its "
    "deadline while the breaker keeps traffic away from a dead route until a probe finds it "
    "healthy again and the primary takes its share back"
).split()


class Scriptable(Protocol):
    """What a scenario scripts on the simulator (a ProviderSimulator or the benchmark's child process)."""

    def set_default(self, deployment: str, behavior: Behavior) -> None: ...
    def script(self, deployment: str, *behaviors: Behavior) -> None: ...
    def outage(self, deployment: str, seconds: float, behavior: Behavior | None = None) -> None: ...
    def token_bucket(
        self, deployment: str, rate: float, burst: int, retry_after: float | None = None
    ) -> None: ...


class Target(Protocol):
    """One cell as a scenario sees it: the simulator deployment standing for a scenario's
    deployment name (``p-a``), and the full answer it gives."""

    def dep(self, name: str) -> str: ...
    def answer(self, name: str, draw: int = 0) -> str: ...


def answer_text(deployment: str, same_model: bool = False, draw: int = 0) -> str:
    """The 60 words ``deployment`` answers, one word per chunk: its name, then filler; with
    ``same_model`` the filler first and its name last, so deployments of one model say the same
    thing word for word until the last word. ``draw`` > 0: another sample of the same model (the
    filler starts ``draw`` words later), as a model sampling at a temperature answers anew."""
    filler = [_FILLER[(i + draw) % len(_FILLER)] for i in range(ANSWER_WORDS - 1)]
    tag = f"[{deployment}]"
    return " ".join([*filler, tag] if same_model else [tag, *filler]) + "."


def healthy(text: str) -> Behavior:
    """A healthy reply: ``text`` at the healthy pace."""
    return Fault.ok(text=text, ttft=HEALTHY_TTFT, chunk_delay=HEALTHY_CHUNK_DELAY)


def _answering(fault: Behavior, text: str, ttft: float = HEALTHY_TTFT) -> Behavior:
    """``fault`` applied to the 60-word answer ``text`` at the healthy pace (the Fault constructors
    leave the text to the simulator's short default reply)."""
    return dataclasses.replace(fault, text=text, ttft=ttft, chunk_delay=HEALTHY_CHUNK_DELAY)


@dataclass(frozen=True)
class Load:
    """How calls arrive in one cell: a closed loop at ``--concurrency`` (``rate`` None), or evenly
    spaced at ``rate`` per second; ``--calls`` x ``scale`` calls, or ``calls``, or as many as
    fill ``duration`` seconds."""

    rate: float | None = None
    duration: float | None = None
    scale: float = 1.0
    calls: int | None = None

    def count(self, base: int) -> int:
        """Calls per cell for a ``--calls`` of ``base``."""
        if self.rate is not None and self.duration is not None:
            return max(1, round(self.rate * self.duration))
        if self.calls is not None:
            return self.calls
        return max(1, round(base * self.scale))


@dataclass(frozen=True)
class Scenario:
    """One failure scenario: deployments, fallbacks, the fault injected when measuring starts."""

    name: str
    description: str
    groups: dict[str, list[str]]
    fallbacks: list[dict[str, list[str]]]
    inject: Callable[[Scriptable, Target], None]
    consumers: tuple[str, ...] = ("completion",)
    """How callers read the answer: ``completion``, ``stream``, ``lc`` (see _chaos_systems)."""
    load: Load = field(default_factory=Load)
    recovers_after: float | None = None
    """Seconds after the start when the primary is healthy again ("time back on primary")."""
    plugin_policy: dict[str, float] = field(default_factory=dict)
    """The plugin's policy here: its defaults, plus what the scenario pins (see ``scenarios``)."""
    same_model: bool = False
    """The deployments serve one model: their answers agree word for word but for the last."""
    prefill: frozenset[str] = frozenset()
    """The deployments that declare assistant-prefill support (``supports_assistant_prefill``)."""
    request: dict[str, float] = field(default_factory=dict)
    """Sampling arguments every caller sends (``temperature``), the same for every system."""
    draws: int = 1
    """How many different samples each deployment gives (one per request, in turn): > 1, the
    model samples anew per request, so a replay does not repeat the words shown."""
    parallel: bool = False
    """Bound by waiting (stalls, holds, timed incidents) and light on CPU: its cells may run side
    by side without contention moving its numbers much; the rest run one cell at a time."""

    @property
    def primary(self) -> str:
        """The group every call asks for."""
        return next(iter(self.groups))

    @property
    def deployments(self) -> list[str]:
        """Every deployment of the scenario (its own names, before a cell's prefix)."""
        return [d for deps in self.groups.values() for d in deps]


ONE_PRIMARY = {"primary": ["p-a"], "fallback": ["f-a"]}
TO_FALLBACK = [{"primary": ["fallback"]}]
TWO_PRIMARIES = {"primary": ["p-a", "p-b"], "backup": ["b-a"]}
TO_BACKUP = [{"primary": ["backup"]}]
# Long waits (stalls, slow first tokens, held connections) are judged against a realistic 30 s
# attempt timeout, pinned so a change of the plugin's defaults does not change the question.
REALISTIC = {"attempt_timeout": 30.0}
# Stream scenarios are read by a plain chunk loop, LangChain astream and LangChain ainvoke.
STREAM_CALLERS = ("stream", "astream", "lc")
# A caller asking for reproducible answers (what makes a verified replay worth trying).
DETERMINISTIC = {"temperature": 0.0}


def _storm(sim: Scriptable, t: Target) -> None:
    sim.token_bucket(t.dep("p-a"), rate=15, burst=5, retry_after=1)
    sim.token_bucket(t.dep("p-b"), rate=15, burst=5, retry_after=1)


def _outage(sim: Scriptable, t: Target) -> None:
    sim.set_default(t.dep("p-a"), Fault.server_error(503))


def _three(sim: Scriptable, t: Target) -> None:
    # Each provider fails 5% of its requests (seeded, the same draws for every system): a script
    # long enough for any cell, then healthy.
    for i, name in enumerate(("x-a", "y-a", "z-a")):
        rng = random.Random(100 + i)
        ok = healthy(t.answer(name))
        sim.script(t.dep(name), *(Fault.server_error(500) if rng.random() < 0.05 else ok for _ in range(400)))


def _primary_fault(make: Callable[[str], Behavior]) -> Callable[[Scriptable, Target], None]:
    """Inject: the primary ``p-a`` answers ``make(its full answer)`` from now on."""

    def inject(sim: Scriptable, t: Target) -> None:
        sim.set_default(t.dep("p-a"), make(t.answer("p-a")))

    return inject


def _sampling(make: Callable[[str], Behavior], draws: int) -> Callable[[Scriptable, Target], None]:
    """Inject: every deployment samples anew per request (``draws`` answers in turn, the fallback's
    healthy, the primary's ``make(answer)``; the fallback's turn runs ahead, so its n-th answer is
    never the primary's n-th), the script long enough for any cell."""

    def inject(sim: Scriptable, t: Target) -> None:
        sim.script(t.dep("p-a"), *(make(t.answer("p-a", i % draws)) for i in range(400)))
        sim.script(t.dep("f-a"), *(healthy(t.answer("f-a", (i + 1 + i % 2) % draws)) for i in range(400)))

    return inject


def _refused(*refusers: str) -> Callable[[Scriptable, Target], None]:
    """Inject: the primary's stream is cut after 40 words; ``refusers`` declare assistant prefill
    but refuse it (a 400, as Anthropic's newer models answer a request ending in an assistant
    message) and answer any other request healthily."""

    def inject(sim: Scriptable, t: Target) -> None:
        sim.set_default(t.dep("p-a"), _answering(Fault.stream_cut(after_chunks=40), t.answer("p-a")))
        for name in refusers:
            sim.set_default(t.dep(name), Fault.refuse_prefill(healthy(t.answer(name))))

    return inject


def _primary_incident(seconds: float, fault: Behavior) -> Callable[[Scriptable, Target], None]:
    """Inject: the primary ``p-a`` answers ``fault`` for ``seconds``, then healthy again."""

    def inject(sim: Scriptable, t: Target) -> None:
        sim.outage(t.dep("p-a"), seconds, fault)

    return inject


def _with_recovery(sc: Scenario) -> list[Scenario]:
    """``sc`` (a break after content where no route takes a prefill and the request samples: a
    chunk consumer can only get the typed error with its replacement), and its two variants
    where one can go on: ``-prefill``, the fallback takes an assistant prefill; ``-same``, the
    fallback serves the same model and every caller asks temperature 0 (a replay reproduces)."""
    return [
        sc,
        dataclasses.replace(
            sc,
            name=f"{sc.name}-prefill",
            description=f"{sc.name}, the fallback takes an assistant prefill (supports_assistant_prefill)",
            prefill=frozenset({"f-a"}),
        ),
        dataclasses.replace(
            sc,
            name=f"{sc.name}-same",
            description=f"{sc.name}, the fallback serving the same model at temperature 0 (its answer "
            "repeats the primary's word for word, up to its name)",
            same_model=True,
            request=DETERMINISTIC,
        ),
    ]


def scenarios(quick: bool = False) -> list[Scenario]:
    """Every scenario; ``quick`` shortens the slow ones (incidents, stalls, holds) for a smoke run."""
    stall = 11.0 if quick else 30.0
    ttft = 11.0 if quick else 20.0
    hold = 5.0 if quick else 15.0
    silent = 4.0 if quick else 10.0
    short_down, short_after = (2.0, 5.0) if quick else (3.0, 15.0)
    long_down, long_after = (6.0, 10.0) if quick else (20.0, 40.0)
    rl_down, rl_after = (3.0, 3.0) if quick else (4.0, 8.0)
    # The storm needs more calls than the buckets hold (2 x 5 burst + 2 x 15/s) to be one.
    storm = Load(calls=30 if quick else 60)
    paced = Load(rate=10.0)
    slow = Load(rate=5.0, scale=0.5)  # fewer, gentler: these run their cells side by side
    return [
        Scenario(
            "storm",
            "429 storm: both primary deployments behind a 15 req/s token bucket (Retry-After: 1)",
            TWO_PRIMARIES,
            TO_BACKUP,
            _storm,
            load=storm,
        ),
        Scenario(
            "outage",
            "hard outage: one of two primary deployments answers 503 throughout",
            TWO_PRIMARIES,
            TO_BACKUP,
            _outage,
        ),
        Scenario(
            "silent",
            f"silent provider: one of two primary deployments sends nothing (drops after {silent:g} s)",
            TWO_PRIMARIES,
            TO_BACKUP,
            _primary_fault(lambda _: Fault.silence(max_hold=silent)),
            plugin_policy=REALISTIC,
            parallel=True,
        ),
        Scenario(
            "three-5pct",
            "three providers, each failing 5% of calls independently (x -> y -> z)",
            {"x": ["x-a"], "y": ["y-a"], "z": ["z-a"]},
            [{"x": ["y", "z"]}],
            _three,
            load=Load(scale=2.0),  # 5% needs calls to show
        ),
        *_with_recovery(
            Scenario(
                "stream-cut",
                "the primary's stream is cut (FIN) after 40 of 60 words",
                ONE_PRIMARY,
                TO_FALLBACK,
                _primary_fault(lambda text: _answering(Fault.stream_cut(after_chunks=40), text)),
                consumers=STREAM_CALLERS,
                load=paced,
            )
        ),
        Scenario(
            "stream-cut-prefill-refused",
            "stream-cut-same, but the fallback declares assistant prefill and refuses it (400: the "
            "conversation must end with a user message)",
            ONE_PRIMARY,
            TO_FALLBACK,
            _refused("f-a"),
            consumers=STREAM_CALLERS,
            load=paced,
            prefill=frozenset({"f-a"}),
            same_model=True,
            request=DETERMINISTIC,
        ),
        Scenario(
            "stream-cut-prefill-refused-next",
            "stream-cut, the first fallback declares assistant prefill and refuses it, the second "
            "takes it (sampling: no replay)",
            {"primary": ["p-a"], "fallback": ["f-a"], "last": ["l-a"]},
            [{"primary": ["fallback", "last"]}],
            _refused("f-a"),
            consumers=STREAM_CALLERS,
            load=paced,
            prefill=frozenset({"f-a", "l-a"}),
        ),
        Scenario(
            "stream-cut-diverge",
            "stream-cut-same, but the model samples anew per request: a replay does not repeat "
            "the words shown (no route takes a prefill)",
            ONE_PRIMARY,
            TO_FALLBACK,
            _sampling(lambda text: _answering(Fault.stream_cut(after_chunks=40), text), draws=7),
            consumers=STREAM_CALLERS,
            load=paced,
            same_model=True,
            request=DETERMINISTIC,
            draws=7,
        ),
        Scenario(
            "malformed",
            "one invalid-JSON SSE event showing no text (a cut role chunk)"
            " after 30 of the primary's 60 words",
            ONE_PRIMARY,
            TO_FALLBACK,
            _primary_fault(
                lambda text: _answering(Fault.malformed_chunk(after_chunks=30, content=False), text)
            ),
            consumers=STREAM_CALLERS,
            load=paced,
        ),
        *_with_recovery(
            Scenario(
                "malformed-text",
                "one invalid-JSON SSE event that shows text after 30 of the primary's 60 words",
                ONE_PRIMARY,
                TO_FALLBACK,
                _primary_fault(lambda text: _answering(Fault.malformed_chunk(after_chunks=30), text)),
                consumers=STREAM_CALLERS,
                load=paced,
            )
        ),
        *_with_recovery(
            Scenario(
                "stall",
                f"the primary's stream stalls after 30 of 60 words for {stall:g} s (then RST)",
                ONE_PRIMARY,
                TO_FALLBACK,
                _primary_fault(
                    lambda text: _answering(Fault.stream_stall(after_chunks=30, seconds=stall), text)
                ),
                consumers=STREAM_CALLERS,
                load=slow,
                plugin_policy=REALISTIC,
                parallel=True,
            )
        ),
        Scenario(
            "slow-ttft",
            f"the primary's first token (whole answer, non-stream) comes after {ttft:g} s",
            ONE_PRIMARY,
            TO_FALLBACK,
            _primary_fault(lambda text: _answering(Fault.slow_first_token(ttft), text, ttft=ttft)),
            consumers=("completion", "stream", "lc"),
            load=slow,
            plugin_policy=REALISTIC,
            parallel=True,
        ),
        Scenario(
            "retry-after",
            f"the primary answers 429 with Retry-After: 2 for {rl_down:g} s, then healthy",
            ONE_PRIMARY,
            TO_FALLBACK,
            _primary_incident(rl_down, Fault.rate_limit(retry_after=2)),
            load=Load(rate=5.0, duration=rl_down + rl_after),
            recovers_after=rl_down,
            parallel=True,
        ),
        Scenario(
            "flap-short",
            f"the primary is down (503) for {short_down:g} s, then healthy",
            ONE_PRIMARY,
            TO_FALLBACK,
            _primary_incident(short_down, Fault.server_error(503)),
            load=Load(rate=4.0, duration=short_down + short_after),
            recovers_after=short_down,
            parallel=True,
        ),
        Scenario(
            "flap-long",
            f"the primary is down (503) for {long_down:g} s, then healthy",
            ONE_PRIMARY,
            TO_FALLBACK,
            _primary_incident(long_down, Fault.server_error(503)),
            load=Load(rate=2.0, duration=long_down + long_after),
            recovers_after=long_down,
            parallel=True,
        ),
        Scenario(
            "hold-drop",
            f"the primary holds the connection {hold:g} s without a byte, then drops it (RST)",
            ONE_PRIMARY,
            TO_FALLBACK,
            _primary_fault(lambda _: Fault.silence(max_hold=hold)),
            consumers=("completion", "stream"),
            load=slow,
            plugin_policy=REALISTIC,
            parallel=True,
        ),
    ]
