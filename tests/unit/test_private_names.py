"""No module of the package uses another module's private (``_name``) attributes.

test_layout.py refuses ``from x import _name``; this test covers the other spellings:
``obj._name``, ``self._name`` and ``getattr(obj, "_name")``, including ``module._name`` and a
mixin reaching into its host (or a subclass into a base class in another module).

The heuristic, per file: a private attribute may be read only if the same file defines that name
- a ``def``/``class`` of that name, an assignment to ``x._name`` or to a plain ``_name`` (module or
class level). What does not define it: a bare annotation (``_name: T``) and anything under ``if
TYPE_CHECKING:`` (a stub of another module's private is exactly the use this test refuses).
It cannot tell two same-named attributes of different classes apart; it catches the common case,
a name whose only definition is elsewhere. Dunder names are public by convention.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import llm_resilience_plugin

PACKAGE = Path(llm_resilience_plugin.__file__).parent
SOURCES = sorted(PACKAGE.rglob("*.py"))

# Third-party private names the package uses on purpose: (file, name) -> why.
ALLOWED: dict[tuple[str, str], str] = {
    ("langchain/_runnable.py", "_call_with_config"): "langchain-core's helper for Runnable subclasses",
    ("langchain/_runnable.py", "_acall_with_config"): "langchain-core's helper for Runnable subclasses",
    ("langchain/_runnable.py", "_transform_stream_with_config"): "langchain-core's Runnable helper",
    ("langchain/_runnable.py", "_atransform_stream_with_config"): "langchain-core's Runnable helper",
    ("routing/_direct_plan.py", "_shaping"): "litellm.Router's request shaping; no public accessor",
    ("routing/_sse_skip.py", "_iterator"): "openai.AsyncStream's generator: is the stream unread?",
    ("events.py", "_hidden_params"): "LiteLLM keeps cost and ids only there (read in hidden_params_of)",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _runtime_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node below ``node`` except the bodies of ``if TYPE_CHECKING:`` blocks."""
    for child in ast.iter_child_nodes(node):
        if _is_type_checking(child):
            assert isinstance(child, ast.If)
            for other in child.orelse:
                yield other
                yield from _runtime_nodes(other)
            continue
        yield child
        yield from _runtime_nodes(child)


def _defined_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    bare = {id(n.target) for n in _runtime_nodes(tree) if isinstance(n, ast.AnnAssign) and n.value is None}
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif id(node) in bare:
            continue  # `_x: T` declares a name; something else must define it
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def private_uses(source: str) -> list[tuple[int, str]]:
    """(line, name) of each private attribute ``source`` reads without defining it."""
    tree = ast.parse(source)
    defined = _defined_names(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        name: str | None = None
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            name = node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            name = node.args[1].value
        if name is not None and _private(name) and name not in defined:
            found.append((getattr(node, "lineno", 0), name))
    return sorted(set(found))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_uses_another_modules_private_attributes(path: Path) -> None:
    where = path.relative_to(PACKAGE).as_posix()
    uses = private_uses(path.read_text())
    offenders = [f"line {line}: {name}" for line, name in uses if (where, name) not in ALLOWED]
    assert not offenders, (
        f"{where} uses private names it does not define: {offenders}; give them a public name in "
        "their (private) module, or pass the object that owns them"
    )


def test_every_allowance_is_still_needed() -> None:
    used = {
        (path.relative_to(PACKAGE).as_posix(), name)
        for path in SOURCES
        for _, name in private_uses(path.read_text())
    }
    assert set(ALLOWED) <= used, f"no longer used, drop from ALLOWED: {sorted(set(ALLOWED) - used)}"


def test_the_heuristic_flags_a_mixin_reaching_into_its_host() -> None:
    """The shape the endpoints mixin had: stubs of the router's privates under TYPE_CHECKING."""
    mixin = (
        "from typing import TYPE_CHECKING\n"
        "class EndpointsMixin:\n"
        "    if TYPE_CHECKING:\n"
        "        _sync: object\n"
        "        def _check_group(self, group: str) -> None: ...\n"
        "    _host: object\n"
        "    def embedding(self, model):\n"
        "        self._check_group(model)\n"
        "        self._host.run()\n"
        "        return self._sync.run(model), self._memo, getattr(self, '_other')\n"
        "    def _memo(self): ...\n"
    )
    assert {name for _, name in private_uses(mixin)} == {"_check_group", "_host", "_sync", "_other"}


def test_the_heuristic_allows_a_files_own_private_names() -> None:
    own = (
        "_CACHE = {}\n"
        "class Box:\n"
        "    _slots = 1\n"
        "    def __init__(self):\n"
        "        self._items = []\n"
        "    def _add(self, other: 'Box'):\n"
        "        other._items.append(_CACHE)\n"
        "        return self._add, self.__class__, Box._slots\n"
    )
    assert private_uses(own) == []
