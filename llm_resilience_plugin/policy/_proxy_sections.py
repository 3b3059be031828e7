"""``llm-resilience check`` over the sections of a config that belong to LiteLLM's *proxy*:
``litellm_settings``, ``general_settings`` and ``environment_variables``.

:class:`~llm_resilience_plugin.ResilientRouter` reads none of them (``from_config`` builds the
Router from ``model_list`` and ``router_settings`` only; the proxy sets ``litellm.<key>`` from
``litellm_settings``, runs its server from ``general_settings`` and exports
``environment_variables`` before it resolves ``os.environ/`` references). A file shared with the
proxy is still worth checking, so what is checkable is checked, as warnings (the router is not
affected): each section a mapping; ``litellm_settings`` keys against the installed LiteLLM's
module settings (and the proxy's own keys), with the type of the setting's current value;
``general_settings`` keys and types against the proxy's settings model, when the installed
LiteLLM has it; ``environment_variables`` names and scalar values. Values are never printed;
messages name the field and the expected type only.
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping
from functools import cache
from typing import Any

from llm_resilience_plugin import _litellm
from llm_resilience_plugin._problems import Problem, closest

__all__ = ["PROXY_SECTIONS", "ROUTER_READS", "proxy_section_problems"]

PROXY_SECTIONS = ("litellm_settings", "general_settings", "environment_variables")
# What ResilientRouter reads of each section: nothing (the proxy applies them, the router not).
ROUTER_READS: dict[str, tuple[str, ...]] = dict.fromkeys(PROXY_SECTIONS, ())
_ENV_PREFIX = "os.environ/"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Keys of litellm_settings the proxy handles itself (not, or not only, as ``litellm.<key>``).
_PROXY_KEYS = frozenset(
    {
        "cache",
        "cache_params",
        "guardrails",
        "global_prompt_directory",
        "global_bitbucket_config",
        "global_gitlab_config",
        "priority_reservation_settings",
        "callbacks",
        "model_group_settings",
        "post_call_rules",
        "max_budget",
        "max_internal_user_budget",
        "default_max_internal_user_budget",
        "default_internal_user_params",
        "custom_provider_map",
        "success_callback",
        "failure_callback",
        "audit_log_callbacks",
        "responses",
        "max_ui_session_budget",
        "default_team_settings",
        "upperbound_key_generate_params",
        "key_alias_pattern",
        "json_logs",
        "budget_reset_time",
        "drop_params",
        "suppress_startup_output",
        "request_timeout",
        "s3_callback_params",
        "s3_audit_callback_params",
    }
)
# Of those, the ones it still sets as given (their type is checked like any litellm.<key>).
_SET_AS_IS = frozenset(
    {"request_timeout", "budget_reset_time", "s3_callback_params", "s3_audit_callback_params"}
)
_NOT_READ = "LiteLLM proxy's section; ResilientRouter does not read it"


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, Mapping):
        return "mapping"
    return type(value).__name__


@cache
def _litellm_settings() -> tuple[frozenset[str], dict[str, str]]:
    """The installed LiteLLM's module settings: every public name, and the type of each data
    setting whose current value has one (``None``-valued settings take anything)."""
    import litellm

    names: set[str] = set()
    typed: dict[str, str] = {}
    for name in dir(litellm):
        if name.startswith("_"):
            continue
        value = getattr(litellm, name, None)
        if callable(value) or isinstance(value, types.ModuleType):
            continue
        names.add(name)
        if value is not None:
            typed[name] = _type_name(value)
    return frozenset(names), typed


def _litellm_settings_problems(section: Mapping[str, Any]) -> list[Problem]:
    names, typed = _litellm_settings()
    known = names | _PROXY_KEYS
    problems = []
    for key, value in section.items():
        field = f"litellm_settings.{key}"
        if key not in known:
            hint = closest(str(key), sorted(known))
            problems.append(
                Problem(
                    field,
                    f"not a setting of litellm {_litellm.litellm_version()}{hint} ({_NOT_READ})",
                    "warning",
                )
            )
            continue
        expected = typed.get(str(key))
        parsed_by_proxy = key in _PROXY_KEYS and key not in _SET_AS_IS
        if expected is None or parsed_by_proxy or (isinstance(value, str) and value.startswith(_ENV_PREFIX)):
            continue
        if _type_name(value) != expected:
            problems.append(
                Problem(
                    field,
                    f"expected a {expected} (litellm.{key} is one), got a {_type_name(value)} ({_NOT_READ})",
                    "warning",
                )
            )
    return problems


def _general_settings_problems(section: Mapping[str, Any]) -> list[Problem]:
    model = _litellm.proxy_general_settings()
    if model is None:
        return []  # this LiteLLM has no proxy settings model: nothing to check the keys against
    fields = model.model_fields
    problems = []
    for key, value in section.items():
        field = f"general_settings.{key}"
        if key not in fields:
            hint = closest(str(key), sorted(fields))
            problems.append(Problem(field, f"not a proxy general setting{hint} ({_NOT_READ})", "warning"))
            continue
        if value is None or (isinstance(value, str) and value.startswith(_ENV_PREFIX)):
            continue
        try:
            model.model_validate({key: value})
        except Exception as exc:  # a pydantic ValidationError: its message, never the value
            errors = getattr(exc, "errors", None)
            msgs = [e.get("msg", "invalid") for e in errors(include_input=False)] if callable(errors) else []
            problems.append(Problem(field, f"{'; '.join(msgs) or 'invalid value'} ({_NOT_READ})", "warning"))
    return problems


def _environment_problems(section: Mapping[str, Any]) -> list[Problem]:
    problems = []
    for key, value in section.items():
        field = f"environment_variables.{key}"
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            problems.append(
                Problem(
                    field, f"not an environment variable name (letters, digits, _) ({_NOT_READ})", "warning"
                )
            )
        if value is None or isinstance(value, Mapping | list):
            problems.append(
                Problem(field, f"expected a string, got a {_type_name(value)} ({_NOT_READ})", "warning")
            )
    return problems


def proxy_section_problems(raw: Mapping[str, Any]) -> list[Problem]:
    """The problems of the proxy's sections present in ``raw`` (warnings; a section that is not a
    mapping is an error: the proxy cannot start with it)."""
    checks = {
        "litellm_settings": _litellm_settings_problems,
        "general_settings": _general_settings_problems,
        "environment_variables": _environment_problems,
    }
    problems: list[Problem] = []
    for name, check in checks.items():
        section = raw.get(name)
        if section is None:
            continue
        if not isinstance(section, Mapping):
            problems.append(Problem(name, f"expected a mapping, got a {_type_name(section)} ({_NOT_READ})"))
            continue
        problems += check(section)
    return problems
