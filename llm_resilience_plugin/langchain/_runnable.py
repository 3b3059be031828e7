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
import copy
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import tenacity
from langchain_core.callbacks import (
    AsyncCallbackManagerForChainRun,
    CallbackManagerForChainRun,
)
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import ensure_config
from langchain_core.utils.pydantic import TypeBaseModel

from llm_resilience_plugin._engine.breakers import Admission, DeploymentBreaker
from llm_resilience_plugin._engine.clock import Clock, Deadline
from llm_resilience_plugin._engine.retry import AttemptFailed, GroupRetryState, RetryBudget, build_retrying
from llm_resilience_plugin._engine.taxonomy import classify
from llm_resilience_plugin.errors import (
    AllRoutesFailedError,
    CircuitOpenError,
    DeadlineExceededError,
    ErrorClass,
    Failure,
    StreamInterruptedError,
)
from llm_resilience_plugin.events import (
    AttemptRecord,
    BreakerTransition,
    CallReport,
    Event,
    EventBus,
    Listener,
    RetryScheduled,
)
from llm_resilience_plugin.langchain._bridge import _SINK, EventSink, config_deadline
from llm_resilience_plugin.policy import EffectivePolicy, ResiliencePolicy, build_policy
from llm_resilience_plugin.events import REPORT_KEY

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


class _DeadlineSkip(TimeoutError):
    """No time was left for another attempt (nothing was sent)."""


def _text_of(chunk: Any) -> str:
    if isinstance(chunk, str):
        return chunk
    content = getattr(chunk, "content", None)
    return content if isinstance(content, str) else ""


@dataclass(slots=True)
class _StepRetryState(GroupRetryState):
    """The router's retry predicates, plus user-declared retryable exceptions."""

    retry_on: Callable[[BaseException], bool] | None = None
    retry_on_max: int = _DEFAULT_EXTRA_RETRIES

    def should_retry(self, exc: BaseException) -> bool:
        if (
            isinstance(exc, AttemptFailed)
            and self.retry_on is not None
            and exc.failure.error_class is not ErrorClass.CIRCUIT_OPEN
            and self.retry_on(exc.failure.exception)
        ):
            f = exc.failure
            cp = self.policy.classes[f.error_class]
            limit = cp.max_retries if cp.action == "retry" else self.retry_on_max
            used = self.retries_by_class.get(f.error_class, 0)
            if used >= limit:
                self.gave_up_reason = f"{f.error_class}: {limit} retries used"
                return False
            if not self.budget.allows_retry():
                self.gave_up_reason = "retry budget exhausted"
                return False
            self.retries_by_class[f.error_class] = used + 1
            return True
        return GroupRetryState.should_retry(self, exc)


@dataclass(slots=True)
class _Call:
    report: CallReport
    deadline: Deadline
    sink: EventSink
    attempt_no: int = 0
    next_wait: float = 0.0
    failures: list[Failure] = field(default_factory=list)
    retry_state: GroupRetryState | None = None


@dataclass(slots=True)
class _Open:
    """One stream attempt that produced its first chunk (or ended empty)."""

    admission: Admission
    first: list[Any]
    rest: Any  # the iterator, or None when the stream ended
    t0: float
    started_wall: float
    wait_before: float


def _sleep_blocking(clock: Clock, seconds: float) -> None:
    """Sleep ``seconds`` on ``clock`` from sync code (a fake clock advances instantly)."""
    if type(clock).sleep is Clock.sleep:
        if seconds > 0:
            time.sleep(seconds)
        return
    coro = clock.sleep(seconds)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(coro)
        return
    # Called from sync code inside a running loop: sleep on a helper thread's loop.
    t = threading.Thread(target=asyncio.run, args=(coro,), daemon=True)
    t.start()
    t.join()


