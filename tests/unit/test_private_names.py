"""No module of the package uses another module's private (``_name``) attributes, and neither do
the tests and benchmarks.

test_layout.py refuses ``from x import _name``; this test covers the other spellings:
``obj._name``, ``self._name`` and ``getattr(obj, "_name")``, including ``module._name`` and a
mixin reaching into its host (or a subclass into a base class in another module).

The heuristic, per file: a private attribute may be read only if the same file defines that name
- a ``def``/``class`` of that name, an assignment to ``self._name``/``cls._name`` or to a plain
``_name`` (module or class level); writing ``obj._name`` on another object is a use, not a
definition. What does not define it: a bare annotation (``_name: T``) and anything under ``if
TYPE_CHECKING:`` (a stub of another module's private is exactly the use this test refuses).
It cannot tell two same-named attributes of different classes apart; it catches the common case,
a name whose only definition is elsewhere. Dunder names are public by convention.

tests/ and benchmarks/ may not use the package's private names either (``from
llm_resilience_plugin.x import _name``, ``obj._name`` read or written, ``getattr``/``setattr``/
``monkeypatch.setattr(obj, "_name")`` and dotted ``"llm_resilience_plugin.x._name"`` targets): a
white-box test goes through a public, documented view of what it checks. There a private name
counts only if the package defines it, and a file's own privates (its ``def``/``class``, module
or class names, ``self._name =``) are its own to use. Private modules (``_simulator``) are not
names: importing them is fine, as in test_layout.py.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import llm_resilience_plugin

PACKAGE = Path(llm_resilience_plugin.__file__).parent
SOURCES = sorted(PACKAGE.rglob("*.py"))
ROOT = PACKAGE.parent
OUTSIDE = sorted(path for folder in ("tests", "benchmarks") for path in (ROOT / folder).rglob("*.py"))

# Third-party private names the package uses on purpose: (file, name) -> why.
ALLOWED: dict[tuple[str, str], str] = {
    ("langchain/_runnable.py", "_call_with_config"): "langchain-core's helper for Runnable subclasses",
    ("langchain/_runnable.py", "_acall_with_config"): "langchain-core's helper for Runnable subclasses",
    ("langchain/_runnable.py", "_transform_stream_with_config"): "langchain-core's Runnable helper",
    ("langchain/_runnable.py", "_atransform_stream_with_config"): "langchain-core's Runnable helper",
    ("_engine/executor_wait.py", "_callbacks"): "asyncio.Future's callbacks: the one sign of a "
    "future tied to an executor's (run_in_executor); no public accessor",
    ("_engine/executor_wait.py", "_asyncio_future_blocking"): "asyncio's future protocol flag, set "
    "by Future.__await__ before yielding (the stand-in is yielded the same way)",
    # LiteLLM's and the openai SDK's privates: only in the seam (tests/unit/test_litellm_seam.py)
    ("_litellm.py", "_shaping"): "litellm.Router's request shaping; no public accessor",
    ("_litellm.py", "_should_fail_on_clean_eof"): "does LiteLLM fail a stream that ends without the "
    "provider's finish? (the eof_check capability's probe)",
    ("_litellm.py", "_iterator"): "openai.AsyncStream's generator: is the stream unread?",
    ("_litellm.py", "_hidden_params"): "LiteLLM keeps cost and ids only there (read in hidden_params_of)",
    ("_litellm.py", "_decoder"): "openai.AsyncStream's SSE decoder: swapped for the skipper "
    "before the first read; openai has no public hook for it",
}

# Outside the package (path from the repository root, name) -> why: names the package defines
# too, but that belong to a third-party object here.
OUTSIDE_ALLOWED: dict[tuple[str, str], str] = {
    ("tests/langchain/integration_tests/test_chat_model.py", "_get_ls_params"): "LangChain's "
    "BaseChatModel hook for LangSmith params (ResilientChatModel overrides it); no public accessor",
    ("tests/langchain/integration_tests/test_surface.py", "_get_llm_string"): "LangChain's "
    "BaseChatModel hook for the LLM cache key (ResilientChatModel overrides it); no public accessor",
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
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del) and _on_self(node):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _on_self(node: ast.Attribute) -> bool:
    """``self._x`` / ``cls._x``: an attribute of the file's own class (what a store defines)."""
    return isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")


