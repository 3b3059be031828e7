"""``resilient(runnable)``: the router's error taxonomy, tenacity retries, a circuit breaker and
a deadline around any LangChain Runnable (a retriever, a tool, another provider's chat model).

Unlike ``with_retry``/``with_fallbacks``:

* only retryable failures are retried (``classify``: rate limits, 5xx, timeouts, connection
  errors); anything else (an ``unknown`` class) fails at once unless ``retry_on=`` names it;
* ``on_retry`` fires on the wrapper's run before every backoff sleep, and ``llm_resilience.*``
  custom events report every attempt, retry and breaker transition;
* streams are retried before their first chunk only; a failure after it raises
  :class:`StreamInterruptedError` (nothing is spliced);
* every attempt is a child run of the wrapper's run (``parent_run_id`` kept), gets its own copy
  of the input (the caller's dict is never mutated), and ``batch(..., return_exceptions=True)``
  keeps outputs aligned with inputs;
* when everything fails, a non-retryable error is raised as itself; otherwise one
  :class:`AllRoutesFailedError` (or :class:`DeadlineExceededError`, :class:`CircuitOpenError`)
  lists every attempt and is chained to the first root cause. ``get_report(err)`` returns the
  call report either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import functools
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from langchain_core.callbacks import (
    AsyncCallbackManagerForChainRun,
    CallbackManagerForChainRun,
)
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import ensure_config
from langchain_core.utils.pydantic import TypeBaseModel

from llm_resilience_plugin._engine import attempts
from llm_resilience_plugin._engine.attempt import AttemptContext
from llm_resilience_plugin._engine.breakers import DeploymentBreaker
from llm_resilience_plugin._engine.clock import Clock, Deadline, call_budget
from llm_resilience_plugin._engine.core import CallOptions, CallState, DeadlineSkip
from llm_resilience_plugin._engine.drivers import walk_routes, walk_routes_sync
from llm_resilience_plugin._engine.engine import Engine
from llm_resilience_plugin._engine.retry import RetryBudget
from llm_resilience_plugin.errors import ErrorClass, Failure, StreamInterruptedError
from llm_resilience_plugin.events import CallReport, DeploymentInfo, Listener
from llm_resilience_plugin.langchain._bridge import EventSink, config_deadline, forward_breaker
from llm_resilience_plugin.policy import EffectivePolicy, ResiliencePolicy, build_policy

Input = TypeVar("Input")
Output = TypeVar("Output")

RetryOn = (
    type[BaseException]
    | tuple[type[BaseException], ...]
    | list[type[BaseException]]
    | Callable[[BaseException], bool]
)

_DEFAULT_EXTRA_RETRIES = 2


def _predicate(retry_on: RetryOn | None) -> Callable[[BaseException], bool] | None:
    if retry_on is None:
        return None
    if isinstance(retry_on, type) and issubclass(retry_on, BaseException):
        cls = retry_on
        return lambda e: isinstance(e, cls)
    if isinstance(retry_on, tuple | list):
        types = tuple(retry_on)
        if not all(isinstance(t, type) and issubclass(t, BaseException) for t in types):
            raise TypeError("retry_on: expected exception classes or a predicate")
        return lambda e: isinstance(e, types)
    if callable(retry_on):
        return cast(Callable[[BaseException], bool], retry_on)
    raise TypeError("retry_on: expected exception classes or a predicate")


def _fresh_input(value: Any) -> Any:
    """A private copy of a dict/list input for one attempt (deep if possible, else shallow)."""
    if isinstance(value, dict | list):
        try:
            return copy.deepcopy(value)
        except Exception:
            return copy.copy(value)
    return value


# What a chunk fetch (``next``/``anext`` with a default) returns when the stream has ended.
_END: Any = object()


def _close(it: Any) -> None:
    """Close a sync stream nobody will finish (quietly: it may be broken already)."""
    if it is not None:
        with contextlib.suppress(Exception):
            it.close()


async def _aclose(it: Any) -> None:
    """The async twin of :func:`_close` (an iterator without ``aclose`` is left alone)."""
    if it is not None and hasattr(it, "aclose"):
        with contextlib.suppress(Exception):
            await it.aclose()


@dataclass(slots=True)
class _Run:
    """What one call of the wrapper hands its dispatcher: the input and the LangChain run."""

    input: Any
    config: RunnableConfig
    kwargs: dict[str, Any]
    sink: EventSink
    target: Runnable[Any, Any]  # the wrapped Runnable (a bound copy of a chat model, say)

    def args(self) -> tuple[Any, RunnableConfig]:
        """One attempt's positional arguments: its own copy of the input, and the config."""
        return _fresh_input(self.input), self.config


