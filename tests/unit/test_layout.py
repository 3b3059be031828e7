"""The code keeps the shape the redesign gave it: small files and classes, private by default,
no module reaching into another module's private names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import llm_resilience_plugin

PACKAGE = Path(llm_resilience_plugin.__file__).parent
SOURCES = sorted(PACKAGE.rglob("*.py"))
MAX_FILE_LINES = 700
MAX_CLASS_LINES = 400


def _module_exists(dotted: str) -> bool:
    path = PACKAGE.parent / dotted.replace(".", "/")
    return path.with_suffix(".py").is_file() or path.is_dir()


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_another_modules_private_names(path: Path) -> None:
    tree = ast.parse(path.read_text())
    offenders = [
        f"line {node.lineno}: {a.name} from {node.module}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("llm_resilience_plugin")
        for a in node.names
        if a.name.startswith("_")
        and not a.name.startswith("__")
        and not _module_exists(f"{node.module}.{a.name}")
    ]
    assert not offenders, "give the name a public spelling in its (private) module instead"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_files_and_classes_stay_small(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_FILE_LINES, "split the module by concern"
    big = [
        (node.name, node.end_lineno - node.lineno + 1)  # type: ignore[operator]
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES  # type: ignore[operator]
    ]
    assert not big, f"classes over {MAX_CLASS_LINES} lines: {big}"
