"""``llm-resilience check`` as a CI gate: it runs without the secrets, checks every section with
the closest name for a typo, refuses a recursive alias or a NaN naming the field; ``report
--config`` shows the budgets the config declares. (The chaos scenario lows are here too.)"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from llm_resilience_plugin import ConfigError, ResilientRouter
from llm_resilience_plugin.cli import main
from llm_resilience_plugin.policy import load_config
from llm_resilience_plugin.testing import Fault
from llm_resilience_plugin.testing.chaos import scenario_from_mapping

CONFIG = textwrap.dedent(
    """
    model_list:
      - model_name: primary
        litellm_params: {model: openai/gpt-4o-mini, api_key: os.environ/GATE_TEST_OPENAI_KEY}
        model_info: {id: p1}
      - model_name: backup
        litellm_params: {model: openai/gpt-4o, api_key: os.environ/GATE_TEST_BACKUP_KEY}
    router_settings: {fallbacks: [{primary: [backup]}]}
    cost: {budgets: [{period: day, limit: 5}, {period: day, limit: 1, scope: tenant, name: tenant-day}]}
    """
)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "router.yaml"
    path.write_text(text)
    return path


def test_check_without_secrets_reports_unset_keys_as_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GATE_TEST_OPENAI_KEY", raising=False)
    monkeypatch.delenv("GATE_TEST_BACKUP_KEY", raising=False)
    cfg = _write(tmp_path, CONFIG)
    assert main(["check", str(cfg)]) == 2  # by default an unset key is an error
    assert "GATE_TEST_OPENAI_KEY is not set" in capsys.readouterr().err
    assert main(["check", str(cfg), "--no-secrets"]) == 0
    out = capsys.readouterr().out
    assert "warning  model_list[0].litellm_params.api_key: environment variable GATE_TEST_OPENAI_KEY" in out
    assert "[primary]" in out  # the policy was still built and printed
    assert main(["check", str(cfg), "--no-secrets", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["warnings"] == 2


def test_check_validates_the_chaos_section_with_the_closest_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _write(tmp_path, CONFIG + "chaos: {min_sucess: 0.99, model: primray}\n")
    assert main(["check", str(cfg), "--no-secrets"]) == 2
    err = capsys.readouterr().err
    assert "chaos.min_sucess" in err and "did you mean 'min_success'" in err
    cfg = _write(tmp_path, CONFIG + "chaos: {min_success: 0.99, model: primray}\n")
    assert main(["check", str(cfg), "--no-secrets"]) == 2
    err = capsys.readouterr().err
    assert "chaos.model" in err and "did you mean 'primary'" in err


@pytest.mark.parametrize(
    ("yaml_text", "field", "says"),
    [
        (
            "model_list: &m\n  - model_name: p\n    litellm_params: {model: openai/gpt-4o-mini, extra: *m}\n",
            "model_list[0].litellm_params.extra",
            "recursive YAML alias",
        ),
        (
            "model_list:\n  - model_name: p\n"
            "    litellm_params: {model: openai/gpt-4o-mini, timeout: .nan}\n",
            "model_list[0].litellm_params.timeout",
            "nan",
        ),
        (
            "model_list:\n  - model_name: p\n    litellm_params: {model: openai/gpt-4o-mini, "
            "input_cost_per_token: .nan, output_cost_per_token: 1.0e-6}\n",
            "model_list[0].litellm_params.input_cost_per_token",
            "nan",
        ),
    ],
    ids=["recursive-alias", "timeout-nan", "price-nan"],
)
def test_a_recursive_alias_or_a_nan_is_a_config_error_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], yaml_text: str, field: str, says: str
) -> None:
    cfg = _write(tmp_path, yaml_text)
    with pytest.raises(ConfigError) as ei:
        load_config(cfg)
    assert ei.value.field == field and says in ei.value.message
    with pytest.raises(ConfigError) as ei:
        ResilientRouter.from_config(cfg)
    assert ei.value.field == field
    assert main(["check", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err


def test_a_nan_given_to_the_constructor_is_a_config_error_naming_the_field() -> None:
    lp = {"model": "openai/gpt-4o-mini", "api_key": "k", "api_base": "http://127.0.0.1:9/x/v1"}
    for extra in (
        {"timeout": float("nan")},
        {"input_cost_per_token": float("nan"), "output_cost_per_token": 1e-6},
    ):
        with pytest.raises(ConfigError) as ei:
            ResilientRouter(model_list=[{"model_name": "x", "litellm_params": {**lp, **extra}}])
        assert ei.value.field == f"model_list[0].litellm_params.{next(iter(extra))}"


def test_report_with_config_shows_the_declared_budgets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from llm_resilience_plugin.cost import SQLiteLedger

    SQLiteLedger(tmp_path / "spend.db").close()
    cfg = _write(
        tmp_path, CONFIG.replace("cost: {", "cost: {ledger: 'sqlite:///" + str(tmp_path / "spend.db") + "', ")
    )
    assert main(["report", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "budgets declared in" in out
    assert "$5 per day" in out and "tenant-day" in out and "$1 per day per tenant" in out
    assert main(["report", "--config", str(cfg), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(b["name"], b["limit"], b["period"], b["scope"]) for b in doc["declared_budgets"]][1] == (
        "tenant-day",
        1,
        "day",
        "tenant",
    )


# -- chaos scenarios: the lows ---------------------------------------------------------------------


def test_a_scenario_that_would_never_finish_sending_is_refused() -> None:
    with pytest.raises(ConfigError, match="rate"):
        scenario_from_mapping({"name": "slow", "calls": 10, "rate": 1e-300})
    assert scenario_from_mapping({"name": "ok", "calls": 10, "rate": 0.5}).rate == 0.5


def test_a_line_break_in_a_retry_after_header_is_refused() -> None:
    for bad in ("1\r\nX-Injected: yes", "1\n", " "):
        with pytest.raises(ConfigError, match="retry_after"):
            scenario_from_mapping(
                {
                    "name": "crlf",
                    "timeline": {"primary": [{"fault": {"kind": "rate_limit", "retry_after": bad}}]},
                }
            )
        with pytest.raises(ValueError, match="retry_after"):
            Fault.http_error(429, retry_after=bad)
    assert Fault.http_error(429, retry_after="Wed, 21 Oct 2015 07:28:00 GMT").retry_after


PROXY = textwrap.dedent(
    """
    litellm_settings:
      drop_parms: true
      request_timeout: "thirty"
      num_retries: 3
      success_callback: [langfuse]
    general_settings:
      master_key: os.environ/GATE_TEST_MASTER_KEY
      database_url: postgresql://llm:db-password-4e5f6a@db.internal:5432/litellm
      store_model_in_db: "maybe"
      alerting_treshold: 300
    environment_variables:
      GATE_TEST_BACKUP_KEY: sk-exported-backup-0a1b2c3d4e5f
      LANGFUSE_SECRET_KEY: lf-secret-9f8e7d6c5b4a
      "bad name": x
    """
)


def test_check_validates_the_proxys_sections_and_says_the_router_reads_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATE_TEST_OPENAI_KEY", "sk-gate-openai-1234567890")
    monkeypatch.delenv("GATE_TEST_BACKUP_KEY", raising=False)
    monkeypatch.delenv("GATE_TEST_MASTER_KEY", raising=False)
    cfg = _write(tmp_path, CONFIG + PROXY)
    secrets = (
        "db-password-4e5f6a",
        "sk-exported-backup-0a1b2c3d4e5f",
        "lf-secret-9f8e7d6c5b4a",
        "sk-gate-openai",
    )
    assert (
        main(["check", str(cfg), "--no-secrets"]) == 0
    )  # the proxy's sections never fail the router's check
    out = capsys.readouterr().out
    assert not any(s in out for s in secrets), out
    warned = [line.split(None, 1)[1] for line in out.splitlines() if line.startswith("  warning")]
    lines = {line.split(": ", 1)[0]: line for line in warned}
    assert "did you mean 'drop_params'" in lines["litellm_settings.drop_parms"]
    assert "expected a number" in lines["litellm_settings.request_timeout"]
    assert "litellm_settings.num_retries" not in lines and "litellm_settings.success_callback" not in lines
    assert "did you mean 'alerting_threshold'" in lines["general_settings.alerting_treshold"]
    assert "boolean" in lines["general_settings.store_model_in_db"]
    assert "GATE_TEST_MASTER_KEY is not set" in lines["general_settings.master_key"]
    assert "not an environment variable name" in lines["environment_variables.bad name"]
    # Set only for the proxy: the router would not see it.
    assert "ResilientRouter does not apply that section" in lines["model_list[1].litellm_params.api_key"]
    assert all("ResilientRouter does not" in line for line in lines.values()), lines
    assert (
        "[proxy] litellm_settings (4 keys), general_settings (4 keys), environment_variables (3 keys)" in out
    )
    assert "ResilientRouter reads none of their keys" in out
    # The same in JSON; a section that is not a mapping is an error (the proxy cannot start).
    assert main(["check", str(cfg), "--no-secrets", "--json"]) == 0
    raw = capsys.readouterr().out
    doc = json.loads(raw)
    assert not any(s in raw for s in secrets)
    assert doc["proxy_sections"]["general_settings"] == {"keys": 4, "read_by_router": []}
    cfg = _write(tmp_path, CONFIG + "litellm_settings: [drop_params]\n")
    assert main(["check", str(cfg), "--no-secrets"]) == 2
    assert "litellm_settings: expected a mapping, got a list" in capsys.readouterr().err
