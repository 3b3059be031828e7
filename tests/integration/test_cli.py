"""The command line: the demo runs end to end; check validates configs; bad input is clear."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from llm_resilience_plugin.cli import main
from tests._forked import run_cli as forked_cli


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


def test_check_prints_the_litellm_version_and_its_capabilities(tmp_path, capsys) -> None:
    from llm_resilience_plugin import _litellm

    cfg = tmp_path / "router.yaml"
    cfg.write_text(
        "model_list:\n  - model_name: p\n    litellm_params: {model: openai/gpt-4o-mini, api_key: sk-x}\n"
    )
    assert main(["check", str(cfg)]) == 0
    out = capsys.readouterr().out
    version = _litellm.litellm_version()
    assert f"[litellm] {version} (supported litellm{_litellm.SUPPORTED})" in out
    for name, cap in _litellm.capabilities().items():
        assert (f"  {name}: yes" if cap.available else f"  {name}: no ({cap.missing}") in out
    assert main(["check", str(cfg), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["litellm"]["version"] == version
    assert set(doc["litellm"]["capabilities"]) == set(_litellm.capabilities())


def test_check_prints_each_deployments_rate_limit_and_its_source(tmp_path, capsys) -> None:
    cfg = tmp_path / "router.yaml"
    cfg.write_text(
        textwrap.dedent(
            """
            model_list:
              - model_name: primary
                litellm_params: {model: openai/gpt-4o-mini, api_key: sk-x, rpm: 600, tpm: 100000}
                model_info: {id: p1}
              - model_name: primary
                litellm_params: {model: openai/gpt-4o-mini, api_key: sk-x}
                model_info: {id: p2}
              - model_name: backup
                litellm_params: {model: openai/gpt-4o, api_key: sk-y}
                model_info: {id: b1}
            resilience: {pacing: {limits: {backup: {rpm: 30}}, concurrency: {p2: {initial: 8, max: 64}}}}
            """
        )
    )
    assert main(["check", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "rate limit: 600 rpm, 100000 tpm (litellm_params), paced at 95%" in out
    assert "headers prove it too high" in out
    assert (
        "rate limit: no limit configured: learned from 429s and rate-limit headers; "
        "in flight: adaptive 1..64 from 8 (tolerance 1.5)" in out
    )
    assert "rate limit: 30 rpm (pacing.limits)" in out
    assert main(["check", str(cfg), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    limits = {d["id"]: d["rate_limit"] for d in doc["groups"]["primary"]["deployments"]}
    assert limits["p1"]["rpm"] == 600 and limits["p1"]["source"] == "litellm_params"


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


# -- the installed entry point, in a subprocess -----------------------------------------------------

ENTRY = Path(sys.executable).parent / "llm-resilience"


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``llm-resilience *args`` in its own process, forked from one that imported LiteLLM once
    (tests/_forked.py); the console script itself runs in a real subprocess below."""
    assert ENTRY.exists(), f"{ENTRY} not installed: pip install -e ."
    full_env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", **(env or {})}
    logs = Path(tempfile.mkdtemp()) / "cli"
    code, out, err = forked_cli(list(args), cwd, full_env, 120, logs)
    assert code is not None, f"llm-resilience {' '.join(args)}: still running after 120 s\n{out}{err}"
    return subprocess.CompletedProcess([str(ENTRY), *args], code, out, err)


BROKEN = textwrap.dedent(
    """
    model_list:
      - model_name: primary
        litellm_params: {model: openai/gpt-4o-mini, api_key: os.environ/LLMR_TEST_UNSET_KEY}
      - model_name: backup
        litellm_params: {model: notaprovider/x, api_key: sk-literal-secret-123456}
    router_settings:
      falbacks: [{primary: [backup]}]
    resilience:
      deadline: 5
      attempt_timeout: 60
    cost:
      budgets: [{period: dayly, limit: 5}]
    """
)


def test_check_reports_every_problem_at_once(tmp_path: Path) -> None:
    (tmp_path / "router.yaml").write_text(BROKEN)
    env = {"LLMR_TEST_UNSET_KEY": ""}
    res = run_cli("check", "router.yaml", cwd=tmp_path, env=env)
    assert res.returncode == 2, res.stderr
    err = res.stderr
    assert "Traceback" not in err and "more problem" not in err
    assert "router_settings.falbacks: unknown setting of litellm.Router; did you mean 'fallbacks'?" in err
    assert "model_list[1].litellm_params.model: LiteLLM does not know the provider 'notaprovider'" in err
    assert "environment variable LLMR_TEST_UNSET_KEY is empty" in err
    assert "resilience.attempt_timeout: 60 s is longer than the deadline (5 s)" in err
    assert "cost.budgets[0].period" in err
    assert "sk-literal-secret-123456" not in res.stdout + err
    res = run_cli("check", "router.yaml", "--json", cwd=tmp_path, env=env)
    assert res.returncode == 2
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["errors"] == 4 and doc["warnings"] == 1
    assert {p["field"] for p in doc["problems"]} == {
        "router_settings.falbacks",
        "model_list[1].litellm_params.model",
        "model_list[0].litellm_params.api_key",
        "resilience.attempt_timeout",
        "cost.budgets[0].period",
    }


