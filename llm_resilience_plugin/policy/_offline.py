"""A config without what reaches outside the machine: for the runs that promise to stay local
(``llm-resilience chaos``, the pytest plugin, ``llm-resilience check``).

An allow-list of LiteLLM Router settings that only shape routing on this machine; everything
else (``redis_*``, response caching, alerting webhooks, background health checks, guardrails,
search tools, assistants' endpoints, provider budgets kept in a cache) is dropped, and the cost
section's ledger becomes ``memory``. Deployments are the caller's to point (chaos points them at
the simulator).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llm_resilience_plugin._redaction import is_secret_key
from llm_resilience_plugin.policy._spec import RouterSpec

__all__ = ["LOCAL_ROUTER_SETTINGS", "local_router_settings", "offline_spec"]

LOCAL_ROUTER_SETTINGS = frozenset(
    {
        "routing_strategy",
        "routing_strategy_args",
        "timeout",
        "stream_timeout",
        "model_group_alias",
        "set_verbose",
        "debug_level",
        "default_max_parallel_requests",
        "default_priority",
        "default_litellm_params",  # without its endpoints and keys (below)
        "enable_pre_call_checks",
        "optional_pre_call_checks",
        "enable_tag_filtering",
        "tag_filtering_match_any",
        "tag_routing_prefix",
        "ignore_invalid_deployments",
        "client_ttl",
        "fallback_on_unsupported_params",
        "routing_groups",
        "auto_router_capability_limit",
        # the plugin's own (switched off for LiteLLM) and the fallback lists it reads
        "fallbacks",
        "context_window_fallbacks",
        "content_policy_fallbacks",
        "default_fallbacks",
        "num_retries",
        "retry_policy",
        "model_group_retry_policy",
        "allowed_fails",
        "allowed_fails_policy",
        "cooldown_time",
        "disable_cooldowns",
        "retry_after",
        "max_fallbacks",
        "enable_weighted_failover",
        "enable_mid_stream_fallback_continuation",
    }
)
# default_litellm_params keys that say where a request goes or with which credentials.
_ENDPOINT_PARAMS = ("api_base", "base_url", "api_key", "api_version", "organization", "extra_headers")


def local_router_settings(settings: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The settings that stay on this machine, and the names of those dropped."""
    kept = {k: v for k, v in settings.items() if k in LOCAL_ROUTER_SETTINGS}
    dropped = sorted(str(k) for k in settings if k not in LOCAL_ROUTER_SETTINGS)
    defaults = kept.get("default_litellm_params")
    if isinstance(defaults, Mapping):
        kept["default_litellm_params"] = {
            k: v for k, v in defaults.items() if k not in _ENDPOINT_PARAMS and not is_secret_key(str(k))
        }
    return kept, dropped


def offline_spec(spec: RouterSpec) -> RouterSpec:
    """``spec`` with only local router settings and a memory ledger (see the module docs)."""
    settings, _ = local_router_settings(spec.router_settings)
    cost = {**spec.cost, "ledger": "memory"} if spec.cost is not None else None
    return spec.model_copy(update={"router_settings": settings, "cost": cost})
