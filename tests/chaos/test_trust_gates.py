"""What the chaos command and ``check`` say about a config before production sees it: unpriced
deployments marked, every section checked with the closest name, secrets not needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm_resilience_plugin import cli
from llm_resilience_plugin.testing.chaos import run_chaos

CONFIG = Path(__file__).with_name("router.yaml")


def test_chaos_marks_a_deployment_without_a_price(tmp_path: Path) -> None:
    unpriced = tmp_path / "router.yaml"
    unpriced.write_text(
        CONFIG.read_text().replace("anthropic/claude-haiku-4-5", "anthropic/claude-3-5-haiku-latest")
    )
    lines: list[str] = []
    out = tmp_path / "chaos.json"
    run_chaos(str(unpriced), only=["revoked-key"], quick_run=True, json_path=str(out), out=lines.append)
    text = "\n".join(lines)
    assert "Unpriced" in text and "fallback/spare: anthropic/claude-3-5-haiku-latest" in text
    doc = json.loads(out.read_text())
    assert doc["unpriced"] == [
        {"group": "fallback", "id": "spare", "model": "anthropic/claude-3-5-haiku-latest"}
    ]
    lines.clear()
    run_chaos(str(CONFIG), only=["revoked-key"], quick_run=True, out=lines.append)
    assert "Unpriced" not in "\n".join(lines)


def test_check_warns_about_a_deployment_whose_output_the_cost_guard_bounds_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0123456789")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-0123456789")
    cfg = tmp_path / "router.yaml"
    cfg.write_text(
        CONFIG.read_text().replace(
            "{model: anthropic/claude-haiku-4-5,",
            "{model: anthropic/claude-3-5-haiku-latest, input_cost_per_token: 8.0e-7, "
            "output_cost_per_token: 4.0e-6,",
        )
        + "cost: {budgets: [{period: day, limit: 5}]}\n"
    )
    code = cli.main(["check", str(cfg)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "warning  cost.default_max_tokens: deployment 'spare'" in out and "32768" in out
