"""The public surface is what ``__all__`` says it is, in the package and in every subpackage.

Like httpx's ``tests/test_exported_members.py``: a name added to a lazy-export table but not to
``__all__`` (or the reverse), or a name that does not resolve, fails here.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

import llm_resilience_plugin

SUBPACKAGES = [
    "llm_resilience_plugin.cost",
    "llm_resilience_plugin.langchain",
    "llm_resilience_plugin.observability",
    "llm_resilience_plugin.policy",
    "llm_resilience_plugin.routing",
    "llm_resilience_plugin.shared_state",
    "llm_resilience_plugin.testing",
]

# Public modules that also hold helpers for the package: __all__ is their surface, not every name.
MODULES = ["llm_resilience_plugin.errors", "llm_resilience_plugin.events"]
ROOT = Path(llm_resilience_plugin.__file__).parent.parent


def _export_table() -> dict[str, str]:
    """The lazy-export table (name -> module) as ``__init__.py`` spells it: read from the source,
    like the TYPE_CHECKING block below, not from the module's private attribute."""
    for node in ast.parse(Path(llm_resilience_plugin.__file__).read_text()).body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "_EXPORTS":
            table = ast.literal_eval(node.value)  # type: ignore[arg-type]
            assert isinstance(table, dict)
            return table
    raise AssertionError("llm_resilience_plugin/__init__.py has no export table")


def test_top_level_all_is_the_lazy_export_table() -> None:
    exports = _export_table()
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
    exports = _export_table()
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom)
                for alias in imp.names:
                    names.add(alias.asname or alias.name)
                    module = imp.module.removeprefix("llm_resilience_plugin.")  # type: ignore[union-attr]
                    assert exports[alias.name] == module
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


def _defined_at_module_level(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


@pytest.mark.parametrize("name", MODULES)
def test_module_all_lists_only_its_own_public_names(name: str) -> None:
    module = importlib.import_module(name)
    assert sorted(module.__all__) == sorted(set(module.__all__)), "duplicates in __all__"
    own = _defined_at_module_level(Path(module.__file__))  # type: ignore[arg-type]
    for n in module.__all__:
        assert hasattr(module, n), f"{name}.__all__ names {n!r}, which it does not define"
        assert n in own and not n.startswith("_"), f"{name}.__all__ names {n!r}, imported from elsewhere"
    assert "logger" not in module.__all__ and "dataclass" not in module.__all__


def test_docs_import_only_listed_names() -> None:
    """What the README and docs/ import from a public module is in that module's ``__all__``."""
    pattern = re.compile(r"from (llm_resilience_plugin(?:\.\w+)*) import (\([^)]*\)|[^\n]+)")
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    unlisted = []
    for page in pages:
        for module_name, imported in pattern.findall(page.read_text(encoding="utf-8")):
            if any(part.startswith("_") for part in module_name.split(".")):
                continue
            module = importlib.import_module(module_name)
            for item in imported.strip("()").replace("\n", ",").split(","):
                n = item.split("#")[0].split(" as ")[0].strip()
                if not n or n in module.__all__:
                    continue
                if not (hasattr(module, "__path__") and importlib.util.find_spec(f"{module_name}.{n}")):
                    unlisted.append(f"{page.name}: {n} from {module_name}")
    assert not unlisted


def test_package_is_typed() -> None:
    assert (Path(llm_resilience_plugin.__file__).parent / "py.typed").is_file()


def test_version_comes_from_the_installed_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    assert llm_resilience_plugin.__version__ == importlib.metadata.version("llm-resilience-plugin")

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    monkeypatch.delattr(llm_resilience_plugin, "__version__")  # forget the value read above
    assert llm_resilience_plugin.__version__ == "0+unknown"  # a source tree without metadata
