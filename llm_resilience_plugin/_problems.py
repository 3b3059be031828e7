"""Configuration problems: each one found, with the field it is in and the fix, then raised (the
first, naming the others) or listed all at once (``llm-resilience check``).

Below every layer (like ``_redaction``): the policy and the cost section both report through it.
"""

from __future__ import annotations

import difflib
import math
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from llm_resilience_plugin.errors import ConfigError, ErrorClass


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong (``error``) or suspicious (``warning``) in a config: where, and the fix."""

    field: str
    message: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class ConfigProblems(ConfigError):
    """A config with several errors: ``field``/``message`` are the first's, ``problems`` all of them."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        first, rest = self.problems[0], self.problems[1:]
        more = f" (and {len(rest)} more: {', '.join(p.field for p in rest)})" if rest else ""
        super().__init__(first.field, first.message + more)


def raise_errors(problems: Sequence[Problem]) -> None:
    """Raise :class:`ConfigProblems` if any of ``problems`` is an error (warnings pass)."""
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise ConfigProblems(errors)


def closest(name: str, candidates: Sequence[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``candidates`` to a misspelt ``name``, or ``""``."""
    match = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


def _unwrap(tp: Any) -> Any:
    """The model class inside ``Annotated``/``Optional``/unions, else ``tp``."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    if get_origin(tp) in (Union, types.UnionType):
        models = [a for a in get_args(tp) if isinstance(a, type) and issubclass(a, BaseModel)]
        return models[0] if models else tp
    return tp


def _fields_at(model: Any, path: Sequence[Any]) -> list[str]:
    """The field names of the model reached by following ``path`` (field names, dict keys) from
    ``model``, or [] when the path does not lead to a model."""
    cur = model
    for part in path:
        cur = _unwrap(cur)
        if isinstance(cur, type) and issubclass(cur, BaseModel):
            field = cur.model_fields.get(str(part))
            if field is None:
                return []
            cur = field.annotation
        elif get_origin(cur) is dict:
            cur = get_args(cur)[1]
        else:
            return []
    cur = _unwrap(cur)
    return list(cur.model_fields) if isinstance(cur, type) and issubclass(cur, BaseModel) else []


def field_path(prefix: str, *parts: Any) -> str:
    """``prefix.a.b[0].c``: dotted keys, list indexes in brackets."""
    out = prefix
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


_MAX_DEPTH = 64  # no config nests deeper; a YAML that does is refused, not recursed into


def shape_problems(value: Any, field: str) -> list[Problem]:
    """What no config can mean, found before anything walks it: a mapping or list containing
    itself (a recursive YAML alias: ``RecursionError`` later), nesting deeper than any config
    needs, a number that is not finite (``.nan``, ``.inf``: silently ignored or refused later)."""
    problems: list[Problem] = []
    on_path: set[int] = set()

    def walk(v: Any, where: str, depth: int) -> None:
        if isinstance(v, float) and not math.isfinite(v):
            problems.append(Problem(where, f"is {v!r}: give a finite number, or leave the field out"))
        elif isinstance(v, Mapping | list | tuple):
            if id(v) in on_path:
                problems.append(
                    Problem(where, "contains itself (a recursive YAML alias): write the value out")
                )
                return
            if depth >= _MAX_DEPTH:
                problems.append(Problem(where, f"nests deeper than {_MAX_DEPTH} levels"))
                return
            on_path.add(id(v))
            for k, x in v.items() if isinstance(v, Mapping) else enumerate(v):
                walk(x, field_path(where, k), depth + 1)
            on_path.discard(id(v))

    walk(value, field, 0)
    return problems


def _where(loc: Sequence[Any], data: Any) -> list[Any]:
    """The part of a pydantic error location that exists in the user's ``data`` (union member
    and ``[key]`` tags dropped)."""
    path: list[Any] = []
    for part in loc:
        if isinstance(data, Mapping) and part in data:
            data = data[part]
            path.append(str(part))
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
            path.append(part)
        else:
            break
    return path


_KINDS = {"float_type": "a valid number", "int_type": "a valid integer", "bool_type": "true or false"}


def _misread(value: bool | str) -> str:
    """Why a bool or a string is not taken for a number or a flag, and what to write instead."""
    if isinstance(value, bool):
        return " (true/false is not a number: write the number)"
    try:
        float(value)
    except ValueError:
        return ""
    return f" (a string: write {value} without quotes)"


def pydantic_problems(err: ValidationError, prefix: str, data: Any, model: type[BaseModel]) -> list[Problem]:
    """Every error of ``err`` as a :class:`Problem` under ``prefix``, one per field, with the fix:
    the closest field name for a misspelt one, what to write instead of a quoted number or a bool."""
    found: dict[str, list[str]] = {}
    for e in err.errors():
        loc = [p for p in e["loc"] if p != "__root__"]
        path = _where(loc, data)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "missing" and loc:
            path.append(str(loc[-1]))
            msg = "is required"
        elif e["type"] == "extra_forbidden":
            known = _fields_at(model, loc[:-1])
            msg = "unknown field" + (closest(str(loc[-1]), known) or f"; known fields: {', '.join(known)}")
            if loc == ["budgets"] and prefix == "resilience":
                msg = "unknown field; budgets belong in the top-level cost: section (cost: {budgets: [...]})"
        elif e["type"] == "enum" and loc and loc[-1] == "[key]":
            msg = f"unknown error class; expected one of {', '.join(c.value for c in ErrorClass)}"
            msg += closest(str(loc[-2]), [c.value for c in ErrorClass])
        elif e["type"] in _KINDS and isinstance(e["input"], bool | str):
            msg = f"Input should be {_KINDS[e['type']]}, got {e['input']!r}" + _misread(e["input"])
        found.setdefault(field_path(prefix, *path) or "config", []).append(msg)
    out = []
    for field, msgs in found.items():
        first, *rest = dict.fromkeys(msgs)
        out.append(Problem(field, first + "".join(" or " + m.removeprefix("Input should be ") for m in rest)))
    return out


def cycles(graph: Mapping[str, list[str]]) -> list[list[str]]:
    """Each cycle of ``graph`` once, as ``[a, b, a]`` starting from its smallest name."""
    found: dict[tuple[str, ...], list[str]] = {}

    def walk(node: str, path: list[str]) -> None:
        for nxt in graph.get(node, []):
            if nxt in path:
                cycle = path[path.index(nxt) :]
                start = cycle.index(min(cycle))
                ring = cycle[start:] + cycle[:start]
                found.setdefault(tuple(ring), [*ring, ring[0]])
            elif len(path) < 50:
                walk(nxt, [*path, nxt])

    for src in graph:
        walk(src, [src])
    return list(found.values())


def model_list_problems(model_list: Any) -> tuple[list[str], list[Problem]]:
    """The group names of a ``model_list`` and what is wrong with its entries."""
    problems: list[Problem] = []
    if not isinstance(model_list, list) or not model_list:
        return [], [Problem("model_list", "expected a non-empty list of deployments")]
    groups: dict[str, None] = {}
    ids: dict[str, int] = {}
    for i, d in enumerate(model_list):
        where = f"model_list[{i}]"
        if not isinstance(d, Mapping):
            problems.append(Problem(where, "must be a mapping with model_name and litellm_params"))
            continue
        unknown = set(d) - {"model_name", "litellm_params", "model_info"}
        for key in sorted(map(str, unknown)):
            hint = closest(key, ["model_name", "litellm_params", "model_info"])
            problems.append(Problem(f"{where}.{key}", "unknown deployment key" + hint))
        if not isinstance(d.get("model_name"), str) or not d["model_name"]:
            problems.append(Problem(f"{where}.model_name", "is required (the model group name)"))
        else:
            groups.setdefault(d["model_name"], None)
        params = d.get("litellm_params")
        if not isinstance(params, Mapping) or not isinstance(params.get("model"), str):
            problems.append(
                Problem(f"{where}.litellm_params.model", "is required, e.g. 'openai/gpt-4o-mini'")
            )
        info = d.get("model_info")
        if info is not None and not isinstance(info, Mapping):
            problems.append(Problem(f"{where}.model_info", "must be a mapping"))
        elif info and info.get("id") is not None:
            dep_id = str(info["id"])
            if dep_id in ids:
                problems.append(
                    Problem("model_list", f"model_info.id must be unique, repeated: [{dep_id!r}]")
                )
            ids[dep_id] = i
    return list(groups), problems