class ResilientRunnable(Runnable[Input, Output]):
    """A Runnable wrapped with retries, a circuit breaker and a deadline; see :func:`resilient`."""

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
        eff: EffectivePolicy = build_policy(policy).for_group(self.step)
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
        self.deadline = deadline or eff.deadline
        self.attempt_timeout = attempt_timeout or eff.attempt_timeout
        self.first_chunk_timeout = first_chunk_timeout or attempt_timeout or eff.first_chunk_timeout
        self.retry_on = _predicate(retry_on)
        self.retry_on_max = max_retries if max_retries is not None else _DEFAULT_EXTRA_RETRIES
        self.emit_events = emit_events
        self.enforce_sync_timeout = enforce_sync_timeout
        self._clock = clock or Clock()
        self._rng = random.Random(seed)
        self.events = EventBus()
        if listener is not None:
            self.events.subscribe(listener)
        self.breaker = DeploymentBreaker(
            self.step, self.step, eff.breaker, clock=self._clock.wall, on_transition=self._on_transition
        )
        self.budget = RetryBudget(eff.retry_budget)

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

    # -- events ----------------------------------------------------------------------------------

    def _on_transition(self, t: BreakerTransition) -> None:
        self.events.emit(t)
        sink = _SINK.get()
        if sink is not None:
            sink.on_event(t)

    def _emit(self, call: _Call, event: Event) -> None:
        self.events.emit(event)
        call.sink.on_event(event)

    def _new_call(self, run_manager: Any, stream: bool, config: RunnableConfig | None = None) -> _Call:
        report = CallReport(
            call_id=uuid.uuid4().hex[:16],
            requested_group=self.step,
            stream=stream,
            started_at=self._clock.wall(),
        )
        return _Call(
            report=report,
            deadline=Deadline.after(
                self._clock, min(self.deadline, config_deadline(config) or self.deadline)
            ),
            sink=EventSink(run_manager, enabled=self.emit_events),
        )

    def _record(
        self,
        call: _Call,
        failure: Failure | None,
        outcome: Any,
        started_wall: float,
        latency: float,
        wait_before: float,
        probe: bool = False,
        ttft: float | None = None,
    ) -> None:
        rec = AttemptRecord(
            call_id=call.report.call_id,
            attempt=call.attempt_no,
            model_group=self.step,
            deployment_id=self.step,
            fallback_level=0,
            outcome=outcome,
            error_class=failure.error_class if failure else None,
            status=failure.status if failure else None,
            error_message=failure.message if failure else None,
            started_at=started_wall,
            latency_s=latency,
            wait_before_s=wait_before,
            breaker_state=self.breaker.state,
            ttft_s=ttft,
            probe=probe,
        )
        call.report.attempts.append(rec)
        self._emit(call, rec)

    # -- one attempt's bookkeeping -----------------------------------------------------------------

    def _retryable(self, failure: Failure) -> bool:
        if failure.error_class is ErrorClass.CIRCUIT_OPEN:
            return False
        if self.policy.classes[failure.error_class].action == "retry":
            return True
        return self.retry_on is not None and bool(self.retry_on(failure.exception))

    def _begin(self, call: _Call, stream: bool) -> tuple[Admission, float, float, float]:
        """Admit an attempt: (admission, timeout, started_wall, wait_before) or AttemptFailed."""
        call.attempt_no += 1
        wait_before, call.next_wait = call.next_wait, 0.0
        remaining = call.deadline.remaining()
        started_wall = self._clock.wall()
        if remaining <= self.policy.min_attempt_time:
            failure = Failure(
                ErrorClass.TIMEOUT, None, "call deadline exhausted before the attempt", None,
                _DeadlineSkip("call deadline exhausted"),
            )  # fmt: skip
            call.failures.append(failure)
            self._record(call, failure, "skipped", started_wall, 0.0, wait_before)
            raise AttemptFailed(failure, None)
        with call.sink.scope():
            adm = self.breaker.admit()
        if adm is None:
            exc = CircuitOpenError(self.step, [self.step])
            failure = Failure(ErrorClass.CIRCUIT_OPEN, None, str(exc), None, exc)
            call.failures.append(failure)
            self._record(call, failure, "skipped", started_wall, 0.0, wait_before)
            raise AttemptFailed(failure, None)
        limit = self.first_chunk_timeout if stream else self.attempt_timeout
        return adm, min(limit, remaining), started_wall, wait_before

    def _fail(
        self,
        call: _Call,
        adm: Admission,
        exc: BaseException,
        started_wall: float,
        latency: float,
        wait_before: float,
    ) -> AttemptFailed:
        failure = classify(exc)
        call.failures.append(failure)
        counts = failure.counts_against_deployment or self._retryable(failure)
        with call.sink.scope():
            if counts:
                self.breaker.record_failure(adm)
            else:
                self.breaker.release(adm)
        if counts:
            self.budget.on_failure()
        if failure.retry_after:
            self.breaker.hold(failure.retry_after)
        self._record(call, failure, "failure", started_wall, latency, wait_before, adm.probe)
        return AttemptFailed(failure, self.step)

    def _succeed(
        self,
        call: _Call,
        adm: Admission,
        started_wall: float,
        latency: float,
        wait_before: float,
        ttft: float | None = None,
    ) -> None:
        with call.sink.scope():
            self.breaker.record_success(adm)
        self.budget.on_success()
        self._record(call, None, "success", started_wall, latency, wait_before, adm.probe, ttft)

    def _cancelled(
        self, call: _Call, adm: Admission, started_wall: float, latency: float, wait_before: float
    ) -> None:
        self.breaker.release(adm)
        cancelled = Failure(ErrorClass.UNKNOWN, None, "cancelled", None, asyncio.CancelledError())
        self._record(call, cancelled, "cancelled", started_wall, latency, wait_before, adm.probe)

    def _finish(self, call: _Call, ok: bool) -> None:
        r = call.report
        r.total_latency_s = self._clock.wall() - r.started_at
        if ok:
            r.outcome = "success"
            r.served_group = self.step
            r.deployment_id = self.step
        else:
            last = call.failures[-1] if call.failures else None
            r.outcome = "failure"
            r.error_class = last.error_class if last else None
        self._emit(call, r)

    def _final_error(self, call: _Call) -> BaseException:
        report = call.report
        last = call.failures[-1] if call.failures else None
        if (
            last is not None
            and last.error_class is not ErrorClass.CIRCUIT_OPEN
            and not isinstance(last.exception, _DeadlineSkip)
            and not self._retryable(last)
        ):
            err: BaseException = last.exception  # the caller's error, as itself
            with contextlib.suppress(AttributeError, TypeError):
                setattr(err, REPORT_KEY, report)
            return err
        sent = report.upstream_requests
        if sent == 0 and last is not None and last.error_class is ErrorClass.CIRCUIT_OPEN:
            err = last.exception
            with contextlib.suppress(AttributeError, TypeError):
                setattr(err, REPORT_KEY, report)
            return err
        root = next(
            (
                f
                for f in call.failures
                if f.error_class is not ErrorClass.CIRCUIT_OPEN and not isinstance(f.exception, _DeadlineSkip)
            ),
            None,
        )
        out: AllRoutesFailedError
        reason = (call.retry_state.gave_up_reason if call.retry_state else None) or ""
        out_of_time = call.deadline.remaining() <= self.policy.min_attempt_time or reason.startswith(
            "no time left"
        )
        if out_of_time and call.failures:
            out = DeadlineExceededError(
                f"deadline exceeded after {sent} attempt(s) of {self.step!r}", report.attempts, report
            )
        else:
            out = AllRoutesFailedError(
                f"{self.step!r} failed after {sent} attempt(s)", report.attempts, report
            )
        if root is not None:
            out.__cause__ = root.exception
        return out

    def _state(self, call: _Call) -> _StepRetryState:
        call.retry_state = _StepRetryState(
            policy=self.policy,
            budget=self.budget,
            deadline=call.deadline,
            rng=self._rng,
            earliest_free=self.breaker.held_for,
            retry_on=self.retry_on,
            retry_on_max=self.retry_on_max,
        )
        return call.retry_state

    def _retry_event(self, call: _Call, rs: tenacity.RetryCallState) -> None:
        exc = rs.outcome.exception() if rs.outcome else None
        sleep_s = rs.upcoming_sleep or 0.0
        call.next_wait = sleep_s
        if isinstance(exc, AttemptFailed):
            self._emit(
                call,
                RetryScheduled(
                    call.report.call_id, self.step, rs.attempt_number, sleep_s,
                    exc.failure.error_class, self.step,
                ),
            )  # fmt: skip

    def _sync_retrying(self, call: _Call) -> tenacity.Retrying:
        state = self._state(call)

        def before_sleep(rs: tenacity.RetryCallState) -> None:
            self._retry_event(call, rs)
            call.sink.before_retry_sync(rs)

        return tenacity.Retrying(
            retry=tenacity.retry_if_exception(state.should_retry),
            wait=state.wait,
            stop=state.stop,
            sleep=lambda s: _sleep_blocking(self._clock, s),
            before_sleep=before_sleep,
            reraise=True,
        )

    def _async_retrying(self, call: _Call) -> tenacity.AsyncRetrying:
        async def before_sleep(rs: tenacity.RetryCallState) -> None:
            self._retry_event(call, rs)
            await call.sink.before_retry_async(rs)

        return build_retrying(self._state(call), self._clock, before_sleep)

    # -- invoke ----------------------------------------------------------------------------------

    def _run_sync_attempt(self, fn: Callable[[], Any], timeout: float) -> Any:
        if not self.enforce_sync_timeout:
            return fn()
        import contextvars

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

    def _invoke(
        self,
        input: Input,
        run_manager: CallbackManagerForChainRun,
        config: RunnableConfig,
        **kwargs: Any,
    ) -> Output:
        call = self._new_call(run_manager, stream=False, config=config)

        def attempt() -> Output:
            adm, timeout, started_wall, wait_before = self._begin(call, stream=False)
            t0 = self._clock.monotonic()
            try:
                with call.sink.scope():
                    out = self._run_sync_attempt(
                        lambda: self.bound.invoke(_fresh_input(input), config, **kwargs), timeout
                    )
            except Exception as exc:
                raise self._fail(
                    call, adm, exc, started_wall, self._clock.monotonic() - t0, wait_before
                ) from None
            except BaseException:
                self._cancelled(call, adm, started_wall, self._clock.monotonic() - t0, wait_before)
                raise
            self._succeed(call, adm, started_wall, self._clock.monotonic() - t0, wait_before)
            return out

        failed = False
        try:
            for a in self._sync_retrying(call):
                with a:
                    result = attempt()
                    self._finish(call, ok=True)
                    return result
        except AttemptFailed:
            failed = True
        if failed:
            self._finish(call, ok=False)
            raise self._final_error(call)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _ainvoke(
        self,
        input: Input,
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
        **kwargs: Any,
    ) -> Output:
        call = self._new_call(run_manager, stream=False, config=config)

        async def attempt() -> Output:
            adm, timeout, started_wall, wait_before = self._begin(call, stream=False)
            t0 = self._clock.monotonic()
            try:
                with call.sink.scope():
                    async with asyncio.timeout(timeout):
                        out = await self.bound.ainvoke(_fresh_input(input), config, **kwargs)
            except asyncio.CancelledError:
                self._cancelled(call, adm, started_wall, self._clock.monotonic() - t0, wait_before)
                raise
            except Exception as exc:
                raise self._fail(
                    call, adm, exc, started_wall, self._clock.monotonic() - t0, wait_before
                ) from None
            self._succeed(call, adm, started_wall, self._clock.monotonic() - t0, wait_before)
            return out

        failed = False
        try:
            async for a in self._async_retrying(call):
                with a:
                    result = await attempt()
                    self._finish(call, ok=True)
                    await call.sink.aflush()
                    return result
        except AttemptFailed:
            failed = True
        finally:
            await call.sink.aflush()
        if failed:
            self._finish(call, ok=False)
            raise self._final_error(call)
        raise AssertionError("unreachable")  # pragma: no cover

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
        input = self._single(list(inputs))
        call = self._new_call(run_manager, stream=True, config=config)

        def attempt() -> _Open:
            adm, timeout, started_wall, wait_before = self._begin(call, stream=True)
            t0 = self._clock.monotonic()
            it: Iterator[Any] | None = None
            try:
                with call.sink.scope():
                    it = iter(self.bound.stream(_fresh_input(input), config, **kwargs))

                    def first() -> list[Any]:
                        return [next(it)]  # type: ignore[arg-type]

                    try:
                        got = self._run_sync_attempt(first, timeout)
                    except StopIteration:
                        return _Open(adm, [], None, t0, started_wall, wait_before)
            except Exception as exc:
                if it is not None:
                    with contextlib.suppress(Exception):
                        it.close()  # type: ignore[attr-defined]
                raise self._fail(
                    call, adm, exc, started_wall, self._clock.monotonic() - t0, wait_before
                ) from None
            except BaseException:
                self._cancelled(call, adm, started_wall, self._clock.monotonic() - t0, wait_before)
                raise
            return _Open(adm, got, it, t0, started_wall, wait_before)

        opened: _Open | None = None
        failed = False
        try:
            for a in self._sync_retrying(call):
                with a:
                    opened = attempt()
        except AttemptFailed:
            failed = True
        if failed or opened is None:
            self._finish(call, ok=False)
            raise self._final_error(call)
        yield from self._relay_sync(call, opened)

    def _relay_sync(self, call: _Call, o: _Open) -> Iterator[Any]:
        ttft = self._clock.monotonic() - o.t0
        parts: list[str] = []
        done = False
        try:
            for chunk in o.first:
                parts.append(_text_of(chunk))
                yield chunk
            if o.rest is not None:
                while True:
                    with call.sink.scope():
                        try:
                            chunk = next(o.rest)
                        except StopIteration:
                            break
                    parts.append(_text_of(chunk))
                    yield chunk
            done = True
        except GeneratorExit:
            self._cancelled(call, o.admission, o.started_wall, self._clock.monotonic() - o.t0,
                            o.wait_before)  # fmt: skip
            raise
        except Exception as exc:
            af = self._fail(call, o.admission, exc, o.started_wall,
                            self._clock.monotonic() - o.t0, o.wait_before)  # fmt: skip
            self._finish(call, ok=False)
            partial = "".join(parts)
            raise StreamInterruptedError(
                f"{self.step}: stream failed after its first chunk ({len(partial)} chars): "
                f"{af.failure.message}",
                partial, exc, call.report,
            ) from exc  # fmt: skip
        finally:
            if not done and o.rest is not None:
                with contextlib.suppress(Exception):
                    o.rest.close()
        self._succeed(call, o.admission, o.started_wall, self._clock.monotonic() - o.t0,
                      o.wait_before, ttft)  # fmt: skip
        self._finish(call, ok=True)

    async def _atransform(
        self,
        inputs: AsyncIterator[Input],
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
        **kwargs: Any,
    ) -> AsyncIterator[Output]:
        input = self._single([x async for x in inputs])
        call = self._new_call(run_manager, stream=True, config=config)

        async def attempt() -> _Open:
            adm, timeout, started_wall, wait_before = self._begin(call, stream=True)
            t0 = self._clock.monotonic()
            it: Any = None
            try:
                with call.sink.scope():
                    it = self.bound.astream(_fresh_input(input), config, **kwargs).__aiter__()
                    async with asyncio.timeout(timeout):
                        try:
                            first = await it.__anext__()
                        except StopAsyncIteration:
                            return _Open(adm, [], None, t0, started_wall, wait_before)
            except asyncio.CancelledError:
                self._cancelled(call, adm, started_wall, self._clock.monotonic() - t0, wait_before)
                raise
            except Exception as exc:
                if it is not None and hasattr(it, "aclose"):
                    with contextlib.suppress(Exception):
                        await it.aclose()
                raise self._fail(
                    call, adm, exc, started_wall, self._clock.monotonic() - t0, wait_before
                ) from None
            return _Open(adm, [first], it, t0, started_wall, wait_before)

        opened: _Open | None = None
        failed = False
        try:
            async for a in self._async_retrying(call):
                with a:
                    opened = await attempt()
        except AttemptFailed:
            failed = True
        finally:
            await call.sink.aflush()
        if failed or opened is None:
            self._finish(call, ok=False)
            await call.sink.aflush()
            raise self._final_error(call)
        o = opened
        ttft = self._clock.monotonic() - o.t0
        parts: list[str] = []
        done = False
        try:
            for chunk in o.first:
                parts.append(_text_of(chunk))
                yield chunk
            if o.rest is not None:
                while True:
                    remaining = call.deadline.remaining()
                    with call.sink.scope():
                        try:
                            async with asyncio.timeout(max(0.001, min(self.attempt_timeout, remaining))):
                                chunk = await o.rest.__anext__()
                        except StopAsyncIteration:
                            break
                    parts.append(_text_of(chunk))
                    yield chunk
            done = True
        except (GeneratorExit, asyncio.CancelledError):
            self._cancelled(call, o.admission, o.started_wall, self._clock.monotonic() - o.t0,
                            o.wait_before)  # fmt: skip
            raise
        except Exception as exc:
            af = self._fail(call, o.admission, exc, o.started_wall,
                            self._clock.monotonic() - o.t0, o.wait_before)  # fmt: skip
            self._finish(call, ok=False)
            await call.sink.aflush()
            partial = "".join(parts)
            raise StreamInterruptedError(
                f"{self.step}: stream failed after its first chunk ({len(partial)} chars): "
                f"{af.failure.message}",
                partial, exc, call.report,
            ) from exc  # fmt: skip
        finally:
            if not done and o.rest is not None and hasattr(o.rest, "aclose"):
                with contextlib.suppress(Exception):
                    await o.rest.aclose()
        self._succeed(call, o.admission, o.started_wall, self._clock.monotonic() - o.t0,
                      o.wait_before, ttft)  # fmt: skip
        self._finish(call, ok=True)
        await call.sink.aflush()

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
        yield from self._transform_stream_with_config(
            iter([input]), self._transform, ensure_config(config), **kwargs
        )

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


