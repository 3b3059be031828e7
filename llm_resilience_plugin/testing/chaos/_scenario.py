"""Scenario files: per deployment, a timeline of faults, and how the calls arrive.

A scenario is YAML (the built-in catalogue ships in the same format, in ``scenarios/``)::

    name: primary-down
    description: the primary deployment answers 503 for 2 s, then recovers
    calls: 24            # how many calls
    rate: 8              # paced at 8 calls/s (or: concurrency: 4, a closed loop)
    timeline:
      primary[0]:        # a selector (see below) -> phases, each from `at` to `until` seconds
        - {at: 0, until: 2, fault: {kind: server_error, status: 503}}
    limits:
      primary: {rpm: 120, retry_after: 1}   # a provider's rate limit, enforced with real 429s

Selectors: ``primary`` (every deployment of the group the calls ask for), ``primary[0]`` (its
first), ``fallback`` / ``fallback[0]`` (the first fallback group), ``primary-provider`` (every
deployment of the first primary deployment's provider, in any group), ``all``,
``provider:<name>``, ``group:<name>``, ``id:<deployment id>``, or a bare deployment id or group
name. Outside its phases a deployment is healthy (``healthy:``, default a quick ``ok``).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.testing._fault_spec import FaultSpec

__all__ = ["Phase", "RateLimit", "Scenario", "builtin_scenarios", "load_scenario", "scenario_from_mapping"]

MAX_SENDING_S = 3600.0  # a paced scenario sends its calls within an hour (rate: 1e-300 never ends)
_HEALTHY = FaultSpec(kind="ok", ttft=0.02, chunk_delay=0.002)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Phase(_Strict):
    """One fault on a deployment from ``at`` to ``until`` seconds after the scenario starts
    (``until`` omitted: to the end)."""

    at: float = Field(default=0.0, ge=0)
    until: float | None = Field(default=None, gt=0)
    fault: FaultSpec

    @model_validator(mode="after")
    def _ordered(self) -> Phase:
        if self.until is not None and self.until <= self.at:
            raise ValueError(f"until ({self.until:g}) must be after at ({self.at:g})")
        return self


class RateLimit(_Strict):
    """A provider's rate limit on the selected deployments for the whole run: ``rpm`` requests and
    ``tpm`` tokens (prompt + ``max_tokens``) a minute, ``burst_s`` seconds' worth at once, 429 above
    them (with ``Retry-After`` when given), OpenAI's ``x-ratelimit-*`` headers when ``headers``."""

    rpm: float | None = Field(default=None, gt=0, le=1e7)
    tpm: float | None = Field(default=None, gt=0, le=1e10)
    burst_s: float = Field(default=1.0, gt=0, le=3600)
    retry_after: float | None = Field(default=None, ge=0, le=3600)
    headers: bool = True

    @model_validator(mode="after")
    def _some_limit(self) -> RateLimit:
        if self.rpm is None and self.tpm is None:
            raise ValueError("give rpm, tpm or both (requests or tokens a minute)")
        return self


class Scenario(_Strict):
    """One chaos scenario: the faults per selector, the load, and what the verdict may ignore."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    calls: int = Field(default=20, ge=1, le=10_000)
    concurrency: int | None = Field(default=None, ge=1, le=1000)
    rate: float | None = Field(default=None, gt=0)
    stream: bool = False
    tools: bool = False
    prompt_words: int = Field(default=8, ge=1, le=200_000)
    max_tokens: int = Field(default=16, ge=1)
    healthy: FaultSpec = _HEALTHY
    timeline: dict[str, list[Phase]] = Field(default_factory=dict)
    limits: dict[str, RateLimit] = Field(
        default_factory=dict, description="Per selector, a provider rate limit enforced throughout."
    )
    budget: float | None = Field(
        default=None, gt=0, description="A daily budget (dollars) the plugin runs under here."
    )
    gate: bool = Field(
        default=True, description="Whether the config's chaos thresholds apply to this scenario."
    )

    @model_validator(mode="after")
    def _one_load(self) -> Scenario:
        if self.concurrency is not None and self.rate is not None:
            raise ValueError("give either concurrency (a closed loop) or rate (calls per second)")
        if self.rate is not None and self.calls / self.rate > MAX_SENDING_S:
            raise ValueError(
                f"rate: {self.calls} calls at {self.rate:g}/s take {self.calls / self.rate:.3g} s to send; "
                f"a scenario sends its calls within {MAX_SENDING_S:g} s: raise rate or lower calls"
            )
        return self

    @property
    def recovers_at(self) -> float | None:
        """When the last fault on ``primary``-side selectors ends, if every one of them ends."""
        ends = [p.until for phases in self.timeline.values() for p in phases]
        if not ends or any(e is None for e in ends):
            return None
        return max(e for e in ends if e is not None)


def scenario_from_mapping(data: Any, source: str = "scenario") -> Scenario:
    """A :class:`Scenario` from parsed YAML; ``ConfigError`` naming the field on a mistake."""
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ConfigError(f"{source}: {where}" if where else source, message + more) from None


def load_scenario(path: str | Path) -> Scenario:
    """Read one scenario YAML file (``ConfigError`` for a missing file, bad YAML or a bad field)."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except (FileNotFoundError, IsADirectoryError):
        raise ConfigError("--scenario", f"scenario file not found: {p}") from None
    except yaml.YAMLError as exc:
        raise ConfigError("--scenario", f"{p} is not valid YAML: {exc}") from None
    return scenario_from_mapping(data, source=str(p))


def builtin_scenarios() -> list[Scenario]:
    """The built-in catalogue (package data, ``scenarios/*.yaml``), in file-name order."""
    folder = resources.files("llm_resilience_plugin.testing.chaos") / "scenarios"
    found = sorted((f for f in folder.iterdir() if f.name.endswith(".yaml")), key=lambda f: f.name)
    return [scenario_from_mapping(yaml.safe_load(f.read_text()), source=f.name) for f in found]
