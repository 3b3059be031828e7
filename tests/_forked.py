"""Run a script (a documentation example) or the ``llm-resilience`` CLI in a child forked from a
process that has imported LiteLLM once (multiprocessing's forkserver, preloaded): each run still
gets its own process, environment, working directory, ``sys.argv`` and ``__main__``, without
paying LiteLLM's import (seconds of CPU) each time - most of the suite's CPU was that import.

The forkserver starts with this process's environment; each run's child then sets its own
(LiteLLM and httpx read ``os.environ`` when a client is made, not only at import). The Redis fleet
tests fork their worker processes from the same server. Tests of
the installed console script itself keep a real subprocess.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import sys
import traceback
from multiprocessing.context import ForkServerContext
from pathlib import Path

# Imported once in the forkserver; every example imports the package first anyway.
PRELOAD = [
    "tests._forked",
    "llm_resilience_plugin",
    "litellm",
    "llm_resilience_plugin.testing",
    "llm_resilience_plugin.langchain",  # skipped where the extra is not installed
]


def _run(what: str, args: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """The child: its environment and folder, its output to files, then ``what``: ``script``
    (``args[0]`` run as __main__) or ``cli`` (``llm-resilience args...``)."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    if what == "script":
        sys.argv = [args[0]]
        sys.path[0] = os.path.dirname(args[0])
    else:
        sys.argv = ["llm-resilience", *args]
    with open(out, "w") as o, open(err, "w") as e:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(o.fileno(), 1)
        os.dup2(e.fileno(), 2)
    sys.stdout = open(1, "w", closefd=False, buffering=1)
    sys.stderr = open(2, "w", closefd=False, buffering=1)
    code = 0
    try:
        if what == "script":
            runpy.run_path(args[0], run_name="__main__")
        else:
            from llm_resilience_plugin.cli import main

            code = main(args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        sys.exit(code)


_CONTEXT: ForkServerContext | None = None


ROOT = Path(__file__).resolve().parents[1]


def context() -> ForkServerContext:
    """The preloaded forkserver (one per test process, started on first use with this process's
    environment and the project root on the path; each child sets its own environment)."""
    global _CONTEXT
    if _CONTEXT is None:
        saved = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), saved) if p)
        try:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD)
            proc = ctx.Process(target=_noop)  # start the server now, with this environment
            proc.start()
            proc.join()
            _CONTEXT = ctx
        finally:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved
    return _CONTEXT


def _noop() -> None:
    return None


Outcome = tuple[int | None, str, str]  # exit code (None: killed at its timeout), stdout, stderr


def _start(what: str, args: list[str], cwd: Path, env: dict[str, str], out: Path, timeout: float) -> Outcome:
    ctx = context()
    stdout, stderr = out.with_name(out.name + ".out"), out.with_name(out.name + ".err")
    proc = ctx.Process(target=_run, args=(what, args, str(cwd), env, str(stdout), str(stderr)))
    proc.start()
    proc.join(timeout)
    code: int | None = proc.exitcode
    if proc.is_alive():
        proc.kill()
        proc.join()
        code = None
    read = lambda p: p.read_text(encoding="utf-8", errors="replace") if p.exists() else ""  # noqa: E731
    return code, read(stdout), read(stderr)


def run_script(script: Path, env: dict[str, str], timeout: float) -> Outcome:
    """Run ``script`` in its folder: (exit code, or None when still running after ``timeout`` s
    and killed; stdout; stderr)."""
    return _start("script", [str(script)], script.parent, env, script, timeout)


def run_cli(args: list[str], cwd: Path, env: dict[str, str], timeout: float, logs: Path) -> Outcome:
    """``llm-resilience *args`` in ``cwd`` (its output kept under ``logs``, a fresh temporary path
    prefix): (exit code, or None when killed after ``timeout`` s; stdout; stderr)."""
    return _start("cli", list(args), cwd, env, logs, timeout)
