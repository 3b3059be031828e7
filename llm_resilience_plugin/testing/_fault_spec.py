"""Faults as data: the JSON/YAML form of a :class:`Behavior` (``{"kind": "rate_limit", "retry_after": 1}``).

Scenario files and the standalone simulator's ``POST /_faults/<deployment>`` both speak it, so a
fault written in a file is exactly the one a script can post. Each kind takes the arguments of its
:class:`Fault` constructor; anything else is refused naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llm_resilience_plugin.testing._faults import Behavior, Fault

__all__ = ["FAULT_KINDS", "FaultSpec", "behavior_from_data"]

FaultKind = Literal[
    "ok",
    "http_error",
    "rate_limit",
    "quota",
    "server_error",
    "overloaded",
    "auth",
    "context_length",
    "content_filter",
    "not_found",
    "reset",
    "silence",
    "slow_first_token",
    "stream_cut",
    "stream_stall",
    "malformed_chunk",
    "no_done",
    "flaky",
    "refuse_prefill",
]

# The arguments each kind accepts (besides ``kind``): those of its Fault constructor.
FAULT_KINDS: dict[str, frozenset[str]] = {
    "ok": frozenset({"text", "latency", "ttft", "chunk_delay"}),
    "http_error": frozenset({"status", "message", "retry_after", "code", "type"}),
    "rate_limit": frozenset({"retry_after", "message"}),
    "quota": frozenset({"message"}),
    "server_error": frozenset({"status", "message"}),
    "overloaded": frozenset({"retry_after"}),
    "auth": frozenset(),
    "context_length": frozenset({"limit"}),
    "content_filter": frozenset(),
    "not_found": frozenset(),
    "reset": frozenset(),
    "silence": frozenset({"max_hold"}),
    "slow_first_token": frozenset({"seconds"}),
    "stream_cut": frozenset({"after_chunks"}),
    "stream_stall": frozenset({"after_chunks", "seconds"}),
    "malformed_chunk": frozenset({"after_chunks", "content", "repeat", "replace"}),
    "no_done": frozenset(),
    "flaky": frozenset({"p", "fault", "seed"}),
    "refuse_prefill": frozenset({"fault", "message"}),
}

_QUOTA_MESSAGE = (
    "You exceeded your current quota, please check your plan and billing details. For more "
    "information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors."
)


class FaultSpec(BaseModel):
    """One fault as data: ``kind`` and the arguments of the matching :class:`Fault` constructor."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: FaultKind
    text: str | None = None
    latency: float | None = Field(default=None, ge=0)
    ttft: float | None = Field(default=None, ge=0)
    chunk_delay: float | None = Field(default=None, ge=0)
    status: int | None = None
    message: str | None = None
    retry_after: float | str | None = None
    code: str | None = None
    type: str | None = None
    limit: int | None = Field(default=None, gt=0)
    max_hold: float | None = Field(default=None, ge=0)
    seconds: float | None = Field(default=None, ge=0)
    after_chunks: int | None = Field(default=None, ge=0)
    p: float | None = Field(default=None, ge=0, le=1)
    fault: FaultSpec | None = None
    seed: int | None = None
    content: bool | None = None
    repeat: int | None = Field(default=None, ge=1)
    replace: bool | None = None

    @model_validator(mode="after")
    def _arguments_fit_the_kind(self) -> FaultSpec:
        given = {name for name in self.model_fields_set if name != "kind"}
        extra = sorted(given - FAULT_KINDS[self.kind])
        if extra:
            allowed = ", ".join(sorted(FAULT_KINDS[self.kind])) or "none"
            raise ValueError(f"{self.kind} does not take {', '.join(extra)} (it takes: {allowed})")
        if self.kind == "flaky" and (self.p is None or self.fault is None):
            raise ValueError("flaky needs p (a probability) and fault (the fault it applies)")
        if self.kind == "http_error" and self.status is None:
            raise ValueError("http_error needs status")
        self.behavior()  # the constructor's own checks (a status out of range, ...)
        return self

    def behavior(self) -> Behavior:
        """The :class:`Behavior` this spec describes."""
        args: dict[str, Any] = {
            k: getattr(self, k) for k in self.model_fields_set if k not in ("kind", "fault")
        }
        kind = self.kind
        if kind == "flaky":
            assert self.fault is not None and self.p is not None
            return Fault.flaky(self.p, self.fault.behavior(), seed=self.seed)
        if kind == "refuse_prefill":
            inner = self.fault.behavior() if self.fault is not None else None
            return Fault.refuse_prefill(inner, message=self.message)
        if kind == "quota":
            return Fault.http_error(
                429,
                message=self.message or _QUOTA_MESSAGE,
                code="insufficient_quota",
                type="insufficient_quota",
            )
        if kind == "silence":
            return Fault.silence(**args) if args else Fault.silence()
        maker = getattr(Fault, kind)
        return maker(**args)  # type: ignore[no-any-return]


def behavior_from_data(data: Any) -> Behavior:
    """The :class:`Behavior` of a fault mapping (``ValueError`` naming what is wrong)."""
    from pydantic import ValidationError

    try:
        return FaultSpec.model_validate(data).behavior()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        raise ValueError(f"{where + ': ' if where else ''}{message}") from None
