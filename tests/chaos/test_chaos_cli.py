"""``llm-resilience chaos``: once through the installed entry point in a subprocess, the other runs
in processes forked from one that imported LiteLLM once (the same ``main``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests._forked import run_cli

CLI = Path(sys.executable).with_name("llm-resilience")
CONFIG = Path(__file__).with_name("router.yaml")


def _run(*args: str, timeout: float = 120, real: bool = False) -> subprocess.CompletedProcess[str]:
    """``llm-resilience chaos *args``: through the installed console script (``real``), else in
    a process forked from one that imported LiteLLM once (tests/_forked.py), the same ``main``."""
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost"}
    env.pop("OPENAI_API_KEY", None)  # the config's os.environ/ keys are never read
    if real:
        return subprocess.run(
            [str(CLI), "chaos", *args], capture_output=True, text=True, timeout=timeout, env=env
        )
    code, out, err = run_cli(["chaos", *args], Path.cwd(), env, timeout, Path(tempfile.mkdtemp()) / "chaos")
    assert code is not None, (
        f"llm-resilience chaos {' '.join(args)}: still running after {timeout} s\n{out}{err}"
    )
    return subprocess.CompletedProcess([str(CLI), "chaos", *args], code, out, err)


def test_thresholds_met_exit_0_with_json_and_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "chaos.json", tmp_path / "chaos.png"
    r = _run(
        str(CONFIG),
        "--only",
        "revoked-key,context-overflow",
        "--json",
        str(out),
        "--plot",
        str(png),
        real=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "| revoked-key | plugin |" in r.stdout and "Thresholds met." in r.stdout
    doc = json.loads(out.read_text())
    assert doc["passed"] is True
    assert [s["name"] for s in doc["scenarios"]] == ["context-overflow", "revoked-key"]
    assert doc["scenarios"][1]["plugin"]["success_rate"] == 1.0
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "sk-chaos" not in r.stdout + r.stderr


def test_a_missed_threshold_exits_1_and_gives_advice(tmp_path: Path) -> None:
    scenario = tmp_path / "cut.yaml"
    scenario.write_text(
        "name: my-cut\ncalls: 4\nconcurrency: 2\nstream: true\n"
        # every route cuts its streams: a cut the fallback continues is no miss on the default
        "timeline: {primary: [{fault: {kind: stream_cut, after_chunks: 2}}],"
        " fallback: [{fault: {kind: stream_cut, after_chunks: 2}}]}\n"
    )
    r = _run(str(CONFIG), "--scenario", str(scenario), "--plot", str(tmp_path / "t.html"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "my-cut: success" in r.stdout and "< min_success 0.999" in r.stdout
    assert "supports_assistant_prefill: true" in r.stdout  # the advice names what lets it go on
    assert "<img" in (tmp_path / "t.html").read_text()


def test_mistakes_exit_2_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(CONFIG.read_text().replace("min_success: 0.999", "min_success: 2"))
    r = _run(str(bad))
    assert r.returncode == 2 and "chaos.min_success" in r.stderr
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: s\ntimeline: {nowhere: [{fault: {kind: auth}}]}\n")
    r = _run(str(CONFIG), "--scenario", str(scenario))
    assert r.returncode == 2 and "timeline.nowhere" in r.stderr
    r = _run(str(CONFIG), "--only", "nope")
    assert r.returncode == 2 and "unknown scenario" in r.stderr


def test_a_rate_limited_scenario_enforces_the_limit_and_the_plugin_paces_to_it(tmp_path: Path) -> None:
    scenario = tmp_path / "limited.yaml"
    scenario.write_text(
        "name: my-limit\ncalls: 16\nrate: 16\n"
        "limits: {primary: {rpm: 360, retry_after: 0.5}, fallback: {rpm: 360, retry_after: 0.5}}\n"
    )
    out = tmp_path / "c.json"
    r = _run(str(CONFIG), "--scenario", str(scenario), "--json", str(out))
    doc = json.loads(out.read_text())
    (row,) = doc["scenarios"]
    plugin, plain = row["plugin"], row["litellm"]
    assert plugin["success_rate"] == 1.0, r.stdout + r.stderr  # every call answered within its deadline
    assert plugin["paced_share"] > 0  # some waited for the provider's limit instead of a 429
    # The provider refused the plain Router's burst: its requests per call show the 429s it met.
    assert plain["upstream_per_call"] > 1.0
    assert plugin["upstream_per_call"] <= plain["upstream_per_call"]
    assert "of the calls waited for a deployment's rate limit" in r.stdout  # the advice says why
    assert "attempt_timeout" not in r.stdout  # not blamed on a timeout