@dataclass(slots=True)
class _Open:
    """A stream attempt that produced its first chunk (or ended empty)."""

    first: list[Any]
    rest: Any  # the iterator, or None when the stream ended

    @classmethod
    def of(cls, first: Any, it: Any) -> _Open:
        """The attempt's first chunk (``_END``: it ended empty) and the iterator it came from."""
        return cls([], None) if first is _END else cls([first], it)


@dataclass(slots=True)
class _Relay:
    """A stream answered by the engine, relayed to the caller: the bookkeeping both
    ``_transform`` twins share (each wait's bound, the text so far, the attempt's end)."""

    owner: ResilientRunnable[Any, Any]
    attempt: AttemptContext
    level: int
    opened: _Open
    started_wall: float
    t0: float
    wait_before: float
    sink: EventSink
    parts: list[str] = field(default_factory=list)
    ttft: float = 0.0

    def start(self) -> _Relay:
        """The caller starts reading: the time to its first chunk is now."""
        self.ttft = self.owner.engine.clock.monotonic() - self.t0
        return self

    def bound(self) -> float:
        """Seconds the next chunk may take: the attempt timeout, within the call's deadline."""
        return max(0.001, min(self.owner.attempt_timeout, self.attempt.call.deadline.remaining()))

    def took(self, chunk: Any) -> Any:
        """Keep the chunk's text (an interruption reports the partial text) and pass it on."""
        text = chunk if isinstance(chunk, str) else getattr(chunk, "content", None)
        self.parts.append(text if isinstance(text, str) else "")
        return chunk

    def cancelled(self) -> None:
        """The caller stopped reading (or was cancelled): the attempt counts nothing."""
        attempts.cancelled(
            self.owner.engine, self.attempt, self.level, self.t0, self.started_wall, self.wait_before
        )

    def finished(self) -> None:
        """The stream ended: the attempt succeeded."""
        self.attempt.call.report.served_group = self.owner.step
        with self.sink.scope():
            self._ended(None, self.ttft)

    def failed(self, exc: Exception) -> StreamInterruptedError:
        """The stream failed after its first chunk: account for it; the error to raise."""
        with self.sink.scope():
            failure = self._ended(exc, None)
        partial = "".join(self.parts)
        message = failure.message if failure is not None else str(exc)
        text = f"{self.owner.step}: stream failed after its first chunk ({len(partial)} chars): {message}"
        return StreamInterruptedError(text, partial, exc, self.attempt.call.report)

    def _ended(self, exc: BaseException | None, ttft: float | None) -> Failure | None:
        return attempts.stream_ended(
            self.owner.engine, self.attempt, self.level, self.t0, self.started_wall, self.wait_before,
            exc, ttft=ttft,
        )  # fmt: skip


