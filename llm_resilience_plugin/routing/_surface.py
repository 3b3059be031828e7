"""Where each public name of ``litellm.Router`` stands on :class:`ResilientRouter`.

* **resilient**: defined by ``ResilientRouter`` itself, run on the engine (retries, breakers,
  fallbacks, deadlines, cost guard).
* **pass-through**: read from the wrapped Router as is (``router.model_list``,
  ``router.afile_list(...)``): the model list and its lookups, and the endpoints the engine does
  not run. A pass-through call is one request through the wrapped Router, whose own retries,
  fallbacks and cooldowns are off: no resilience.
* **model-list changes**: ``add_deployment``, ``upsert_deployment``, ``delete_deployment`` and
  ``set_model_list``, defined by ``ResilientRouter``: checked as construction checks a model list,
  then made on the wrapped Router with the engine's breakers, paces, policies, dispatch plan and
  the cost guard kept consistent (``routing/_model_list.py``).
* **refused**: calls that would change what else the engine was built from (router settings,
  the routing strategy) raise a ``ConfigError`` saying to build a new router.
* **machinery**: the wrapped Router's routing, cooldown, health and callback internals; the
  plugin makes those decisions, so ``ResilientRouter`` does not offer them (read them on
  ``router.litellm_router``).

``tests/integration/test_router_surface.py`` lists ``litellm.Router``'s public names on the installed
LiteLLM and fails on one that is in none of these, so a new LiteLLM method is noticed.
"""

from __future__ import annotations

import re

# The engine's own operations (ResilientRouter defines them; from_config builds one).
RESILIENT = frozenset(
    {
        "acompletion",
        "completion",
        "aembedding",
        "embedding",
        "atext_completion",
        "text_completion",
        "aimage_generation",
        "image_generation",
        "aresponses",
        "responses",
        "atranscription",
        "transcription",
        "aspeech",
        "speech",
        "amoderation",
        "moderation",
        "arerank",
        "rerank",
        "abatch_completion",
        "abatch_completion_one_model_multiple_requests",
        "abatch_completion_fastest_response",
        "from_config",
    }
)

# The model list and what is read from it.
PASS_THROUGH_NAMES = frozenset(
    {
        "model_list",
        "get_model_list",
        "get_model_names",
        "model_names",
        "deployment_names",
        "get_model_ids",
        "has_model_id",
        "get_model_info",
        "get_deployment",
        "get_deployment_by_model_group_name",
        "get_deployment_model_info",
        "get_all_deployments",
        "get_model_group",
        "get_model_group_info",
        "get_router_model_info",
        "get_model_access_groups",
        "get_model_from_alias",
        "get_model_list_from_model_alias",
        "model_group_alias",
        "resolve_model_name_from_model_id",
        "get_model_listing_info",
        "get_model_group_usage",
        "get_model_group_io_token_usage",
        "get_remaining_model_group_usage",
        "get_configured_display_name",
        "get_configured_mode",
        "get_configured_service_tiers",
        "get_configured_token_limits",
        "default_litellm_params",
        "default_max_parallel_requests",
        "cache_responses",
        "enable_pre_call_checks",
        "model_group_affinity_config",
        "get_settings",
        "register_plugin",
        "observe",
        "flush_cache",
    }
)

# Endpoint families the engine does not run, each passed through (no resilience).
PASS_THROUGH_FAMILIES: dict[str, str] = {
    "files": r"^a?(create_file|file_content|file_delete|file_list)$",
    "batches": r"^a?(create_batch|retrieve_batch|list_batches|cancel_batch)$",
    "fine-tuning": r"^a?(create|retrieve|list|cancel)_fine_tuning_jobs?$",
    "vector stores": r"^a?vector_store_\w+$",
    "videos": r"^a?video_\w+$",
    "containers": r"^a?(create|retrieve|delete|list|upload)_container\w*$",
    "agents": r"^a?(create|get|delete|list)_agents?(_versions)?$",
    "skills": r"^a?(create|get|delete|list)_skills?$",
    "interactions": r"^a?(create|get|delete|cancel)_interaction$",
    "realtime": r"^a?(create_realtime_\w+|realtime_calls|realtime_translation_calls)$",
    "assistants": r"^a?(create_assistants|get_assistants|delete_assistant|create_thread|get_thread|"
    r"get_messages|run_thread)$|^a_add_message$",
    "stored responses": r"^a?(get|delete|cancel|compact)_responses$|^alist_input_items$",
    "other endpoints": r"^a?(ocr|search|image_edit|"
    r"generate_content(_stream)?|adapter_completion|adapter_generate_content|anthropic_messages|"
    r"extraction|guardrail|llm_passthrough_route|systemone)$",
}
_FAMILIES = [(family, re.compile(pattern)) for family, pattern in PASS_THROUGH_FAMILIES.items()]

# Changes to the model list, kept consistent with the engine (ResilientRouter defines them).
MODEL_LIST_CHANGES = frozenset({"add_deployment", "upsert_deployment", "delete_deployment", "set_model_list"})

# Changes to what else the engine was built from (router settings, the routing strategy).
REFUSED = frozenset(
    {
        "update_settings",
        "apply",
        "aapply",
        "apply_default_settings",
        "reset",
        "set_custom_routing_strategy",
    }
)

