"""Structured replies: a deterministic JSON-schema faker, tool-call arguments, JSON-mode text.

Numbers and quoted phrases in the user's message feed the generated values, so tests can steer
a tool call's arguments from the prompt.
"""

from __future__ import annotations

import json
import math
import re
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from llm_resilience_plugin.testing._messages import JSONDict, content_text, default_text, last_text

__all__ = ["pick_tool", "structured_text", "tool_arguments"]

_NUMBER_RE = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")
_QUOTED_KEY_RE = re.compile(r"(?<!\w)([\"'`])([A-Za-z_][A-Za-z0-9_\-]{0,63})\1(?!\w)")
_QUOTED_PHRASE_RE = re.compile(r"(?<!\w)([\"'`])([^\"'`\n]{1,200}?)\1(?!\w)")
_MAX_SCHEMA_DEPTH = 12


def _quoted(text: str) -> list[str]:
    return [m.group(2) for m in _QUOTED_PHRASE_RE.finditer(text)]


def _numbers(text: str) -> list[float]:
    return [float(m) for m in _NUMBER_RE.findall(text)]


class _SchemaFaker:
    """Generates a deterministic instance of a JSON schema."""

    def __init__(
        self,
        root: Any,
        numbers: Sequence[float],
        name_strings: bool,
        strings: Sequence[str] = (),
    ) -> None:
        self._root = root
        self._numbers = deque(numbers)
        self._strings = deque(strings)
        self._name_strings = name_strings

    def generate(self, schema: Any, name: str = "", depth: int = 0) -> Any:
        """An instance of ``schema``; ``name`` is the property it fills (for ``example <name>``)."""
        if depth > _MAX_SCHEMA_DEPTH or not isinstance(schema, dict):
            return None if depth > _MAX_SCHEMA_DEPTH else self._string({}, name)
        if isinstance(schema.get("$ref"), str):
            target = self._resolve(schema["$ref"])
            extra = {k: v for k, v in schema.items() if k != "$ref"}
            return self.generate({**target, **extra}, name, depth + 1)
        if "const" in schema:
            return schema["const"]
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return next((v for v in enum if v is not None), enum[0])
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and branches:
                branch = next((b for b in branches if not _is_null_schema(b)), branches[0])
                return self.generate(branch, name, depth + 1)
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and all_of:
            merged: JSONDict = {k: v for k, v in schema.items() if k != "allOf"}
            for branch in all_of:
                resolved = self._deref(branch)
                props = {**merged.get("properties", {}), **resolved.get("properties", {})}
                merged = {**resolved, **merged}
                if props:
                    merged["properties"] = props
            return self.generate(merged, name, depth + 1)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind is None:
            if "properties" in schema:
                kind = "object"
            elif "items" in schema or "prefixItems" in schema:
                kind = "array"
        if kind == "object":
            properties = schema.get("properties")
            if not isinstance(properties, dict):
                return {}
            return {str(k): self.generate(v, str(k), depth + 1) for k, v in properties.items()}
        if kind == "array":
            prefix = schema.get("prefixItems")
            if isinstance(prefix, list) and prefix:
                return [self.generate(p, name, depth + 1) for p in prefix]
            min_items = schema.get("minItems", 0)
            count = min_items if isinstance(min_items, int) and min_items > 0 else 0
            return [self.generate(schema.get("items", {}), name, depth + 1) for _ in range(count)]
        if kind == "integer":
            value = int(self._numbers.popleft()) if self._numbers else 1
            return int(_clamp(value, schema, integer=True))
        if kind == "number":
            number = self._numbers.popleft() if self._numbers else 1.0
            return float(_clamp(number, schema, integer=False))
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        return self._string(schema, name)

    def _string(self, schema: JSONDict, name: str) -> str:
        formats = {
            "date-time": "2024-01-01T00:00:00Z",
            "date": "2024-01-01",
            "time": "12:00:00",
            "email": "user@example.com",
            "uri": "https://example.com",
            "url": "https://example.com",
            "uuid": "00000000-0000-4000-8000-000000000000",
        }
        fmt = schema.get("format")
        if isinstance(fmt, str) and fmt in formats:
            return formats[fmt]
        if self._strings:
            value = self._strings.popleft()
        else:
            value = f"example {name}" if self._name_strings and name else "example"
        min_len = schema.get("minLength")
        if isinstance(min_len, int) and len(value) < min_len:
            value = value + "x" * (min_len - len(value))
        max_len = schema.get("maxLength")
        if isinstance(max_len, int) and len(value) > max_len:
            value = value[: max(max_len, 0)]
        return value

    def _deref(self, schema: Any) -> JSONDict:
        for _ in range(_MAX_SCHEMA_DEPTH):
            if not isinstance(schema, dict):
                return {}
            ref = schema.get("$ref")
            if not isinstance(ref, str):
                return schema
            schema = self._resolve(ref)
        return {}

    def _resolve(self, ref: str) -> JSONDict:
        if not ref.startswith("#"):
            return {}
        node: Any = self._root
        for raw in ref[1:].split("/"):
            if not raw:
                continue
            key = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and key in node:
                node = node[key]
            else:
                return {}
        return node if isinstance(node, dict) else {}