def private_uses(source: str) -> list[tuple[int, str]]:
    """(line, name) of each private attribute ``source`` reads, or writes on another object,
    without defining it (writing ``obj._x`` is no definition: it sets another object's private)."""
    tree = ast.parse(source)
    defined = _defined_names(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        name: str | None = None
        if isinstance(node, ast.Attribute) and (isinstance(node.ctx, ast.Load) or not _on_self(node)):
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


def package_private_names() -> set[str]:
    """Every private name some module of the package defines."""
    return {n for path in SOURCES for n in _defined_names(ast.parse(path.read_text())) if _private(n)}


def _own_names(tree: ast.Module) -> set[str]:
    """What a test or benchmark file defines for itself: its functions and classes, module and
    class-level names, and attributes it assigns on ``self``/``cls`` (its own classes)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            names.add(node.attr)
    return names


def _is_module(dotted: str) -> bool:
    path = ROOT / dotted.replace(".", "/")
    return path.with_suffix(".py").is_file() or path.is_dir()


# Calls whose second argument names an attribute: the builtins, monkeypatch's, mock.patch.object.
ACCESSORS = ("getattr", "setattr", "hasattr", "delattr", "object")


def _called(func: ast.expr) -> str:
    """The name a call is spelled with: ``setattr`` in ``setattr(...)`` and ``monkeypatch.setattr(...)``."""
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else ""


def _string(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def outside_private_uses(source: str, package_names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each of the package's private names ``source`` (a test or benchmark)
    imports, reads, writes or patches without defining it itself."""
    tree = ast.parse(source)
    own = _own_names(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("llm_resilience_plugin"):
            names = [a.name for a in node.names if not _is_module(f"{node.module}.{a.name}")]
        elif isinstance(node, ast.Attribute):  # read or written
            names = [node.attr]
        elif isinstance(node, ast.Call) and node.args:
            attr = _string(node.args[1]) if len(node.args) > 1 else None
            if _called(node.func) in ACCESSORS and attr is not None:
                names.append(attr)
            target = _string(node.args[0])
            if target is not None and target.startswith("llm_resilience_plugin."):
                names.append(target.rsplit(".", 1)[-1])  # monkeypatch.setattr("pkg.mod._x", ...)
        for name in names:
            if _private(name) and name in package_names and name not in own:
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


@pytest.fixture(scope="module")
def package_names() -> set[str]:
    return package_private_names()


@pytest.mark.parametrize("path", OUTSIDE, ids=lambda p: str(p.relative_to(ROOT)))
def test_tests_and_benchmarks_use_no_private_name_of_the_package(path: Path, package_names: set[str]) -> None:
    where = path.relative_to(ROOT).as_posix()
    uses = outside_private_uses(path.read_text(), package_names)
    offenders = [f"line {line}: {name}" for line, name in uses if (where, name) not in OUTSIDE_ALLOWED]
    assert not offenders, (
        f"{where} uses the package's private names: {offenders}; give the package a public, "
        "documented view of what the test needs (a read-only property, a public function in the "
        "private module), or assert through public behaviour"
    )


def test_every_outside_allowance_is_still_needed(package_names: set[str]) -> None:
    used = {
        (path.relative_to(ROOT).as_posix(), name)
        for path in OUTSIDE
        for _, name in outside_private_uses(path.read_text(), package_names)
    }
    stale = sorted(set(OUTSIDE_ALLOWED) - used)
    assert not stale, f"no longer used, drop from OUTSIDE_ALLOWED: {stale}"


def test_the_outside_heuristic_flags_the_packages_privates_in_every_spelling() -> None:
    test = (
        "from llm_resilience_plugin.cost._guard import _secret\n"
        "from llm_resilience_plugin.testing import _simulator\n"  # a private module: fine
        "def test_it(monkeypatch, router, led):\n"
        "    router._router = object()\n"
        "    led._conn().execute('x')\n"
        "    monkeypatch.setattr(_simulator, '_wait', print)\n"
        "    monkeypatch.setattr('llm_resilience_plugin.x._clock', None)\n"
        "    return getattr(led, '_lock'), led._public_looking, router.engine\n"
    )
    package = {"_secret", "_router", "_conn", "_wait", "_clock", "_lock", "_simulator"}
    assert {name for _, name in outside_private_uses(test, package)} == {
        "_secret", "_router", "_conn", "_wait", "_clock", "_lock"
    }  # fmt: skip


def test_the_outside_heuristic_allows_a_test_files_own_privates() -> None:
    own = (
        "_CALLS = []\n"
        "class FakeLedger:\n"
        "    _kind = 'fake'\n"
        "    def __init__(self):\n"
        "        self._conn = None\n"
        "    def _reset(self, other: 'FakeLedger'):\n"
        "        other._conn = _CALLS\n"
        "        return self._conn, FakeLedger._kind, self._reset, os._exit\n"
    )
    assert outside_private_uses(own, {"_conn", "_kind", "_reset", "_CALLS"}) == []


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
