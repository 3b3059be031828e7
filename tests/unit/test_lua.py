"""One Lua loader serves shared_state and the cost ledger; the ledger loads its scripts without
shared_state (and so without redis-py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import llm_resilience_plugin
from llm_resilience_plugin._lua import read_lua

ROOT = str(Path(llm_resilience_plugin.__file__).parent.parent)


def test_read_lua_joins_the_named_scripts_of_a_package() -> None:
    folder = Path(llm_resilience_plugin.__file__).parent / "cost" / "lua"
    names = ("ledger_lib.lua", "reserve.lua")
    text = read_lua("llm_resilience_plugin.cost", *names)
    assert text == "\n".join((folder / n).read_text(encoding="utf-8") for n in names)
    assert read_lua("llm_resilience_plugin.shared_state", "bucket.lua").strip()


CHILD = r"""
import sys
sys.path.insert(0, sys.argv[1])
sys.modules["redis"] = None  # as if the redis extra were not installed
from llm_resilience_plugin.cost._redis_ledger import LEDGER_SCRIPTS
assert set(LEDGER_SCRIPTS) == {"ledger_reserve", "ledger_settle", "ledger_release", "ledger_prune"}
assert "llm_resilience_plugin.shared_state" not in sys.modules
"""


def test_the_redis_ledger_loads_its_scripts_without_redis_py() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD, ROOT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
