"""LangChain callback handlers: the cost guard and structured logs for ANY chat model.

::

    chain.invoke(x, config={
        "callbacks": [CostGuardCallbackHandler(guard), StructuredLogCallbackHandler()],
        "metadata": {"tenant": "acme"},
    })

:class:`CostGuardCallbackHandler` is a *sync* handler with ``raise_error=True`` and
``run_inline=True``: raising :class:`~llm_resilience_plugin.errors.BudgetExceededError` from
``on_chat_model_start`` stops ``invoke``, ``ainvoke``, ``stream`` and ``astream`` before the model
sends anything (an async handler could not stop a sync ``invoke``). It settles in ``on_llm_end``
from the message's ``usage_metadata`` (present for invoke and stream; ``llm_output`` is None when
streaming) or the provider's ``response_cost`` in ``response_metadata`` when there is one, and
releases in ``on_llm_error``.

Attach the guard in ONE place per call path: either the handler (any chat model) or
``ResilientRouter(guards=[guard])`` - not both for the same calls, or they are counted twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage, convert_to_openai_messages
from langchain_core.outputs import LLMResult

from llm_resilience_plugin._engine.taxonomy import classify
from llm_resilience_plugin.cost._guard import CostGuard, Ticket
from llm_resilience_plugin.cost._prices import settled_cost
from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.events import hidden_params_of, usage_of
from llm_resilience_plugin.langchain._recovery import AnsweredAgain, handed_answer
from llm_resilience_plugin.observability._logs import iso_ts, redact, safe_metadata

# Invocation-param / metadata keys that name the model, most specific first.
_MODEL_KEYS = ("model", "model_name", "model_id", "deployment_name", "azure_deployment")


def model_name_of(
    serialized: Mapping[str, Any] | None,
    invocation_params: Mapping[str, Any] | None,
    metadata: Mapping[str, Any] | None,
) -> str | None:
    """The model a LangChain run calls: invocation params, then ``ls_model_name``, then the
    serialized constructor kwargs."""
    for source in (invocation_params or {}, (serialized or {}).get("kwargs") or {}):
        for k in _MODEL_KEYS:
            v = source.get(k)
            if isinstance(v, str) and v:
                return v
    v = (metadata or {}).get("ls_model_name")
    return v if isinstance(v, str) and v else None


def _max_tokens_of(inv: Mapping[str, Any], md: Mapping[str, Any]) -> Any:
    for v in (
        inv.get("max_tokens"),
        inv.get("max_completion_tokens"),
        inv.get("max_output_tokens"),
        md.get("ls_max_tokens"),
    ):
        if v is not None:
            return v
    return None


def _token_text(token: Any) -> str:
    """The text of a streamed token: a string, or a list of content blocks (LangChain 1.x)."""
    if isinstance(token, str):
        return token
    if isinstance(token, list):
        parts = []
        for b in token:
            if isinstance(b, str):
                parts.append(b)
            elif isinstance(b, Mapping) and isinstance(b.get("text"), str):
                parts.append(b["text"])
        return "".join(parts)
    return ""


@dataclass(slots=True)
class _Settlement:
    cost: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    deployment_id: str | None = None
    served_model: str | None = None
    response_metadata: dict[str, Any] = field(default_factory=dict)


def usage_of_result(response: LLMResult) -> _Settlement:
    """Tokens, reported cost, served model and deployment of an LLM run's result (invoke or
    stream): ``usage_metadata`` of each prompt's first generation that has one, else
    ``llm_output["token_usage"]``."""
    out = _Settlement()
    pt = ct = 0
    seen_usage = False
    cost = 0.0
    seen_cost = False
    for gens in response.generations:
        for gen in gens:
            msg = getattr(gen, "message", None)
            if msg is None:
                continue
            um = getattr(msg, "usage_metadata", None)
            rm = getattr(msg, "response_metadata", None) or {}
            if not out.response_metadata and rm:
                out.response_metadata = dict(rm)
            if um:
                pt += int(um.get("input_tokens") or 0)
                ct += int(um.get("output_tokens") or 0)
                seen_usage = True
            c = rm.get("response_cost")
            if isinstance(c, int | float) and not isinstance(c, bool):
                cost += float(c)
                seen_cost = True
            if out.deployment_id is None:
                dep = rm.get("deployment_id") or rm.get("model_id")
                out.deployment_id = str(dep) if dep else None
            if out.served_model is None:
                sm = rm.get("model_name") or rm.get("model")
                out.served_model = str(sm) if sm else None
            if um or c is not None:
                break  # one usage per prompt: the other choices share it
    if not seen_usage and isinstance(response.llm_output, Mapping):
        tu = response.llm_output.get("token_usage") or response.llm_output.get("usage")
        if tu is not None:
            get = tu.get if isinstance(tu, Mapping) else (lambda k, _tu=tu: getattr(_tu, k, None))
            p, c2 = get("prompt_tokens"), get("completion_tokens")
            if p is not None or c2 is not None:
                pt, ct, seen_usage = int(p or 0), int(c2 or 0), True
    if seen_usage:
        out.prompt_tokens, out.completion_tokens = pt, ct
    if seen_cost:
        out.cost = cost
    return out


class _RunTree:
    """Parent links of the runs a handler has seen, to find an LLM run's root (one agent run)."""

    def __init__(self) -> None:
        self._parent: dict[UUID, UUID | None] = {}
        self._lock = threading.Lock()

    def start(self, run_id: UUID, parent_run_id: UUID | None) -> None:
        with self._lock:
            self._parent[run_id] = parent_run_id

    def end(self, run_id: UUID) -> None:
        with self._lock:
            self._parent.pop(run_id, None)

    def root(self, run_id: UUID) -> UUID:
        with self._lock:
            node = run_id
            for _ in range(10_000):
                parent = self._parent.get(node)
                if parent is None:
                    return node
                node = parent
            return node


