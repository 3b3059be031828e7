"""The chaos report: the HTML page's scorecard is a table and its timeline is interactive (every call,
request and breaker band says what it is), small samples are marked, the plugin's losses get advice,
a .png without matplotlib is refused before anything runs (hand-made runs: no simulator needed)."""

from __future__ import annotations

import importlib.util
import re
import time
from pathlib import Path

import pytest

from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.testing._state import RequestRecord
from llm_resilience_plugin.testing.chaos import CallResult, RunResult, scenario_from_mapping
from llm_resilience_plugin.testing.chaos._command import run_chaos
from llm_resilience_plugin.testing.chaos._metrics import Metrics, behind
from llm_resilience_plugin.testing.chaos._plot import check_plot_path, write_plot
from llm_resilience_plugin.testing.chaos._report import Row, render_table
from llm_resilience_plugin.testing.chaos._svg import timeline_svg
from llm_resilience_plugin.testing.chaos._target import simulated_target

CONFIG = Path(__file__).with_name("router.yaml")
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


def _metrics(calls: int, success: float, p99: float, upstream: float = 1.0) -> Metrics:
    return Metrics(calls, success, p99 / 2, p99, upstream, 0, None, None, 0.0, {"Timeout": 1}, {"main": 1})


def test_the_html_report_is_the_table_and_a_timeline_per_system(tmp_path: Path) -> None:
    row = Row("down", "main <503>", True, _metrics(8, 0.5, 0.75), _metrics(8, 1.0, 0.5), ["tip <b>"])
    out = write_plot(str(tmp_path / "r.html"), [(_run("plugin"), _run("litellm"))], [row])
    page = out.read_text()
    assert page.count("<svg") == 2 and "<figcaption>litellm</figcaption>" in page
    assert "<table class='scorecard'>" in page and "| down |" not in page  # a table, not markdown pipes
    assert "<td>down</td><td>plugin</td><td class='num'>8</td><td class='num'>50%</td>" in page
    assert "<td class='num'>~0.75</td>" in page and "fewer than 20 calls" in page  # 8 calls: marked
    assert "<li>tip &lt;b&gt;</li>" in page and "main &lt;503&gt;" in page  # escaped
    assert "data-tip=" in page and "getElementById('tip')" in page


def test_the_text_table_marks_small_samples_only() -> None:
    small = Row("s", "", True, _metrics(8, 1.0, 0.4), _metrics(8, 1.0, 0.4), [])
    big = Row("b", "", True, _metrics(40, 1.0, 0.4), _metrics(40, 1.0, 0.4), [])
    assert "| ~0.20 | ~0.40 |" in render_table([small]) and "fewer than 20 calls" in render_table([small])
    assert "| 0.20 | 0.40 |" in render_table([big]) and "~" not in render_table([big])


def test_an_advice_line_for_each_number_the_plugin_loses() -> None:
    assert behind("x", _metrics(40, 1.0, 0.4), _metrics(40, 1.0, 0.4), min_sample=20) == []
    lines = behind("x", _metrics(40, 0.9, 2.0, upstream=3.0), _metrics(40, 1.0, 0.5), min_sample=20)
    assert [line.split(" on ", 1)[1].split(" (")[0] for line in lines] == [
        "success",
        "p99",
        "upstream requests per call",
    ]
    assert "{'Timeout': 1}" in lines[0] and "resilience.attempt_timeout" in lines[1]
    # The same latency gap on 8 calls is called inconclusive, not a loss.
    (line,) = behind("x", _metrics(8, 1.0, 2.0), _metrics(8, 1.0, 0.5), min_sample=20)
    assert "on 8 calls is inconclusive" in line


def test_advice_does_not_call_answering_more_calls_a_loss() -> None:
    from dataclasses import replace

    # Slower at p99 but more calls answered: said as such, not "lower attempt_timeout".
    (line,) = behind("x", _metrics(40, 1.0, 9.0), _metrics(40, 0.7, 6.0), min_sample=20)
    assert "with more calls answered (100% vs 70%)" in line and "resilience.deadline" in line
    # Calls held back for a rate limit, fewer requests sent: the pacing is named, with the fix.
    paced = replace(_metrics(40, 1.0, 9.0, upstream=1.4), paced_share=0.6)
    (line,) = behind("x", paced, _metrics(40, 1.0, 6.0, upstream=1.8), min_sample=20)
    assert "held 60% of the calls back" in line and "rpm/tpm in litellm_params" in line
    # The plain Router answered from the fallback while the plugin waited on the group asked for.
    fled = replace(_metrics(40, 1.0, 0.2, upstream=1.2), fallback_share=0.8)
    lines = behind("x", replace(paced, upstream_per_call=1.35), fled, min_sample=20)
    assert "answered 80% of them from the fallback" in lines[0] and "max_wait_with_fallback" in lines[0]
    assert "finding the provider's limit" in lines[1]
    # More requests that answered more calls (retries, stream recoveries) are said to be that.
    lines = behind("x", _metrics(40, 1.0, 0.1, upstream=1.25), _metrics(40, 0.0, 0.1), min_sample=20)
    assert "retries and stream recoveries that answered 100% of the calls against 0%" in lines[-1]
    # Spend is compared per answered call: answering more calls at the same price is no loss.
    more = replace(_metrics(40, 1.0, 0.4), spend=0.0002)
    assert behind("x", more, replace(_metrics(40, 0.7, 0.4), spend=0.00014), min_sample=20) == []
    pricier = replace(_metrics(40, 1.0, 0.4), spend=0.0004)
    (line,) = behind("x", pricier, replace(_metrics(40, 1.0, 0.4), spend=0.0002), min_sample=20)
    assert "spend per answered call" in line


def test_a_png_without_matplotlib_is_refused_before_any_scenario_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "matplotlib" else real(n, *a))
    started = time.monotonic()
    with pytest.raises(ConfigError, match="needs matplotlib") as err:
        run_chaos(str(CONFIG), plot_path=str(tmp_path / "t.png"), out=lambda _: None)
    assert err.value.field == "--plot" and time.monotonic() - started < 5  # no scenario ran
    assert not (tmp_path / "t.png").exists()
    with pytest.raises(ConfigError, match=r"expected a \.png or \.html"):
        check_plot_path("t.svg")


def test_429s_are_not_requests_to_a_dead_route() -> None:
    """A deployment answering 429 is alive (its limit is paced, never broken): a streak of 429s
    counts nothing; a streak of 503s past breaker.fail_max does."""
    from llm_resilience_plugin.policy import RouterSpec
    from llm_resilience_plugin.testing.chaos._metrics import measure

    spec = RouterSpec(
        model_list=MODEL_LIST, fallbacks={"primary": ["fallback"]}, policy={"breaker": {"fail_max": 3}}
    )
    run = _run("plugin")
    main = run.target.deployments[0].sim_name

    def record(at: float, status: int) -> RequestRecord:
        behavior = "ok" if status == 200 else f"http_error:{status}"
        return RequestRecord(main, "m", False, 100 + at, 100 + at + 0.01, behavior, status, {"user": "c"}, {})

    run.requests[:] = [record(i * 0.01, 429) for i in range(10)]
    assert measure(run, spec).to_dead_route == 0
    run.requests[:] = [record(i * 0.01, 503) for i in range(10)]
    assert measure(run, spec).to_dead_route == 7  # the 4th to the 10th
