"""The README stays small and names every install extra ``pyproject.toml`` declares."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_lists_every_extra_and_stays_short() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    table = readme.split("| extra | what it adds |", 1)[1].split("\n\n", 1)[0]
    listed = set(re.findall(r"^\| `([a-z0-9-]+)` \|", table, flags=re.MULTILINE))
    assert listed == set(extras)
    assert len(readme.splitlines()) <= 200