def resilient(
    runnable: Runnable[Input, Output] | Callable[..., Any],
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
) -> ResilientRunnable[Input, Output]:
    """Wrap ``runnable`` (or a function, made a ``RunnableLambda``) with the router's resilience.

    Args:
        policy: a :class:`ResiliencePolicy` (or mapping): ``deadline``, ``attempt_timeout``,
            ``backoff``, ``breaker``, ``retry_budget`` and the per-class actions and retry
            counts; ``groups.<name>`` overrides apply to a step called ``name``.
        retry_on: exception classes (or a predicate) retried in addition to the taxonomy's
            retryable classes; other ``unknown`` exceptions are never retried.
        max_retries: retries per error class (overrides the policy's counts; default for
            ``retry_on`` matches: 2).
        deadline: total seconds per call, every attempt and sleep included.
        attempt_timeout / first_chunk_timeout: seconds per attempt / to a stream's first chunk.
            Enforced on the async paths; sync attempts run inline and cannot be interrupted
            unless ``enforce_sync_timeout=True`` (each attempt then runs on a helper thread,
            abandoned when it overruns).
        name: the step's name: breaker id, run name ``Resilient[<name>]``, event model_group.
        clock / seed: for tests (``FakeClock`` makes backoff sleeps instant).
        listener: receives every event (also via :meth:`ResilientRunnable.subscribe`).
        emit_events: dispatch ``llm_resilience.*`` custom events to LangChain callbacks.
    """
    if not isinstance(runnable, Runnable):
        if not callable(runnable):
            raise TypeError("resilient() wraps a Runnable or a callable")
        from langchain_core.runnables import RunnableLambda

        runnable = cast(Runnable[Input, Output], RunnableLambda(runnable))
    return ResilientRunnable(
        runnable,
        policy=policy,
        retry_on=retry_on,
        max_retries=max_retries,
        deadline=deadline,
        attempt_timeout=attempt_timeout,
        first_chunk_timeout=first_chunk_timeout,
        name=name,
        clock=clock,
        seed=seed,
        listener=listener,
        emit_events=emit_events,
        enforce_sync_timeout=enforce_sync_timeout,
    )


__all__ = ["ResilientRunnable", "resilient"]