@dataclass(slots=True)
class _LLMStart:
    """An LLM run's start as either LangChain hook reports it: chat ``messages`` or ``prompts``."""

    run_id: UUID
    serialized: Mapping[str, Any] | None
    kwargs: Mapping[str, Any]  # the hook's keywords: parent_run_id, tags, metadata, invocation_params
    messages: list[list[BaseMessage]] | None = None
    prompts: list[str] | None = None

    @property
    def parent_run_id(self) -> UUID | None:
        return self.kwargs.get("parent_run_id")

    @property
    def tags(self) -> list[str] | None:
        return self.kwargs.get("tags")

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self.kwargs.get("metadata") or {}

    @property
    def invocation_params(self) -> Mapping[str, Any]:
        return self.kwargs.get("invocation_params") or {}


class _RunTracking(BaseCallbackHandler):
    """Keeps the run tree from chain/tool/retriever starts and ends; both LLM start hooks (chat
    model, text LLM) reach one ``_llm_start``."""

    def __init__(self) -> None:
        super().__init__()
        self._tree = _RunTree()

    def on_chain_start(
        self, serialized: Any, inputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        self._tree.start(run_id, parent_run_id)

    def on_tool_start(
        self,
        serialized: Any,
        input_str: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._tree.start(run_id, parent_run_id)

    def on_retriever_start(
        self, serialized: Any, query: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        self._tree.start(run_id, parent_run_id)

    def on_chat_model_start(
        self, serialized: dict[str, Any], messages: list[list[BaseMessage]], *, run_id: UUID, **kwargs: Any
    ) -> None:
        self._llm_start(_LLMStart(run_id, serialized, kwargs, messages=messages))

    def on_llm_start(
        self, serialized: dict[str, Any], prompts: list[str], *, run_id: UUID, **kwargs: Any
    ) -> None:
        self._llm_start(_LLMStart(run_id, serialized, kwargs, prompts=list(prompts)))

    def _llm_start(self, start: _LLMStart) -> None:
        raise NotImplementedError  # each handler reserves or records

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._tree.end(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._tree.end(run_id)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._tree.end(run_id)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._tree.end(run_id)

    def on_retriever_end(self, documents: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._tree.end(run_id)

    def on_retriever_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._tree.end(run_id)

    # Handlers are shared, never copied (LangChain copies handler lists for child runs).
    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return self


class CostGuardCallbackHandler(_RunTracking):
    """Reserve in ``on_chat_model_start`` / ``on_llm_start``, settle in ``on_llm_end``, release
    in ``on_llm_error``.

    Scopes come from the run's ``metadata`` and ``tags`` (``{"tenant": "acme"}`` or the tag
    ``"tenant:acme"``); the per-request budget is the LLM run; the per-run budget is the root
    run (one chain / agent invocation). The model is read from ``invocation_params``
    (``model``/``model_name``), then ``ls_model_name``; a name LiteLLM cannot price (a
    ResilientChatModel's model group) is resolved by the guard's ``price_resolver`` or bound
    router.
    """

    raise_error: bool = True
    run_inline: bool = True

    def __init__(self, guard: CostGuard) -> None:
        super().__init__()
        if not isinstance(guard, CostGuard):
            raise ConfigError("guard", "expected a CostGuard")
        self.guard = guard
        self._tickets: dict[UUID, Ticket] = {}
        self._streamed: set[UUID] = set()
        self._lock = threading.Lock()
        # invoke's stream broke after content and the call was answered again (see _recovery):
        # settled when the broken run ends; the run that then delivers the answer sends nothing
        # and reserves nothing. The answers settled so far, to know that run (bounded: a run
        # that never comes leaves nothing behind but its entry, soon pushed out).
        self._settled_answers: deque[Any] = deque(maxlen=256)

    def _llm_start(self, start: _LLMStart) -> None:
        """Reserve the run's worst case before the model sends anything (raising stops it)."""
        run_id, prompts, inv, md = start.run_id, start.prompts, start.invocation_params, start.metadata
        messages: list[list[dict[str, Any]]] | None = None
        if start.messages is not None:
            messages = [convert_to_openai_messages(m) for m in start.messages]
        self._tree.start(run_id, start.parent_run_id)
        if self._adopt(run_id):
            return
        model = model_name_of(start.serialized, inv, md)
        if model is None:
            raise ConfigError(
                "model",
                "cannot tell which model this LangChain run calls (no model/model_name in "
                "invocation_params, no ls_model_name); give the guard a price_resolver",
            )
        provider = md.get("ls_provider")
        try:
            cands = self.guard.candidates_for_model(
                model, provider=provider if isinstance(provider, str) else None
            )
        except ConfigError as err:
            if err.field != "unknown_model":
                raise
            raise ConfigError(
                "unknown_model",
                f"{err.message}. If {model!r} is a model group of a ResilientChatModel, give the "
                "guard its router: CostGuard(..., router=llm.get_router())",
            ) from None
        prompt_tokens: int | None = None
        copies = 1
        single: list[dict[str, Any]] | None = None
        text: str | None = None
        if messages is not None:
            if len(messages) == 1:
                single = messages[0]
            else:
                copies = len(messages)
                prompt_tokens = sum(self.guard.count_prompt_tokens(cands[0][1], m) for m in messages)
        elif prompts is not None:
            if len(prompts) == 1:
                text = prompts[0]
            else:
                copies = len(prompts)
                prompt_tokens = sum(self.guard.count_prompt_tokens(cands[0][1], text=p) for p in prompts)
        n = inv.get("n")
        n = (int(n) if isinstance(n, int) and n > 0 else 1) * copies
        ticket = self.guard.reserve(
            cands,
            messages=single,
            text=text if single is None else None,
            tools=inv.get("tools"),
            max_tokens=_max_tokens_of(inv, md),
            n=n,
            prompt_tokens=prompt_tokens,
            metadata=md,
            tags=start.tags,
            request_id=str(run_id),
            run_id=str(self._tree.root(run_id)),
            model_group=model,
        )
        with self._lock:
            self._tickets[run_id] = ticket

    def _adopt(self, run_id: UUID) -> bool:
        """A run that delivers an answer already paid for and settled (``invoke`` hands a
        broken stream's answer to a new run, which sends nothing) reserves nothing: a refusal
        now would throw away spend that happened."""
        answer = handed_answer()
        if answer is None:
            return False
        with self._lock:
            for i, resp in enumerate(self._settled_answers):
                if resp is answer:
                    del self._settled_answers[i]
                    return True
        return False

    def _settle_answered(self, ticket: Ticket, answer: Any) -> None:
        """Settle a call whose stream broke after content and that was answered again: the
        broken stream at the estimate (its usage is unknown, as for any broken stream) plus
        the answer at its reported cost, else its usage at the serving deployment's price."""
        usage = usage_of(answer) or {}
        hidden = hidden_params_of(answer) or {}
        dep = hidden.get("model_id")  # the deployment LiteLLM says served it
        reported = hidden.get("response_cost")
        reported = (
            float(reported) if isinstance(reported, int | float) and not isinstance(reported, bool) else None
        )
        price = ticket.prices.get(dep or "") or ticket.fallback_price
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        answered, _ = settled_cost(
            price,
            reported=reported,
            prompt_tokens=prompt,
            completion_tokens=completion,
            estimate=ticket.estimate,
        )
        self.guard.settle(
            ticket,
            cost=answered + ticket.estimate,
            prompt_tokens=prompt,
            completion_tokens=completion,
            deployment_id=dep,
            model=getattr(answer, "model", None),
        )

    def on_llm_new_token(
        self, token: str | list[str | dict[str, Any]], *, run_id: UUID, **kwargs: Any
    ) -> None:
        if _token_text(token):
            with self._lock:
                if run_id in self._tickets:
                    self._streamed.add(run_id)

    def _pop(self, run_id: UUID) -> tuple[Ticket | None, bool]:
        with self._lock:
            streamed = run_id in self._streamed
            self._streamed.discard(run_id)
            return self._tickets.pop(run_id, None), streamed

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        self._tree.end(run_id)
        ticket, _ = self._pop(run_id)
        if ticket is None:
            return
        s = usage_of_result(response)
        self.guard.settle(
            ticket,
            cost=s.cost,
            prompt_tokens=s.prompt_tokens,
            completion_tokens=s.completion_tokens,
            deployment_id=s.deployment_id,
            model=s.served_model,
        )

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Release the reservation - unless tokens were already streamed: the provider bills
        what it generated, and with no usage known the estimate is settled (conservative)."""
        self._tree.end(run_id)
        ticket, streamed = self._pop(run_id)
        if ticket is None:
            return
        if isinstance(error, AnsweredAgain) and error.response is not None:
            # The call went on and was answered: the broken stream and the answer, settled now.
            self._settle_answered(ticket, error.response)
            with self._lock:
                self._settled_answers.append(error.response)
        elif streamed:
            self.guard.settle(ticket)
        else:
            self.guard.release(ticket)

    @property
    def pending(self) -> int:
        """Reservations not yet settled or released (runs in flight)."""
        with self._lock:
            return len(self._tickets)


# -- structured logs ------------------------------------------------------------------------------


@dataclass(slots=True)
class _Run:
    ts: float
    t0: float
    parent_run_id: UUID | None
    model: str | None
    provider: str | None
    tags: list[str]
    metadata: dict[str, Any]
    params: dict[str, Any]
    content: Any = None
    ttft_ms: float | None = None
    retries: int = 0
    chunks: list[str] = field(default_factory=list)


_PARAM_KEYS = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "n", "stream")


class StructuredLogCallbackHandler(_RunTracking):
    """One JSON-ready log record per LLM run (``llm_run``), through stdlib ``logging``.

    Fields: ``ts``, ``run_id``, ``parent_run_id``, ``root_run_id``, ``model`` (requested model or
    group), ``provider``, ``served_model``, ``deployment_id`` (when the model reports it),
    ``latency_ms``, ``ttft_ms`` (streams), ``prompt_tokens``/``completion_tokens``/
    ``total_tokens``, ``cost``, ``outcome`` (``success``/``failure``), ``error_class`` /
    ``error_type`` / ``error_message``, ``retries`` (``on_retry`` events), ``fallback_level`` /
    ``call_id`` / ``upstream_requests`` (ResilientChatModel's response metadata),
    ``budget_remaining`` (with ``guard=``), ``request_key`` (the run id) and
    ``idempotency_key`` (from metadata), ``tags``, ``metadata`` (scalar values only).
    Message content only with ``include_content=True``. Use :class:`~llm_resilience_plugin.observability.
    JsonFormatter` on a handler of the logger to emit JSON.
    """

    raise_error: bool = False
    run_inline: bool = True

    def __init__(
        self,
        logger: logging.Logger | str | None = None,
        *,
        level: int = logging.INFO,
        guard: CostGuard | None = None,
        include_content: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(logger, str) or logger is None:
            logger = logging.getLogger(logger or "llm_resilience.llm")
        self.logger = logger
        self.level = level
        self.guard = guard
        self.include_content = bool(include_content)
        self._runs: dict[UUID, _Run] = {}
        self._lock = threading.Lock()

    def _llm_start(self, start: _LLMStart) -> None:
        run_id, parent_run_id = start.run_id, start.parent_run_id
        inv, md = start.invocation_params, start.metadata
        self._tree.start(run_id, parent_run_id)
        content: Any = start.prompts
        if start.messages is not None and self.include_content:
            content = [convert_to_openai_messages(m) for m in start.messages]
        provider = md.get("ls_provider") or inv.get("_type")
        run = _Run(
            ts=time.time(),
            t0=time.monotonic(),
            parent_run_id=parent_run_id,
            model=model_name_of(start.serialized, inv, md),
            provider=str(provider) if provider else None,
            tags=list(start.tags or []),
            metadata=safe_metadata(md),
            params={k: inv[k] for k in _PARAM_KEYS if inv.get(k) is not None},
            content=content if self.include_content else None,
        )
        if "max_tokens" not in run.params and md.get("ls_max_tokens") is not None:
            run.params["max_tokens"] = md["ls_max_tokens"]
        with self._lock:
            self._runs[run_id] = run
            # a run refused by another handler's on_*_start never ends: keep the map bounded
            while len(self._runs) > 10_000:
                self._runs.pop(next(iter(self._runs)))

    def on_llm_new_token(
        self, token: str | list[str | dict[str, Any]], *, run_id: UUID, **kwargs: Any
    ) -> None:
        text = _token_text(token)
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return
            if run.ttft_ms is None:
                run.ttft_ms = (time.monotonic() - run.t0) * 1000.0
            if self.include_content and text:
                run.chunks.append(text)

    def on_retry(self, retry_state: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            run = self._runs.get(run_id)
            if run is not None:
                run.retries += 1

    def _base(self, run_id: UUID, run: _Run) -> dict[str, Any]:
        return {
            "ts": iso_ts(run.ts),
            "run_id": str(run_id),
            "parent_run_id": str(run.parent_run_id) if run.parent_run_id else None,
            "root_run_id": str(self._tree.root(run_id)),
            "model": run.model,
            "provider": run.provider,
            "latency_ms": round((time.monotonic() - run.t0) * 1000.0, 3),
            "ttft_ms": round(run.ttft_ms, 3) if run.ttft_ms is not None else None,
            "retries": run.retries,
            "request_key": str(run_id),
            "idempotency_key": run.metadata.get("idempotency_key"),
            "tags": run.tags,
            "metadata": run.metadata,
            "params": run.params,
        }

    def _budget(self, run_id: UUID, run: _Run, rec: dict[str, Any]) -> None:
        if self.guard is None:
            return
        info = self.guard.call_info(str(run_id))
        if info is not None and info.get("budget_remaining") is not None:
            rec["budget_remaining"] = info["budget_remaining"]
            rec["budget_tightest"] = info["budget_tightest"]
            if rec.get("cost") is None and info.get("cost"):
                rec["cost"] = info["cost"]
        else:
            try:
                rec["budget_remaining"] = self.guard.remaining(run.metadata, run.tags)
            except Exception:  # logging never breaks a call
                rec["budget_remaining"] = None

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            run = self._runs.pop(run_id, None)
        if run is None:
            self._tree.end(run_id)
            return
        s = usage_of_result(response)
        rm = s.response_metadata
        rec = self._base(run_id, run)
        self._tree.end(run_id)
        total = None
        if s.prompt_tokens is not None or s.completion_tokens is not None:
            total = (s.prompt_tokens or 0) + (s.completion_tokens or 0)
        rec.update(
            {
                "outcome": "success",
                "served_model": s.served_model,
                "deployment_id": s.deployment_id,
                "prompt_tokens": s.prompt_tokens,
                "completion_tokens": s.completion_tokens,
                "total_tokens": total,
                "cost": s.cost,
                "finish_reason": rm.get("finish_reason"),
                "error_class": None,
            }
        )
        # ResilientChatModel: the router's call report under "resilience", the group and the
        # deployment at the top level
        raw = rm.get("resilience")
        res: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        for k in ("call_id", "fallback_level", "upstream_requests", "retries", "served_group"):
            v = rm.get(k, res.get(k))
            if v is not None:
                rec[k] = v
        if rm.get("model_group") is not None:
            rec["served_group"] = rm["model_group"]
        if res.get("idempotency_key") and not rec.get("idempotency_key"):
            rec["idempotency_key"] = res["idempotency_key"]
        self._budget(run_id, run, rec)
        if self.include_content:
            rec["input"] = run.content
            texts = [getattr(g, "text", None) for gens in response.generations for g in gens]
            rec["output"] = texts[0] if len(texts) == 1 else texts
        self.logger.log(self.level, "llm_run", extra={"llm_event_name": "llm_run", "llm_event": redact(rec)})

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            run = self._runs.pop(run_id, None)
        if run is None:
            self._tree.end(run_id)
            return
        rec = self._base(run_id, run)
        self._tree.end(run_id)
        try:
            err_class: str | None = str(classify(error).error_class)
        except Exception:  # pragma: no cover - classify is total
            err_class = None
        # A broken stream whose call was answered again (the next run carries the answer) is not a
        # failed call: its own outcome, and no warning.
        again = isinstance(error, AnsweredAgain)
        rec.update(
            {
                "outcome": "answered_again" if again else "failure",
                "error_class": err_class,
                "error_type": type(error).__name__,
                "error_message": str(error)[:500],
                "cost": None,
            }
        )
        budget_name = getattr(error, "budget", None)
        if budget_name is not None:
            rec["budget"] = budget_name
        self._budget(run_id, run, rec)
        if self.include_content:
            rec["input"] = run.content
            rec["partial_output"] = "".join(run.chunks)
        self.logger.log(
            self.level if again else max(self.level, logging.WARNING),
            "llm_run",
            extra={"llm_event_name": "llm_run", "llm_event": redact(rec)},
        )


__all__ = [
    "CostGuardCallbackHandler",
    "StructuredLogCallbackHandler",
    "model_name_of",
    "usage_of_result",
]
