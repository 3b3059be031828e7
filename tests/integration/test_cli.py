"""The command line: the demo runs end to end; check validates configs; bad input is clear."""

from __future__ import annotations

import io
import textwrap

import pytest

from llm_resilience_plugin.cli import main


async def test_demo_runs_the_incident_side_by_side() -> None:
    from llm_resilience_plugin.demo import run_demo

    out = io.StringIO()
    code = await run_demo(calls_per_phase=4, out=out)
    text = out.getvalue()
    assert code == 0, text
    assert "| success rate |" in text and "plain Router" in text
    assert "breaker transitions (plugin):" in text
    assert "-> open" in text  # the outage opened at least one breaker
    assert "tenant spend vs" in text


def test_check_prints_the_effective_policy(tmp_path, capsys) -> None:
    cfg = tmp_path / "router.yaml"
    cfg.write_text(
        textwrap.dedent(
            """
            model_list:
              - model_name: primary
                litellm_params: {model: openai/gpt-4o-mini, api_key: sk-x}
                model_info: {id: p1}
              - model_name: backup
                litellm_params: {model: openai/gpt-4o, api_key: sk-y}
            router_settings: {fallbacks: [{primary: [backup]}]}
            resilience: {breaker: {fail_max: 2}}
            """
        )
    )
    assert main(["check", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "[primary]" in out and "deployment p1" in out and "fail_max 2" in out
    assert "sk-x" not in out
    assert main(["check", str(cfg), "--json"]) == 0
    assert '"fallbacks": [\n        "backup"' in capsys.readouterr().out


def test_bad_arguments_are_clear(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "model_list:\n  - model_name: p\n    litellm_params: {model: x}\n"
        "router_settings: {fallbacks: [{p: [q]}]}\n"
    )
    assert main(["check", str(bad)]) == 2
    assert "unknown fallback group 'q'" in capsys.readouterr().err
    assert main(["check", str(tmp_path / "missing.yaml")]) == 2
    with pytest.raises(SystemExit):
        main(["demo", "--calls", "zero"])
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out


async def test_report_reads_a_sqlite_ledger(tmp_path, make_router, sim, capsys) -> None:
    from llm_resilience_plugin.cost._guard import Budget, CostGuard

    url = f"sqlite:///{tmp_path / 'spend.db'}"
    guard = CostGuard(budgets=[Budget.daily(10)], ledger=url)
    router = make_router({"primary": ["a"]}, guards=[guard])
    guard.bind_router(router)
    for _ in range(3):
        await router.acompletion(model="primary", messages=[{"role": "user", "content": "hi"}], max_tokens=20)
    guard.close()
    assert main(["report", "--ledger", url]) == 0
    out = capsys.readouterr().out
    assert "primary" in out or "gpt-4o-mini" in out
    assert main(["report", "--ledger", url, "--json"]) == 0
    assert '"total"' in capsys.readouterr().out
    assert main(["report", "--ledger", f"sqlite:///{tmp_path / 'none.db'}"]) == 2
    assert main(["report", "--ledger", url, "--since", "yesterday"]) == 2
