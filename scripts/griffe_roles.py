"""A griffe extension for the docs build: Sphinx roles in docstrings (:class:`~a.b.C`, :meth:`close`,
:mod:`._engine.retry`, ...) become cross-references mkdocstrings resolves, at render time.

The docstrings keep their reST roles (they read well in an editor and in ``help()``); the site shows
each as a link when the object is rendered somewhere in the API reference, else as plain code (an
*optional* autoref: an unresolved one is no warning, so ``mkdocs build --strict`` stays clean).
Loaded by ``mkdocs.yml`` (``plugins: mkdocstrings: handlers: python: options: extensions:``).
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(class|meth|func|data|mod|attr|exc|obj|const):`(?P<target>[^`]+)`")
CALLABLE_ROLES = {"meth", "func"}


def _relative(scope: griffe.Object, target: str) -> str:
    """``.x`` / ``..x`` as in a relative import from the module that holds ``scope``."""
    module = scope if scope.is_module else scope.module
    dots = len(target) - len(target.lstrip("."))
    base = module if module.is_package else module.parent
    for _ in range(dots - 1):
        base = base.parent if base is not None and base.parent is not None else base
    rest = target.lstrip(".")
    return f"{base.path}.{rest}" if base is not None and rest else (base.path if base else rest)


def _resolve(scope: griffe.Object, target: str, collection: griffe.ModulesCollection) -> str | None:
    """The canonical path ``target`` names from ``scope`` (members, imports, parents), or None."""
    candidates: list[str] = []
    if target.startswith("."):
        candidates.append(_relative(scope, target))
    else:
        node: griffe.Object | None = scope
        head = target.split(".", 1)[0]
        while node is not None:
            try:
                resolved = node.resolve(head)
            except Exception:  # griffe.NameResolutionError, alias errors
                resolved = None
            if resolved:
                candidates.append(resolved + target[len(head) :])
                break
            node = node.parent
        candidates.append(target)
        package = scope.package.path
        candidates.append(f"{package}.{target}")
    for path in candidates:
        try:
            obj = collection.get_member(path)
            return obj.canonical_path if not obj.is_alias else obj.final_target.path
        except Exception:  # not found, or an alias that does not resolve
            continue
    return None


def convert(text: str, scope: griffe.Object, collection: griffe.ModulesCollection) -> str:
    """``text`` with each role replaced by an optional autoref (plain code when unresolved)."""

    def one(match: re.Match[str]) -> str:
        role, raw = match.group(1), match.group("target").strip()
        short = raw.startswith("~")
        name = raw.lstrip("~")
        title = name.rsplit(".", 1)[-1] if short or name.startswith(".") else name
        if role in CALLABLE_ROLES and not title.endswith(")"):
            title += "()"
        path = _resolve(scope, name, collection)
        code = f"<code>{html.escape(title)}</code>"
        if path is None:
            return code
        return f'<autoref identifier="{html.escape(path)}" optional>{code}</autoref>'

    return ROLE.sub(one, text)


class ReSTRoles(griffe.Extension):
    """Rewrite every docstring of the loaded package once it is fully loaded."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        collection = loader.modules_collection
        seen: set[int] = set()

        def walk(obj: griffe.Object) -> None:
            if id(obj) in seen:
                return
            seen.add(id(obj))
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = convert(obj.docstring.value, obj, collection)
            for member in list(obj.members.values()):
                if not member.is_alias:
                    walk(member)  # type: ignore[arg-type]

        walk(pkg)