class _RunnableDispatcher:
    """The engine's dispatcher for a wrapped Runnable: one ``invoke``/``stream`` per attempt,
    admitted by the step's own breaker, bounded by the attempt's timeout."""

    def __init__(self, owner: ResilientRunnable[Any, Any]) -> None:
        self.owner = owner

    def _admit(self, attempt: AttemptContext) -> _Run:
        """The step is the group's one deployment: the engine's deployment filter admits it (a
        closed breaker, a half-open probe) or raises :class:`CircuitOpenError`."""
        run: _Run = attempt.call.context
        with run.sink.scope():
            attempt.select([{"model_info": {"id": self.owner.step}}])
        attempt.sent = True
        return run

    async def send(
        self,
        attempt: AttemptContext,
        messages: Any,
        kwargs: dict[str, Any],
        *,
        timeout_s: float,
        bound: float,
    ) -> Any:
        run, it = self._admit(attempt), None
        try:
            with run.sink.scope():
                async with asyncio.timeout(min(timeout_s, bound)):
                    if not attempt.call.stream:
                        return await run.target.ainvoke(*run.args(), **run.kwargs)
                    it = aiter(run.target.astream(*run.args(), **run.kwargs))
                    return _Open.of(await anext(it, _END), it)
        except Exception:
            await _aclose(it)
            raise

    def send_sync(
        self,
        attempt: AttemptContext,
        messages: Any,
        kwargs: dict[str, Any],
        *,
        timeout_s: float,
        bound: float,
    ) -> Any:
        run, it, owner, limit = self._admit(attempt), None, self.owner, min(timeout_s, bound)
        try:
            with run.sink.scope():
                if not attempt.call.stream:
                    return owner.run_sync_attempt(lambda: run.target.invoke(*run.args(), **run.kwargs), limit)
                it = iter(run.target.stream(*run.args(), **run.kwargs))
                return _Open.of(owner.run_sync_attempt(functools.partial(next, it, _END), limit), it)
        except Exception:
            _close(it)
            raise

    def wrap_stream(
        self,
        attempt: AttemptContext,
        level: int,
        prefetched: Any,
        started_wall: float,
        latency: float,
        wait_before: float,
        messages: Any,
        kwargs: dict[str, Any],
    ) -> _Relay:
        t0 = self.owner.engine.clock.monotonic() - latency
        sink = cast(_Run, attempt.call.context).sink
        return _Relay(self.owner, attempt, level, prefetched, started_wall, t0, wait_before, sink)

    def static_stream(self, response: Any, attempt_call: Any) -> Any:  # pragma: no cover - degrades=False
        raise AssertionError("a wrapped Runnable has no static answers")

    def annotate(self, report: CallReport, result: Any, usage: dict[str, int] | None) -> None:
        """A Runnable's output is the caller's own object: nothing is attached to it."""

    async def discard(self, result: Any) -> None:
        if isinstance(result, _Relay):
            await _aclose(result.opened.rest)