def _is_null_schema(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "null"


def _clamp(value: float, schema: JSONDict, *, integer: bool) -> float:
    step = 1 if integer else 1e-9
    low = schema.get("minimum")
    if isinstance(low, (int, float)) and value < low:
        value = math.ceil(low) if integer else low
    xlow = schema.get("exclusiveMinimum")
    if isinstance(xlow, (int, float)) and not isinstance(xlow, bool) and value <= xlow:
        value = math.floor(xlow) + 1 if integer else xlow + step
    high = schema.get("maximum")
    if isinstance(high, (int, float)) and value > high:
        value = math.floor(high) if integer else high
    xhigh = schema.get("exclusiveMaximum")
    if isinstance(xhigh, (int, float)) and not isinstance(xhigh, bool) and value >= xhigh:
        value = math.ceil(xhigh) - 1 if integer else xhigh - step
    return value


def pick_tool(tools: Any, tool_choice: Any, text: str) -> JSONDict | None:
    """The function to call: ``tool_choice``'s, else the first named in ``text``, else the first."""
    if tool_choice == "none" or not isinstance(tools, list):
        return None
    functions = [
        t["function"]
        for t in tools
        if isinstance(t, dict)
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
    ]
    if not functions:
        return None
    if isinstance(tool_choice, dict):
        chosen = tool_choice.get("function")
        wanted = chosen.get("name") if isinstance(chosen, dict) else tool_choice.get("name")
        for function in functions:
            if function["name"] == wanted:
                return function
    lowered = text.lower()
    best: tuple[int, int] | None = None
    best_function: JSONDict | None = None
    for function in functions:
        position = lowered.find(function["name"].lower())
        if position >= 0:
            key = (position, -len(function["name"]))
            if best is None or key < best:
                best, best_function = key, function
    return best_function if best_function is not None else functions[0]


def tool_arguments(function: JSONDict, user_text: str) -> str:
    """JSON arguments for a call to ``function``, generated from its ``parameters`` schema."""
    params = function.get("parameters") or {"type": "object", "properties": {}}
    faker = _SchemaFaker(params, _numbers(user_text), name_strings=False, strings=_quoted(user_text))
    args = faker.generate(params)
    if not isinstance(args, dict):
        args = {}
    return json.dumps(args, ensure_ascii=False)


def _json_object_reply(messages: Sequence[Any], answer: str) -> JSONDict:
    texts = [
        content_text(m.get("content"))[0]
        for m in messages
        if isinstance(m, dict) and m.get("role") in ("system", "developer")
    ]
    texts.append(last_text(messages, "user"))
    keys: dict[str, None] = {}
    for text in texts:
        for match in _QUOTED_KEY_RE.finditer(text):
            keys.setdefault(match.group(2))
    if not keys:
        return {"answer": answer}
    return {key: f"example {key}" for key in keys}


def structured_text(body: Mapping[str, Any], messages: Sequence[Any], user_text: str) -> str | None:
    """The JSON reply ``response_format`` asks for (``json_schema`` / ``json_object``), else None."""
    response_format = body.get("response_format")
    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            schema = {"type": "object", "properties": {}}
        faker = _SchemaFaker(schema, _numbers(user_text), name_strings=True)
        return json.dumps(faker.generate(schema, "answer"), ensure_ascii=False)
    if kind == "json_object":
        reply = _json_object_reply(messages, default_text("simulator", user_text))
        return json.dumps(reply, ensure_ascii=False)
    return None
