"""Which dispatcher serves each model group, and why: the configs a direct attempt reproduces
(router settings, deployment params, model info) and the reason a group stays on the Router.

The reasons are what ``llm-resilience check`` prints per group (``docs/how-a-call-flows.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import litellm

from llm_resilience_plugin import _litellm
from llm_resilience_plugin._engine.attempt import deployment_id_of
from llm_resilience_plugin.errors import ConfigError

# Router settings a direct attempt reproduces (the rest, e.g. routing_groups, plugins, tag
# filtering, pre-call checks, budgets, aliases, redis usage counters, send through the Router).
DIRECT_ROUTER_SETTINGS = frozenset(
    {
        "timeout",
        "stream_timeout",
        "default_max_parallel_requests",
        "set_verbose",
        "debug_level",
        "routing_strategy",  # "simple-shuffle" only: checked below
        "client_ttl",
        "cache_responses",  # False only: checked below
        "max_fallbacks",  # the plugin's own fallbacks: the Router has none
        "fallbacks",
        "context_window_fallbacks",
        "content_policy_fallbacks",
        "default_fallbacks",
        "retry_after",
        "default_litellm_params",  # merged by the Router's own shaping functions
    }
)

# Deployment params a direct attempt reproduces: every value the Router passes through to
# ``litellm.acompletion`` unchanged, and the flags its registry adds. rpm/tpm (usage counted into
# x-ratelimit-* headers), tags, credentials by name, silent experiments, pod discovery, order,
# mock responses and provider-specific routing stay with the Router.
DIRECT_PARAMS = frozenset(
    {
        "model",
        "api_base",
        "api_key",
        "api_version",
        "organization",
        "custom_llm_provider",
        "timeout",
        "stream_timeout",
        "max_retries",
        "weight",
        "max_parallel_requests",
        "input_cost_per_token",
        "output_cost_per_token",
        "extra_headers",
        "temperature",
        "max_tokens",
        "top_p",
        "seed",
        "drop_params",
        # added by the Router's registry to every deployment
        "allow_client_keepalive_override",
        "use_in_pass_through",
        "use_litellm_proxy",
        "use_xai_oauth",
        "merge_reasoning_content_in_choices",
    }
)
DIRECT_MODEL_INFO = frozenset(
    {
        "id",
        "db_model",
        "member_auto_router",
        "input_cost_per_token",
        "output_cost_per_token",
        "max_tokens",
        "max_input_tokens",
        "max_output_tokens",
        "mode",
        "description",
        # the other operations' own (compared in tests/integration/test_direct_operations.py)
        "base_model",
        "output_cost_per_image",
        "output_vector_size",
        "max_embedding_batch_size",
    }
)

DISPATCH_MODES = ("auto", "router", "direct")

# Deployment limits whose per-minute usage the Router counts. A direct attempt reports into the
# same counters (:mod:`._direct_usage`, proven equal by tests/integration/test_direct_usage.py),
# so such groups go direct; False sends them back through the Router.
USAGE_DIRECT = True  # and only where the LiteLLM seam finds ``usage_counting``
USAGE_PARAMS = frozenset({"rpm", "tpm"})


@dataclass(frozen=True, slots=True)
class GroupDispatch:
    """Which dispatcher serves one model group, and why."""

    dispatcher: str  # "direct" or "router"
    reason: str


def _deployment_reason(d: Mapping[str, Any]) -> str | None:
    """Why one deployment must go through the Router (None: direct reproduces it)."""
    params = d.get("litellm_params") or {}
    info = d.get("model_info") or {}
    counted = USAGE_DIRECT and _litellm.internals().has("usage_counting")
    extra = sorted(k for k in params if k not in DIRECT_PARAMS and not (counted and k in USAGE_PARAMS))
    if extra:
        if set(extra) <= USAGE_PARAMS:
            if USAGE_DIRECT and _litellm.internals().has("direct_dispatch"):
                _litellm.internals().warn_missing("usage_counting")
            return (
                f"deployment {deployment_id_of(d)} sets {', '.join(extra)} (its per-minute usage is "
                "counted in the Router; direct counting into the same counters is not available)"
            )
        return f"deployment {deployment_id_of(d)} sets {', '.join(extra)} (only the Router reproduces it)"
    if "*" in str(d.get("model_name")) or "*" in str(params.get("model")):
        return f"deployment {deployment_id_of(d)} is a wildcard route"
    other = sorted(k for k in info if k not in DIRECT_MODEL_INFO and not str(k).startswith("supports_"))
    if other:
        return f"deployment {deployment_id_of(d)} sets model_info {', '.join(other)}"
    return None


_SHARED_STORE = (
    "the Router shares its usage counters, cooldowns and parallel-request slots through Redis; "
    "direct attempts are not proven against that shared store"
)
# Why a router setting keeps every group on the Router, where more can be said than "only the
# Router reproduces it".
SETTING_REASONS = {
    "redis_url": _SHARED_STORE,
    "redis_host": _SHARED_STORE,
    "redis_port": _SHARED_STORE,
    "redis_password": _SHARED_STORE,
    "cache_kwargs": _SHARED_STORE,
    "enable_pre_call_checks": "the Router's pre-call checks filter its own pick",
}


def _router_streams(deps: list[Mapping[str, Any]], settings: Mapping[str, Any]) -> str:
    """What of a direct group still streams through the Router, said in its plan."""
    held = [
        deployment_id_of(d)
        for d in deps
        if (d.get("litellm_params") or {}).get("max_parallel_requests")
        or settings.get("default_max_parallel_requests")
    ]
    if not held:
        return ""
    return (
        f"; streams on {', '.join(held)} through the Router (a max_parallel_requests slot held "
        "for the whole stream)"
    )


def dispatch_plan(
    router: litellm.Router,
    settings: Mapping[str, Any],
    mode: str,
    deployments: list[dict[str, Any]] | None = None,
) -> dict[str, GroupDispatch]:
    """Per model group, the dispatcher the policy's ``dispatch`` mode gives it and why.

    ``auto``: direct where equivalence with the Router is proven for the group's config; ``router``:
    always the Router; ``direct``: like auto, but a group that cannot be direct is a ConfigError.
    ``deployments``: a model list to plan instead of the Router's own (checked before a change).
    """
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for d in _litellm.deployments_of(router) if deployments is None else deployments:
        groups.setdefault(str(d["model_name"]), []).append(d)
    if mode == "router":
        return {g: GroupDispatch("router", "policy dispatch: router") for g in groups}
    global_reason: str | None = None
    extra = sorted(k for k in settings if k not in DIRECT_ROUTER_SETTINGS)
    if extra:
        why = next(
            (SETTING_REASONS[k] for k in extra if k in SETTING_REASONS), "only the Router reproduces it"
        )
        global_reason = f"router_settings {', '.join(extra)} ({why})"
    elif settings.get("routing_strategy", "simple-shuffle") != "simple-shuffle":
        global_reason = f"routing_strategy {settings['routing_strategy']!r} keeps state in the Router"
    elif settings.get("cache_responses"):
        global_reason = "router_settings cache_responses (the Router's response cache)"
    elif _litellm.shaping_of(router) is None:
        found = _litellm.internals()
        cap = found.capabilities["direct_dispatch"]
        found.warn_missing("direct_dispatch")
        global_reason = f"litellm {found.version} has no direct_dispatch ({cap.missing})"
    out: dict[str, GroupDispatch] = {}
    for g, deps in groups.items():
        reason = global_reason
        if reason is None:
            reason = next(
                (r for r in (_deployment_reason(d) for d in deps) if r),
                None,
            )
        if reason is None:
            why = "equivalent to the Router for this config (simple-shuffle)" + _router_streams(
                deps, settings
            )
            out[g] = GroupDispatch("direct", why)
        else:
            out[g] = GroupDispatch("router", reason)
    if mode == "direct":
        refused = {g: p.reason for g, p in out.items() if p.dispatcher != "direct"}
        if refused:
            g, why = next(iter(refused.items()))
            raise ConfigError("resilience.dispatch", f"'direct' is not equivalent for group {g!r}: {why}")
    return out


__all__ = [
    "DIRECT_MODEL_INFO",
    "DIRECT_PARAMS",
    "DIRECT_ROUTER_SETTINGS",
    "DISPATCH_MODES",
    "SETTING_REASONS",
    "USAGE_PARAMS",
    "GroupDispatch",
    "dispatch_plan",
]