# The wrapped Router's own routing, retry, cooldown, health and callback machinery (and its
# settings the plugin overrides: retries, fallbacks and cooldowns are the plugin's).
MACHINERY = frozenset(
    """
    TIER_PARAMS_NEVER_DROPPED adaptive_routers add_optional_pre_call_checks adecisions
    allowed_fails allowed_fails_policy are_all_deployments_blocked arefresh_model_info
    arm_routing_read_prefetch async_admit_deployment_turn async_callback_filter_deployments
    async_deployment_callback_on_failure async_function_with_fallbacks
    async_function_with_fallbacks_common_utils async_function_with_retries
    async_get_available_deployment async_get_available_deployment_for_pass_through
    async_get_fully_unhealthy_model_names async_get_healthy_deployments async_pre_routing_hook
    async_routing_strategy_pre_call_checks auto_router_capability_violation auto_routers
    available_guardrail background_health_check_model_groups bind_to_request_logging
    blocked_failure_exempt build cache cached_deployment_model_info cached_model_group_info call
    complexity_routers config_deployments content_policy_fallbacks context_window_fallbacks
    cooldown_cache cooldown_event cooldown_event_on_own_loop cooldown_time cooled_down
    count_realtime_session_success decisions default_cache_time_seconds default_deployment
    deployment_affinity_ttl_seconds deployment_callback_on_failure deployment_callback_on_success
    deployment_is_active_for_environment deployment_latency_map deployment_tracks_usage
    deployment_usable_by_team deployments_for_request deployments_named disable_cooldowns discard
    enable_health_check_routing enable_mid_stream_fallback_continuation enable_tag_filtering
    factory_function fail_calls failure_exits fallback_access_check fallback_budget_check
    fallbacks function_with_fallbacks generate_model_id get_allowed_fails_from_policy
    get_available_deployment get_available_deployment_for_pass_through get_available_guardrail
    get_candidate_model_ids_for_route get_credential_deployment get_deployment_credentials
    get_deployment_credentials_with_provider get_discovered_model_info
    get_fully_blocked_model_names get_model_list_from_routing_groups
    get_model_list_of_routed_group get_num_retries_from_retry_policy get_routable_deployments
    get_routable_upstream_model get_router_deployment_budget_limiter get_routing_group
    get_search_tool_support get_valid_args guardrail_list health
    health_check_ignore_transient_errors health_state_cache increment_deployment_usage_for_response
    init_adaptive_router_deployment init_auto_router_deployment init_complexity_router_deployment
    init_quality_router_deployment initialize_assistants_endpoint initialize_router_endpoints
    io_token_usage_sync is_deployment_blocked is_model_access_group_for_wildcard_route
    is_recognized_model kubernetes_pod_discovery leastbusy_logger log_retry lowesttpm_logger
    make_call map_team_model model_name_to_deployment_indices optional_callbacks
    outcome_callbacks params_sent_to_deployment pattern_router per_user_deployment
    print_deployment priority_header_update prompt_caching_pin_cache provider_budget_config
    provider_default_deployment_ids python_cooldown quality_routers ran_as_request_deployment
    recover_stream recover_stream_sync registry repin_after_success
    replay_model_cost_registrations report_stream_failure report_stream_failure_sync
    report_stream_success report_stream_success_sync resolve_served_model_name
    resolved_litellm_models retire retire_routing_state retry_stream routable_model_group
    routed_name router_budget_logger router_general_settings routing_group_has_alternatives
    routing_groups routing_plugins routing_strategy routing_strategy_init
    routing_strategy_pre_call_checks run_routing_cache_sync schedule_acompletion search_tools
    select serve_through_request_logging served_openai_models service_logged
    session_affinity_repin_on_failover set_optional_pre_call_checks set_response_headers settings
    settings_dict should_include_deployment should_retry_this_error slack_alerting_logger
    split_request_priority stream_policy success_calls sync_deployment_callback_on_success
    tag_filtering_match_any tag_routing_prefix team_model_has_alternatives
    team_model_to_deployment_indices team_pattern_routers team_ptu_ceiling team_public_model_names
    team_public_model_names_of tenacity total_calls track_deployment_pick
    trigger_fallback_cooldown update_redis_cache validate_fallbacks wildcard_route_deployments
    wildcard_routed_models
    """.split()
)


def pass_through_family(name: str) -> str | None:
    """The pass-through family of a public ``litellm.Router`` name, or None."""
    if name in PASS_THROUGH_NAMES:
        return "model list"
    return next((family for family, pattern in _FAMILIES if pattern.match(name)), None)


def standing(name: str) -> str | None:
    """``resilient``, ``model-list change``, ``pass-through``, ``refused`` or ``machinery`` for a
    public name of ``litellm.Router``; None for a name not classified (a new LiteLLM method)."""
    if name in RESILIENT:
        return "resilient"
    if name in MODEL_LIST_CHANGES:
        return "model-list change"
    if name in REFUSED:
        return "refused"
    if pass_through_family(name) is not None:
        return "pass-through"
    return "machinery" if name in MACHINERY else None


__all__ = [
    "MACHINERY",
    "MODEL_LIST_CHANGES",
    "PASS_THROUGH_FAMILIES",
    "PASS_THROUGH_NAMES",
    "REFUSED",
    "RESILIENT",
    "pass_through_family",
    "standing",
]
