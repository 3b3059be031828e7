"""A :class:`CostGuard` from a mapping: the ``cost:`` section of a router YAML.

::

    cost:
      ledger: sqlite:///spend.db          # memory (default), sqlite:///path.db, redis://host:6379/0
      alert_at: [0.5, 0.8]                # fractions of a day/month/total limit
      timezone: Europe/Paris              # where calendar days and months are cut
      budgets:
        - {period: request, limit: 0.50}
        - {period: day, limit: 50}
        - {period: day, limit: 5, scope: tenant}     # per metadata/tag value
      prices: {my-model: [0.00000015, 0.0000006]}    # dollars per input, output token
      unknown_model: error                # or zero, or [input, output]

The keys mirror :class:`CostGuard`'s constructor; what a file cannot hold (``on_alert``, ``now``,
``token_counter``, ``price_resolver``) is passed to :func:`cost_guard_from_config` in Python.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llm_resilience_plugin._problems import Problem, field_path, pydantic_problems, raise_errors
from llm_resilience_plugin.cost._alerts import BudgetAlert
from llm_resilience_plugin.cost._budgets import Budget
from llm_resilience_plugin.cost._guard import CostGuard
from llm_resilience_plugin.cost._ledger import Ledger
from llm_resilience_plugin.errors import ConfigError

PriceEntry = list[float] | dict[str, float]


class _Strict(BaseModel):
    """Strict like the policy: ``"5"`` or ``true`` is not a number of dollars, NaN not a limit."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class BudgetConfig(_Strict):
    """One budget: ``limit`` dollars per ``period`` (per value of ``scope``, when set)."""

    limit: float = Field(gt=0, description="Dollars.")
    period: Literal["request", "run", "day", "month", "total"]
    scope: str | None = Field(default=None, min_length=1, description="A metadata/tag key, e.g. tenant.")
    name: str = ""

    def budget(self) -> Budget:
        """The :class:`Budget` this entry describes."""
        return Budget(self.limit, self.period, self.scope, self.name)


class CostConfig(_Strict):
    """The ``cost:`` section: the arguments of :class:`CostGuard` a config file can hold."""

    budgets: list[BudgetConfig] = Field(default_factory=list)
    ledger: str = Field(default="memory", min_length=1)
    alert_at: float | list[float] | None = 0.8
    timezone: str = "UTC"
    prices: dict[str, PriceEntry] = Field(default_factory=dict)
    unknown_model: Literal["error", "zero"] | PriceEntry = "error"
    models: list[str] = Field(default_factory=list)
    default_max_tokens: int | None = Field(default=None, ge=1)
    prompt_margin: float = Field(default=0.1, ge=0)
    reservation_ttl: float = Field(default=900.0, gt=0)
    on_cancel: Literal["estimate", "release"] = "estimate"

    def guard_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :class:`CostGuard` (the ledger, as given, included)."""
        return {
            "budgets": [b.budget() for b in self.budgets],
            "ledger": self.ledger,
            "alert_at": self.alert_at,
            "timezone": self.timezone,
            "prices": {k: _price(v) for k, v in self.prices.items()},
            "unknown_model": _price(self.unknown_model),
            "models": list(self.models),
            "default_max_tokens": self.default_max_tokens,
            "prompt_margin": self.prompt_margin,
            "reservation_ttl": self.reservation_ttl,
            "on_cancel": self.on_cancel,
        }


def _price(value: Any) -> Any:
    """A YAML ``[input, output]`` pair as the tuple the price book takes; anything else as is."""
    return tuple(value) if isinstance(value, list) else value


def ledger_problem(url: str) -> str | None:
    """What is wrong with a ledger URL, without opening it (so checking a config creates nothing)."""
    if url in ("memory", "memory://", ":memory:") or url.startswith(("redis://", "rediss://", "unix://")):
        return None
    path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else None
    if path is None and url.endswith((".db", ".sqlite", ".sqlite3")):
        path = url
    if path is None:
        return "expected memory, sqlite:///path/to/spend.db or redis://host:6379/0"
    parent = Path(path).expanduser().parent
    if not parent.is_dir():
        return f"the ledger's folder {parent} does not exist"
    if os.path.isdir(path):
        return f"{path} is a folder, not a ledger file"
    return None


def cost_config_problems(section: Any, prefix: str = "cost") -> list[Problem]:
    """Every problem of a ``cost:`` section, all at once (nothing is opened or created)."""
    if not isinstance(section, Mapping):
        return [Problem(prefix, f"expected a mapping, got {type(section).__name__}")]
    problems: list[Problem] = []
    try:
        CostConfig.model_validate(dict(section))
    except ValidationError as e:
        problems += pydantic_problems(e, prefix, section, CostConfig)
    bad = {p.field for p in problems}

    def clean(field: str) -> bool:
        return not any(f == field or f.startswith((f"{field}.", f"{field}[")) for f in bad)

    budgets = section.get("budgets")
    names: set[str] = set()
    for i, entry in enumerate(budgets if isinstance(budgets, list) else []):
        where = field_path(prefix, "budgets", i)
        if not clean(where):
            continue
        try:
            name = BudgetConfig.model_validate(entry).budget().name
        except ConfigError as e:
            problems.append(Problem(f"{where}.{e.field.removeprefix('Budget.')}", e.message))
            continue
        if name in names:
            problems.append(Problem(where, f"two budgets are named {name!r}; give one of them another name"))
        names.add(name)
    ledger = section.get("ledger", "memory")
    reason = ledger_problem(ledger) if isinstance(ledger, str) and clean(f"{prefix}.ledger") else None
    if reason is not None:
        problems.append(Problem(f"{prefix}.ledger", reason))
    # Timezone, alert thresholds and prices: the guard's own checks, each on its own, on memory.
    for keys in (("timezone",), ("alert_at",), ("prices", "unknown_model")):
        given = {k: _price(section[k]) for k in keys if k in section and clean(f"{prefix}.{k}")}
        if "prices" in given:
            given["prices"] = {k: _price(v) for k, v in given["prices"].items()}
        try:
            if given:
                CostGuard(**given).close()
        except ConfigError as e:
            problems.append(Problem(f"{prefix}.{e.field}", e.message))
    return problems


def cost_guard_from_config(
    section: Mapping[str, Any],
    *,
    ledger: Ledger | str | None = None,
    on_alert: Callable[[BudgetAlert], Any] | None = None,
    now: Callable[[], float | datetime] | None = None,
    **guard_kwargs: Any,
) -> CostGuard:
    """A :class:`CostGuard` from a ``cost:`` section (``ConfigError`` naming ``cost.<field>``).

    ``ledger`` overrides the section's; ``on_alert``, ``now`` and any other keyword of
    :class:`CostGuard` (``token_counter``, ``price_resolver``, ...) are passed through.
    """
    raise_errors(cost_config_problems(section))
    kwargs = CostConfig.model_validate(dict(section)).guard_kwargs()
    if ledger is not None:
        kwargs["ledger"] = ledger
    return CostGuard(**kwargs, on_alert=on_alert, now=now, **guard_kwargs)
