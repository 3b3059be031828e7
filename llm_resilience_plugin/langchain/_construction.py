"""Building the router spec of a :class:`ResilientChatModel` that owns its router, and telling
whether its config may be serialized (no literal credentials in it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import SecretStr

from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.policy import (
    ClassPolicy,
    ResiliencePolicy,
    RouterSpec,
    build_spec,
    load_config,
    spec_from_mapping,
)

SECRET_WORDS = ("key", "secret", "token", "password", "credential")
"""Substrings of a config key that mark its string value as a credential."""


def apply_max_retries(policy: ResiliencePolicy, n: int) -> ResiliencePolicy:
    """Set every retried error class's ``max_retries`` to ``n`` (failover/fail classes unchanged)."""

    def remap(classes: Mapping[Any, ClassPolicy]) -> dict[Any, ClassPolicy]:
        """The classes with ``max_retries`` replaced on those whose action is ``retry``."""
        return {
            k: (cp.model_copy(update={"max_retries": n}) if cp.action == "retry" else cp)
            for k, cp in classes.items()
        }

    groups = {name: g.model_copy(update={"classes": remap(g.classes)}) for name, g in policy.groups.items()}
    return policy.model_copy(update={"classes": remap(policy.classes), "groups": groups})


def has_literal_secret(value: Any) -> bool:
    """Does a config/model_list hold a credential literally (not as ``os.environ/NAME``)?"""
    if isinstance(value, Mapping):
        for k, v in value.items():
            name = str(k).lower().replace("per_token", "")
            if isinstance(v, str) and any(w in name for w in SECRET_WORDS):
                if v and not v.startswith("os.environ/"):
                    return True
            elif has_literal_secret(v):
                return True
        return False
    if isinstance(value, list | tuple):
        return any(has_literal_secret(v) for v in value)
    return False


def build_router_spec(
    *,
    model_list: list[dict[str, Any]] | None,
    config: str | Mapping[str, Any] | None,
    policy: dict[str, Any] | None,
    fallbacks: list[dict[str, Any]] | dict[str, Any] | None,
    router_settings: dict[str, Any] | None,
    api_key: SecretStr | None,
    max_retries: int | None,
) -> RouterSpec:
    """The spec of a router built from a ``model_list`` or a config, with the model's ``api_key``
    filling keyless deployments and its ``max_retries`` applied to the policy."""
    if model_list is not None:
        spec = build_spec(model_list, router_settings=router_settings, policy=policy, fallbacks=fallbacks)
    else:
        for name, value in (
            ("policy", policy),
            ("fallbacks", fallbacks),
            ("router_settings", router_settings),
        ):
            if value is not None:
                raise ConfigError(name, "goes in the config's resilience/router_settings sections")
        spec = spec_from_mapping(config) if isinstance(config, Mapping) else load_config(str(config))
    update: dict[str, Any] = {}
    if api_key is not None:
        key = api_key.get_secret_value()
        update["model_list"] = [
            d
            if (d.get("litellm_params") or {}).get("api_key")
            else {**d, "litellm_params": {**d["litellm_params"], "api_key": key}}
            for d in spec.model_list
        ]
    if max_retries is not None:
        update["policy"] = apply_max_retries(spec.policy, max_retries)
    return spec.model_copy(update=update) if update else spec
