"""The documentation's examples run as written: every runnable Python block of README.md and docs/.

Convention: a fenced ```` ```python ```` block is executed unless its fence line says ``not run``
(written as ``title="... (not run)"``, which mkdocs-material shows above the block). Each runnable
block runs on its own as a script in its own process (forked from one that imported LiteLLM once,
see ``tests/_forked.py``; ``LLM_EXAMPLES_FRESH=1``: a fresh interpreter each), in an empty temporary
directory, with loopback kept away from proxies and a timeout; it must exit 0. Blocks start their own
``ProviderSimulator``, so they need no API key and no network. Blocks marked *not run* must still
compile, and YAML blocks must parse.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests._forked import run_script

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TIMEOUT_S = 100  # under pytest-timeout's 120 s per test, so this message is the one you see
NOT_RUN = "not run"
# Opening fence: indentation, three or more backticks or tildes, then the info string.
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language, its fence line's info string, its code."""

    path: Path
    line: int
    lang: str
    info: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.lang in ("python", "py") and NOT_RUN not in self.info


def blocks_of(path: Path) -> list[Block]:
    """The fenced code blocks of one Markdown file (also inside lists and admonitions)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, fence, info = m["indent"], m["fence"], m["info"].strip()
        end = i + 1
        while end < len(lines):
            stripped = lines[end].strip()
            if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
                break
            end += 1
        body = [ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[i + 1 : end]]
        lang = info.split()[0].lower() if info else ""
        lang = lang.removeprefix("{").removeprefix(".").rstrip("}")
        found.append(Block(path, i + 1, lang, info, textwrap.dedent("\n".join(body)) + "\n"))
        i = end + 1
    return found


ALL_BLOCKS = [b for src in SOURCES for b in blocks_of(src)]
RUNNABLE = [b for b in ALL_BLOCKS if b.runnable]
NOT_RUN_PYTHON = [b for b in ALL_BLOCKS if b.lang in ("python", "py") and not b.runnable]
YAML_BLOCKS = [b for b in ALL_BLOCKS if b.lang in ("yaml", "yml")]


def test_the_convention_finds_the_examples() -> None:
    """A parser that silently finds nothing would make every other test here pass vacuously."""
    assert (ROOT / "docs" / "index.md").is_file()
    readme = [b for b in RUNNABLE if b.path.name == "README.md"]
    assert readme, "README.md must keep at least one runnable example"
    assert len(RUNNABLE) >= 15, [b.where for b in RUNNABLE]


def _first_import_is_the_package(code: str) -> bool:
    """``import llm_resilience_plugin`` comes before any other import of a third-party package
    (it keeps LiteLLM offline; imported after litellm, LiteLLM tries to fetch its price map)."""
    for node in ast.parse(code).body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            top = names[0].split(".")[0]
            if top == "llm_resilience_plugin":
                return True
            if top not in sys.stdlib_module_names and top != "__future__":
                return False
    return False


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.where)
def test_example_runs(block: Block, tmp_path: Path) -> None:
    assert _first_import_is_the_package(block.code), f"{block.where}: import llm_resilience_plugin first"
    script = tmp_path / "example.py"
    script.write_text(block.code, encoding="utf-8")
    env = dict(os.environ)
    for key in ("NO_PROXY", "no_proxy"):
        hosts = [h for h in env.get(key, "").split(",") if h]
        env[key] = ",".join([*hosts, "127.0.0.1", "localhost"])
    # No real provider can be reached by accident: no keys, and anything that is not loopback
    # goes to a proxy that refuses at once (the examples use the simulator only).
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AZURE_API_KEY"):
        env.pop(key, None)
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        env[key] = "http://127.0.0.1:9"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if os.environ.get("LLM_EXAMPLES_FRESH"):  # each in a fresh interpreter (slower: LiteLLM's import)
        try:
            done = subprocess.run(
                [sys.executable, str(script)],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            pytest.fail(
                f"{block.where}: still running after {TIMEOUT_S} s\n{exc.stdout or ''}{exc.stderr or ''}"
            )
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    else:
        code, stdout, stderr = run_script(script, env, TIMEOUT_S)
        if code is None:
            pytest.fail(f"{block.where}: still running after {TIMEOUT_S} s\n{stdout}{stderr}")
    assert code == 0, f"{block.where} exited {code}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    assert "remote model cost map" not in stderr, f"{block.where}: LiteLLM went for the network"


@pytest.mark.parametrize("block", NOT_RUN_PYTHON, ids=lambda b: b.where)
def test_fragment_compiles(block: Block) -> None:
    """Blocks marked *not run* (they need a real provider or stand for a part) are still Python,
    and the names they import from this package exist where they import them from."""
    tree = compile(block.code, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT | ast.PyCF_ONLY_AST)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("llm_resilience_plugin"):
            module = importlib.import_module(node.module or "")
            missing = [a.name for a in node.names if not hasattr(module, a.name)]
            assert not missing, f"{block.where}: {node.module} has no {missing}"


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=lambda b: b.where)
def test_yaml_parses(block: Block) -> None:
    assert isinstance(yaml.safe_load(block.code), dict), f"{block.where}: expected a mapping"