def test_check_builds_offline_and_prints_the_policy_and_the_cost_section(tmp_path: Path) -> None:
    (tmp_path / "router.yaml").write_text(
        textwrap.dedent(
            """
            model_list:
              - model_name: primary
                litellm_params: {model: openai/gpt-4o-mini, api_key: os.environ/LLMR_TEST_KEY}
                model_info: {id: p1}
              - model_name: backup
                litellm_params: {model: openai/gpt-4o, api_key: os.environ/LLMR_TEST_KEY}
            router_settings: {fallbacks: [{primary: [backup]}], num_retries: 3}
            cost:
              ledger: sqlite:///spend.db
              budgets: [{period: day, limit: 50}, {period: month, limit: 5, scope: tenant}]
            """
        )
    )
    secret = "sk-env-secret-abcdef123456"
    res = run_cli("check", "router.yaml", cwd=tmp_path, env={"LLMR_TEST_KEY": secret})
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "router.yaml: 0 error(s), 1 warning(s)" in out and "router_settings.num_retries: ignored" in out
    assert "[primary]" in out and "deployment p1" in out and "fallbacks: ['backup']" in out
    assert "[cost] ledger sqlite:///spend.db" in out
    assert "budget daily: $50 per day" in out and "budget tenant/month: $5 per month per tenant" in out
    assert secret not in out + res.stderr
    assert not (tmp_path / "spend.db").exists()  # checking creates nothing
    res = run_cli("check", "router.yaml", cwd=tmp_path)  # the variable unset: an error, by name
    assert res.returncode == 2 and "environment variable LLMR_TEST_KEY is not set" in res.stderr


def _ledger_with_spend(path: Path, entries: int) -> str:
    import time

    from llm_resilience_plugin.cost import BudgetKey, SpendEntry, SQLiteLedger

    ledger = SQLiteLedger(path)
    key = BudgetKey("daily", "", "2026-11-30", 1000.0)
    for i in range(entries):
        held = ledger.reserve([key], 0.001, now=time.time(), ttl=60)
        entry = SpendEntry(time.time(), f"2026-11-{1 + i % 28:02d}", "2026-11", 0.001, model=f"m{i}")
        ledger.settle(held, 0.001, entry)
    ledger.close()
    return f"sqlite:///{path}"


def test_report_refuses_a_missing_ledger_unless_told_to_create_it(tmp_path: Path) -> None:
    res = run_cli("report", "--ledger", "spnd.db", cwd=tmp_path)
    assert res.returncode == 2
    assert "no ledger file at spnd.db (a typo?)" in res.stderr and "--create" in res.stderr
    assert not (tmp_path / "spnd.db").exists()
    res = run_cli("report", "--ledger", "sqlite:///spnd.db", "--create", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["total"] == 0 and (tmp_path / "spnd.db").exists()
    (tmp_path / "notes.db").write_text("not a database\n")
    res = run_cli("report", "--ledger", "notes.db", cwd=tmp_path)
    assert res.returncode == 1 and res.stderr.startswith("error: cannot read notes.db as a ledger")


def test_report_reads_the_ledger_named_by_the_config(tmp_path: Path) -> None:
    _ledger_with_spend(tmp_path / "spend.db", 3)
    (tmp_path / "router.yaml").write_text(
        "model_list: [{model_name: p, litellm_params: {model: openai/gpt-4o-mini}}]\n"
        "cost: {ledger: 'sqlite:///spend.db', budgets: [{period: day, limit: 5}]}\n"
    )
    res = run_cli("report", "--config", "router.yaml", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["total"] == pytest.approx(0.003)


def test_report_on_a_redis_ledger_that_is_down_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = run_cli("report", "--ledger", f"redis://127.0.0.1:{port}/0", cwd=tmp_path)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot read the Redis ledger"), res.stderr


def test_report_into_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    """`llm-resilience report --json | head -1`: the reader is gone before we write."""
    url = _ledger_with_spend(tmp_path / "spend.db", 200)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has already left when the command writes
    try:
        proc = subprocess.run(
            [str(ENTRY), "report", "--ledger", url, "--json"],
            cwd=tmp_path,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert proc.returncode in (0, 141), proc.stderr
    assert proc.stderr == ""


def test_bench_is_not_an_installed_command(tmp_path: Path) -> None:
    res = run_cli("bench", "chaos", cwd=tmp_path)
    assert res.returncode == 2 and "invalid choice: 'bench'" in res.stderr
    res = run_cli("--help", cwd=tmp_path)
    assert res.returncode == 0 and "python benchmarks/chaos.py" in res.stdout