class ResilientRunnable(Runnable[Input, Output]):
    """A Runnable wrapped with retries, a circuit breaker and a deadline; see :func:`resilient`.

    It runs on the same engine as the router: the wrapped Runnable is the engine's one
    "deployment" (its breaker is the step's), sent through a Runnable dispatcher.
    """

    def __init__(
        self,
        bound: Runnable[Input, Output],
        *,
        policy: ResiliencePolicy | Mapping[str, Any] | None = None,
        retry_on: RetryOn | None = None,
        max_retries: int | None = None,
        deadline: float | None = None,
        attempt_timeout: float | None = None,
        first_chunk_timeout: float | None = None,
        name: str | None = None,
        clock: Clock | None = None,
        seed: int | None = None,
        listener: Listener | None = None,
        emit_events: bool = True,
        enforce_sync_timeout: bool = False,
    ) -> None:
        if not isinstance(bound, Runnable):
            raise TypeError(f"resilient() wraps a Runnable, got {type(bound).__name__}")
        if max_retries is not None and not (0 <= max_retries <= 20):
            raise ValueError("max_retries must be between 0 and 20")
        for label, value in (
            ("deadline", deadline),
            ("attempt_timeout", attempt_timeout),
            ("first_chunk_timeout", first_chunk_timeout),
        ):
            if value is not None and not value > 0:
                raise ValueError(f"{label} must be a positive number of seconds")
        self.bound = bound
        self.step = name or bound.get_name()
        self.name = f"Resilient[{self.step}]"
        resilience = build_policy(policy)
        eff: EffectivePolicy = resilience.for_group(self.step)
        if max_retries is not None:
            eff = eff.model_copy(
                update={
                    "classes": {
                        k: (
                            cp.model_copy(update={"max_retries": max_retries}) if cp.action == "retry" else cp
                        )
                        for k, cp in eff.classes.items()
                    }
                }
            )
        self.policy = eff
        self.deadline = call_budget(deadline, eff.deadline)
        self.attempt_timeout = attempt_timeout or eff.attempt_timeout
        self.first_chunk_timeout = first_chunk_timeout or attempt_timeout or eff.first_chunk_timeout
        self.retry_on = _predicate(retry_on)
        self.emit_events = emit_events
        self.enforce_sync_timeout = enforce_sync_timeout
        self.engine = Engine(
            None,
            {self.step: DeploymentInfo(self.step, self.step, self.step, None)},
            clock=clock or Clock(),
            seed=seed,
            guards=[],
            policy=resilience,
            policies={self.step: eff},
            retry_on=self.retry_on,
            retry_on_max=max_retries if max_retries is not None else _DEFAULT_EXTRA_RETRIES,
            degrades=False,
            as_itself=self._as_itself,
            avoid_failed=False,
        )
        self.engine.dispatcher = _RunnableDispatcher(self)
        self.events = self.engine.events
        self.events.subscribe(forward_breaker)  # transitions reach the LangChain run that caused them
        if listener is not None:
            self.events.subscribe(listener)
        self._options = CallOptions(
            attempt_timeout=self.attempt_timeout, first_chunk_timeout=self.first_chunk_timeout
        )

    @property
    def breaker(self) -> DeploymentBreaker:
        """The step's circuit breaker."""
        return self.engine.breakers[self.step]

    @property
    def budget(self) -> RetryBudget:
        """The step's retry budget."""
        return self.engine.budgets[self.step]

    # -- Runnable plumbing -------------------------------------------------------------------------

    @property
    def InputType(self) -> Any:
        return self.bound.InputType

    @property
    def OutputType(self) -> Any:
        return self.bound.OutputType

    def get_input_schema(self, config: RunnableConfig | None = None) -> TypeBaseModel:
        return self.bound.get_input_schema(config)

    def get_output_schema(self, config: RunnableConfig | None = None) -> TypeBaseModel:
        return self.bound.get_output_schema(config)

    @property
    def config_specs(self) -> Any:
        return self.bound.config_specs

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Receive every event of every call (attempts, retries, breaker transitions, reports)."""
        return self.events.subscribe(listener)

    def __repr__(self) -> str:
        return f"ResilientRunnable(bound={self.bound!r}, step={self.step!r})"

    # -- one call ----------------------------------------------------------------------------------

    def _retryable(self, failure: Failure) -> bool:
        if failure.error_class is ErrorClass.CIRCUIT_OPEN:
            return False
        if self.policy.classes[failure.error_class].action == "retry":
            return True
        return self.retry_on is not None and bool(self.retry_on(failure.exception))

    def _as_itself(self, call: CallState, failure: Failure) -> bool:
        """The step's rule for the final error: the failure that ended the call is raised as
        itself when it was not worth retrying (a caller's error), or when the breaker refused
        every attempt before any was made; otherwise one error lists every attempt."""
        if isinstance(failure.exception, DeadlineSkip) or failure is not call.failures[-1]:
            return False
        if failure.error_class is ErrorClass.CIRCUIT_OPEN:
            return call.report.upstream_requests == 0
        return not self._retryable(failure)

    def _new_call(
        self, input: Any, run_manager: Any, stream: bool, config: RunnableConfig, kwargs: dict[str, Any]
    ) -> CallState:
        clock = self.engine.clock
        sink = EventSink(run_manager, enabled=self.emit_events)
        report = CallReport(
            call_id=uuid.uuid4().hex[:16], requested_group=self.step, stream=stream, started_at=clock.wall()
        )
        return CallState(
            call_id=report.call_id,
            report=report,
            deadline=Deadline.after(clock, call_budget(self.deadline, cap=config_deadline(config))),
            stream=stream,
            listener=sink.on_event,
            before_retry=sink.before_retry_async,
            opts=self._options,
            context=_Run(input, config, kwargs, sink, self.bound),
        )

    def run_sync_attempt(self, fn: Callable[[], Any], timeout: float) -> Any:
        """Run one sync attempt inline, or on a helper thread abandoned past ``timeout`` when
        ``enforce_sync_timeout`` is set."""
        if not self.enforce_sync_timeout:
            return fn()
        ctx = contextvars.copy_context()
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = ctx.run(fn)
            except BaseException as e:
                box["error"] = e

        t = threading.Thread(target=target, name=f"resilient-{self.step}", daemon=True)
        t.start()
        t.join(timeout)
        if t.is_alive():
            raise TimeoutError(f"{self.step}: attempt exceeded {timeout:.3g}s (left running)")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def _walk_sync(self, call: CallState) -> Any:
        run: _Run = call.context
        with run.sink.scope():
            return walk_routes_sync(self.engine, call, self.step, None, {}, run.sink.before_retry_sync)

    async def _walk(self, call: CallState) -> Any:
        run: _Run = call.context
        try:
            with run.sink.scope():
                return await walk_routes(self.engine, call, self.step, None, {})
        finally:
            await run.sink.aflush()

    # -- invoke ----------------------------------------------------------------------------------

    def _invoke(
        self, input: Input, run_manager: CallbackManagerForChainRun, config: RunnableConfig, **kwargs: Any
    ) -> Output:
        return cast(Output, self._walk_sync(self._new_call(input, run_manager, False, config, kwargs)))

    async def _ainvoke(
        self,
        input: Input,
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
        **kwargs: Any,
    ) -> Output:
        return cast(Output, await self._walk(self._new_call(input, run_manager, False, config, kwargs)))

    def invoke(self, input: Input, config: RunnableConfig | None = None, **kwargs: Any) -> Output:
        return self._call_with_config(self._invoke, input, ensure_config(config), **kwargs)

    async def ainvoke(self, input: Input, config: RunnableConfig | None = None, **kwargs: Any) -> Output:
        return await self._acall_with_config(self._ainvoke, input, ensure_config(config), **kwargs)

    # -- stream ----------------------------------------------------------------------------------

    def _transform(
        self,
        inputs: Iterator[Input],
        run_manager: CallbackManagerForChainRun,
        config: RunnableConfig,
        **kwargs: Any,
    ) -> Iterator[Output]:
        call = self._new_call(self._single(list(inputs)), run_manager, True, config, kwargs)
        relay: _Relay = self._walk_sync(call).start()
        rest, done = relay.opened.rest, False
        try:
            for chunk in relay.opened.first:
                yield relay.took(chunk)
            while rest is not None:  # each wait bounded as in _atransform, where a helper thread can bound it
                with relay.sink.scope():
                    chunk = self.run_sync_attempt(functools.partial(next, rest, _END), relay.bound())
                if chunk is _END:
                    break
                yield relay.took(chunk)
            done = True
        except GeneratorExit:
            relay.cancelled()
            raise
        except Exception as exc:
            raise relay.failed(exc) from exc
        finally:
            if not done:
                _close(rest)
        relay.finished()

    async def _atransform(
        self,
        inputs: AsyncIterator[Input],
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
        **kwargs: Any,
    ) -> AsyncIterator[Output]:
        call = self._new_call(self._single([x async for x in inputs]), run_manager, True, config, kwargs)
        relay: _Relay = (await self._walk(call)).start()
        rest, done = relay.opened.rest, False
        try:
            for chunk in relay.opened.first:
                yield relay.took(chunk)
            while rest is not None:
                with relay.sink.scope():
                    async with asyncio.timeout(relay.bound()):
                        chunk = await anext(rest, _END)
                if chunk is _END:
                    break
                yield relay.took(chunk)
            done = True
        except (GeneratorExit, asyncio.CancelledError):
            relay.cancelled()
            raise
        except Exception as exc:
            error = relay.failed(exc)
            await relay.sink.aflush()
            raise error from exc
        finally:
            if not done:
                await _aclose(rest)
        relay.finished()
        await relay.sink.aflush()

    @staticmethod
    def _single(items: list[Any]) -> Any:
        if not items:
            raise ValueError("resilient(): the stream received no input")
        if len(items) == 1:
            return items[0]
        acc = items[0]
        for x in items[1:]:
            acc = acc + x  # input chunks add up, as in Runnable.transform
        return acc

    def stream(self, input: Input, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[Output]:
        yield from self.transform(iter([input]), config, **kwargs)  # a stream is a one-input transform

    def transform(
        self, input: Iterator[Input], config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Output]:
        yield from self._transform_stream_with_config(input, self._transform, ensure_config(config), **kwargs)

    async def astream(
        self, input: Input, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Output]:
        async def one() -> AsyncIterator[Input]:
            yield input

        async for chunk in self._atransform_stream_with_config(
            one(), self._atransform, ensure_config(config), **kwargs
        ):
            yield chunk

    async def atransform(
        self, input: AsyncIterator[Input], config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Output]:
        async for chunk in self._atransform_stream_with_config(
            input, self._atransform, ensure_config(config), **kwargs
        ):
            yield chunk


__all__ = ["ResilientRunnable"]
