"""Validated configuration: the resilience policy, and a LiteLLM Router config that carries it.

Everything a user can get wrong is checked here, before a request is sent, and reported as a
:class:`ConfigError` that names the field and says how to fix it.
"""

from llm_resilience_plugin.policy._models import (
    STREAM_TIMEOUT_DEFAULT,
    Action,
    BackoffPolicy,
    BreakerPolicy,
    ClassKey,
    ClassPolicy,
    DegradationPolicy,
    DeploymentLimits,
    EffectivePolicy,
    GroupPolicy,
    HedgePolicy,
    LevelDegradation,
    PacingPolicy,
    ResiliencePolicy,
    RetryBudgetPolicy,
    SharedStatePolicy,
    TierPolicy,
)
from llm_resilience_plugin.policy._observability import ObservabilityPolicy, ObservabilitySwitch
from llm_resilience_plugin.policy._spec import (
    OWNED_ROUTER_SETTINGS,
    TOP_LEVEL_KEYS,
    FallbackMap,
    RouterSpec,
    build_policy,
    build_spec,
    config_problems,
    load_config,
    read_config,
    router_setting_names,
    spec_from_mapping,
    spec_problems,
)

__all__ = [
    "OWNED_ROUTER_SETTINGS",
    "STREAM_TIMEOUT_DEFAULT",
    "TOP_LEVEL_KEYS",
    "Action",
    "BackoffPolicy",
    "BreakerPolicy",
    "ClassKey",
    "ClassPolicy",
    "DegradationPolicy",
    "DeploymentLimits",
    "EffectivePolicy",
    "FallbackMap",
    "GroupPolicy",
    "HedgePolicy",
    "LevelDegradation",
    "ObservabilityPolicy",
    "ObservabilitySwitch",
    "PacingPolicy",
    "ResiliencePolicy",
    "RetryBudgetPolicy",
    "RouterSpec",
    "SharedStatePolicy",
    "TierPolicy",
    "build_policy",
    "build_spec",
    "config_problems",
    "load_config",
    "read_config",
    "router_setting_names",
    "spec_from_mapping",
    "spec_problems",
]
