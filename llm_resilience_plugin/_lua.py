"""The Lua script loader the Redis-backed modules share (``shared_state/lua``, ``cost/lua``).

Below every layer and free of imports from the package, so the cost ledger can load its scripts
without importing ``shared_state`` (which needs redis-py)."""

from __future__ import annotations

from importlib import resources


def read_lua(package: str, *names: str) -> str:
    """The concatenated text of ``<package>/lua/<name>`` files (read once, at import)."""
    folder = resources.files(package) / "lua"
    return "\n".join((folder / name).read_text(encoding="utf-8") for name in names)


__all__ = ["read_lua"]
