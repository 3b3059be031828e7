"""The public surface is what ``__all__`` says it is, in the package and in every subpackage.

Like httpx's ``tests/test_exported_members.py``: a name added to a lazy-export table but not to
``__all__`` (or the reverse), or a name that does not resolve, fails here.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import llm_resilience_plugin

SUBPACKAGES = [
    "llm_resilience_plugin.cost",
    "llm_resilience_plugin.langchain",
    "llm_resilience_plugin.observability",
    "llm_resilience_plugin.routing",
    "llm_resilience_plugin.shared_state",
    "llm_resilience_plugin.testing",
]


def test_top_level_all_is_the_lazy_export_table() -> None:
    exports = llm_resilience_plugin._EXPORTS
    assert sorted(llm_resilience_plugin.__all__) == sorted(exports)
    assert len(llm_resilience_plugin.__all__) <= 15, "keep the top level small; use a subpackage"
    for name in llm_resilience_plugin.__all__:
        value = getattr(llm_resilience_plugin, name)
        defined_in = importlib.import_module(f"llm_resilience_plugin.{exports[name]}")
        assert getattr(defined_in, name) is value


def test_type_checking_block_names_exactly_the_exports() -> None:
    """Type checkers read the TYPE_CHECKING imports; they must name the same things."""
    tree = ast.parse(Path(llm_resilience_plugin.__file__).read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom)
                for alias in imp.names:
                    names.add(alias.asname or alias.name)
                    module = imp.module.removeprefix("llm_resilience_plugin.")  # type: ignore[union-attr]
                    assert llm_resilience_plugin._EXPORTS[alias.name] == module
    assert names == set(llm_resilience_plugin.__all__)


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        _ = llm_resilience_plugin.NotAThing  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", SUBPACKAGES)
def test_subpackage_exports_what_it_lists(name: str) -> None:
    module = importlib.import_module(name)
    public = {n for n, v in vars(module).items() if not n.startswith("_") and not isinstance(v, type(ast))}
    assert sorted(module.__all__) == sorted(set(module.__all__)), "duplicates in __all__"
    for n in module.__all__:
        assert hasattr(module, n), f"{name}.__all__ names {n!r}, which it does not define"
    # Everything it imports for users is listed (modules such as `annotations` are not names).
    public.discard("annotations")
    assert public == set(module.__all__), f"{name}: listed {sorted(module.__all__)} exposes {sorted(public)}"


def test_package_is_typed() -> None:
    assert (Path(llm_resilience_plugin.__file__).parent / "py.typed").is_file()
