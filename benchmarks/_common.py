"""Helpers the benchmark scripts share: percentiles and JSON output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def pct(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def write_json(path: str, data: dict[str, Any]) -> Path:
    """Write ``data`` as indented JSON to ``path`` (parents created); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2, default=str))
    return out
