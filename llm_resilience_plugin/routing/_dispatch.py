"""The Router dispatcher: one attempt through the wrapped ``litellm.Router`` (the direct
dispatcher in :mod:`._direct` hands it every group or request it does not send itself).

LiteLLM's routing strategy picks the deployment among those the engine admits (its filter hook);
the Router's own retries, fallbacks and cooldowns are off, so each ``send`` is exactly one request.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import httpx
import litellm

from llm_resilience_plugin._engine.attempt import AttemptContext
from llm_resilience_plugin._engine.dispatch import CHAT, PAYLOAD_KEYS
from llm_resilience_plugin._engine.engine import Engine
from llm_resilience_plugin._engine.executor_wait import quiet_cancel
from llm_resilience_plugin._engine.live import LiveAttempt
from llm_resilience_plugin._engine.watchdog import AttemptWatchdog
from llm_resilience_plugin.events import (
    REPORT_KEY,
    CallReport,
    attach_report,
    fill_from_response,
    hidden_params_of,
    usage_of,
)
from llm_resilience_plugin.routing._hooks import ATTEMPTS, FILTER, META_KEY, PICK, picked_in
from llm_resilience_plugin.routing._streams import ResilientStream, StaticStream, discard, prefetch_stream


class NoSdkRetries(int):
    """Zero SDK retries that survive LiteLLM's ``max_retries or DEFAULT_MAX_RETRIES``: its OpenAI
    embedding path (``llms/openai/openai.py``, litellm 1.110) turns a plain 0 into 2, so one
    embedding attempt would be up to three requests. Truthy, equal to 0."""

    def __new__(cls) -> NoSdkRetries:
        return super().__new__(cls, 0)

    def __bool__(self) -> bool:
        return True


NO_SDK_RETRIES = NoSdkRetries()


class RouterDispatcher:
    """Sends an attempt as ``litellm.Router.acompletion`` for the attempt's model group (or the
    Router's function for the call's operation: ``aembedding``, ``aresponses``, ...)."""

    def __init__(self, router: litellm.Router, engine: Engine) -> None:
        self.router = router
        self.engine = engine
        self._timeouts: dict[tuple[float, float], httpx.Timeout] = {}

    def attempt_kwargs(
        self,
        stream: bool,
        token: str,
        timeout: float,
        connect: float | None,
        kwargs: Mapping[str, Any],
        operation: str = CHAT,
    ) -> dict[str, Any]:
        """LiteLLM's kwargs for one attempt: the attempt token in metadata, the timeouts, usage."""
        # LiteLLM's Responses path keeps its routing metadata in ``litellm_metadata`` (``metadata``
        # is the caller's, sent to the provider); every other path in ``metadata``.
        field = "litellm_metadata" if operation == "responses" else "metadata"
        if kwargs:
            out = dict(kwargs)
            md = dict(out.pop(field, None) or {})
            md[META_KEY] = token
            out[field] = md
        else:  # the common case: LiteLLM's defaults for everything else
            out = {field: {META_KEY: token}}
        if operation == "embedding":  # the Router's SDK retries are off on every other path
            out["max_retries"] = NO_SDK_RETRIES
        if connect and operation != "responses":  # LiteLLM's Responses path takes seconds only
            t = self._timeouts.get((timeout, connect))
            if t is None:
                t = httpx.Timeout(timeout, connect=min(connect, timeout))
                if len(self._timeouts) < 64:  # few values: configured ones, or a deadline's rest rounded
                    self._timeouts[(timeout, connect)] = t
            out["timeout"] = t
        else:
            out["timeout"] = timeout
        if stream:
            out["stream"] = True
            if operation == "responses":  # usage comes with response.completed
                return out
            opts = dict(out.get("stream_options") or {})
            opts.setdefault("include_usage", True)
            out["stream_options"] = opts
        return out

    async def send(
        self,
        attempt: AttemptContext,
        messages: list[dict[str, Any]],
        kwargs: dict[str, Any],
        *,
        timeout_s: float,
        bound: float,
    ) -> Any:
        """One request; the deployment it went to is known to ``attempt`` when this returns or raises.
        The hooks it registers are let go by ``attempt.clean_up()`` once the outcome is counted."""
        engine = self.engine
        call = attempt.call
        token = attempt.token
        ATTEMPTS[token] = attempt
        epoch = engine.epoch  # before all_clear(): a transition in between makes the attempt precise
        filtered = bool(call.failed or attempt.exclude or call.restricted) or not engine.all_clear()
        # A precise attempt learns its deployment from the pick hook as the request goes out (a
        # hedge must know it while the request is in flight); the rest (every breaker closed, no
        # guard) read it back from the metadata LiteLLM fills in.
        precise = filtered or bool(engine.guards) or attempt.hedged
        if filtered:
            FILTER.acquire()
            attempt.on_clean_up(FILTER.release)
        if precise:
            PICK.acquire()
            attempt.on_clean_up(PICK.release)
        md: Mapping[str, Any] | None = None
        try:
            op = call.operation
            attempt_kwargs = self.attempt_kwargs(
                call.stream, token, timeout_s, engine.policies[attempt.group].connect_timeout, kwargs, op
            )
            md = attempt_kwargs["litellm_metadata" if op == "responses" else "metadata"]
            with AttemptWatchdog(bound):  # the hard bound, if LiteLLM's timeout does not end it first
                if op == CHAT:
                    resp: Any = await quiet_cancel(
                        self.router.acompletion(
                            model=attempt.group,
                            messages=messages,  # type: ignore[arg-type]
                            **attempt_kwargs,
                        )
                    )
                else:  # the same attempt through the Router's function for the operation
                    send = getattr(self.router, "a" + op)
                    attempt_kwargs[PAYLOAD_KEYS[op]] = messages
                    resp = await quiet_cancel(send(model=attempt.group, **attempt_kwargs))
                if call.stream:
                    resp = await prefetch_stream(resp)
        except BaseException:
            if not precise:
                attempt.learn(picked_in(md), epoch)
            raise
        finally:  # the hooks find an attempt by its token only while its request is going out
            ATTEMPTS.pop(token, None)
        if call.stream:
            if not precise:
                attempt.learn(picked_in(md), epoch)
            return resp
        # The deployment LiteLLM reports; its hidden params are kept for the engine's record (one read)
        hidden = attempt.hidden = hidden_params_of(resp)
        dep = hidden.get("model_id") if hidden is not None else None
        if dep is not None:
            dep = str(dep)
        if not precise:
            attempt.learn(dep if dep is not None else picked_in(md), epoch)
        elif dep is not None and attempt.picked != dep:
            attempt.pick(dep)
        return resp

    def wrap_stream(
        self,
        attempt: AttemptContext,
        level: int,
        prefetched: Any,
        started_wall: float,
        latency: float,
        wait_before: float,
        messages: list[dict[str, Any]],
        kwargs: dict[str, Any],
    ) -> ResilientStream:
        """The caller's stream over LiteLLM's, reporting its end back to the engine."""
        live = LiveAttempt(self.engine, attempt, level, started_wall, latency, wait_before)
        return ResilientStream(live, prefetched, messages, kwargs)

    def static_stream(self, response: Any, attempt_call: Any) -> StaticStream:
        """A configured static answer as a one-chunk stream."""
        return StaticStream(response, attempt_call.report, functools.partial(self.engine.emit, attempt_call))

    def annotate(self, report: CallReport, result: Any, usage: dict[str, int] | None) -> None:
        """The served model, cost and usage of an answer, and the report attached to it; a live
        stream fills its report as it ends."""
        if isinstance(result, ResilientStream):
            return
        if usage is None:
            usage = usage_of(result)
        hidden = hidden_params_of(result)
        if hidden is None:
            fill_from_response(report, result, usage)
            attach_report(result, report)
            return
        # fill_from_response and attach_report in one read of LiteLLM's hidden params
        report.served_model = getattr(result, "model", None)
        cost = hidden.get("response_cost")
        report.response_cost = float(cost) if isinstance(cost, int | float) else None
        report.usage = usage
        hidden[REPORT_KEY] = report

    async def discard(self, result: Any) -> None:
        """Close a result nobody will read (the loser of a hedge)."""
        await discard(result)
