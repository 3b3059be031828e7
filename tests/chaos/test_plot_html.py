"""The HTML report's timeline is interactive: every call, request and breaker band says what it is
(built from a hand-made run: no simulator, no matplotlib needed)."""

from __future__ import annotations

import re
from pathlib import Path

from llm_resilience_plugin.testing._state import RequestRecord
from llm_resilience_plugin.testing.chaos import CallResult, RunResult, scenario_from_mapping
from llm_resilience_plugin.testing.chaos._plot import write_plot
from llm_resilience_plugin.testing.chaos._svg import timeline_svg
from llm_resilience_plugin.testing.chaos._target import simulated_target

MODEL_LIST = [
    {
        "model_name": "primary",
        "litellm_params": {"model": "openai/gpt-4o-mini"},
        "model_info": {"id": "main"},
    },
    {
        "model_name": "fallback",
        "litellm_params": {"model": "anthropic/claude-3-5-haiku-latest"},
        "model_info": {"id": "spare"},
    },
]


def _run(system: str) -> RunResult:
    scenario = scenario_from_mapping(
        {"name": "down", "description": "main <503>", "timeline": {"primary": [{"fault": {"kind": "auth"}}]}}
    )
    target = simulated_target(
        MODEL_LIST, base_url="http://127.0.0.1:1", prefix="down", primary="primary", fallbacks=["fallback"]
    )
    main, spare = (d.sim_name for d in target.deployments)

    def record(dep: str, at: float, behavior: str, status: int | None, tag: str) -> RequestRecord:
        return RequestRecord(dep, "m", False, 100 + at, 100 + at + 0.01, behavior, status, {"user": tag}, {})

    requests = [
        record(main, 0.0, "http_error:503", 503, "c-0"),
        record(spare, 0.02, "ok", 200, "c-0"),
        record(main, 0.5, "reset", None, "c-1"),
    ]
    calls = [CallResult("c-0", 0.0, 0.031, True, None, 12, 9), CallResult("c-1", 0.5, 0.75, False, "Timeout")]
    transitions = [("main", 0.01, "open"), ("main", 0.6, "half_open"), ("main", 0.7, "closed")]
    return RunResult(scenario, system, target, calls, requests, 100.0, transitions)


def _tips(svg: str) -> list[str]:
    return re.findall(r"<title>(.*?)</title>", svg)


def test_every_mark_has_its_details_on_hover() -> None:
    tips = _tips(timeline_svg(_run("plugin")))
    assert "call c-0: ok, latency 0.031 s (from 0.000 s), answered by fallback/spare, tokens 12+9" in tips
    assert (
        "call c-1: failed (Timeout), latency 0.250 s (from 0.500 s), no deployment answered, tokens 0+0"
        in tips
    )
    assert any(t.startswith("request to primary/main at 0.000 s: http_error:503, status 503") for t in tips)
    assert any(t.startswith("request to primary/main at 0.500 s: reset, status none (dropped)") for t in tips)
    assert "breaker of primary/main open from 0.01 s to 0.60 s" in tips
    assert "breaker of primary/main half-open from 0.60 s to 0.70 s" in tips
    assert len(tips) == 2 + 3 + 2


def test_the_html_report_is_the_table_and_a_timeline_per_system(tmp_path: Path) -> None:
    out = write_plot(str(tmp_path / "r.html"), [(_run("plugin"), _run("litellm"))], "| down | <x> |")
    page = out.read_text()
    assert page.count("<svg") == 2 and "<figcaption>litellm</figcaption>" in page
    assert "| down | &lt;x&gt; |" in page and "main &lt;503&gt;" in page  # escaped
    assert "data-tip=" in page and "getElementById('tip')" in page
