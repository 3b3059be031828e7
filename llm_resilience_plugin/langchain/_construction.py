"""Building the router of a :class:`ResilientChatModel` that owns one: its spec, the router shared
by every model with the same configuration (breakers and budgets survive ``configurable_fields``
copies), and how its config may be shown (credentials masked) or serialized (none literal)."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
from collections.abc import Mapping
from typing import Any

from pydantic import SecretStr

from llm_resilience_plugin._redaction import is_secret_key, scrub
from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.policy import (
    ClassPolicy,
    ResiliencePolicy,
    RouterSpec,
    build_spec,
    load_config,
    spec_from_mapping,
)
from llm_resilience_plugin.routing import ResilientRouter

SECRET_WORDS = ("key", "secret", "token", "password", "credential")
"""Substrings of a config key that mark its string value as a credential."""
ENV_PREFIX = "os.environ/"
"""LiteLLM's reference to an environment variable (not a secret itself)."""
MASK = "**********"
"""What a masked credential shows (as pydantic's ``SecretStr`` does)."""


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


def is_credential_key(key: Any) -> bool:
    """Does a config key name a credential (``api_key``, ``aws_secret_access_key``, ...)?"""
    name = str(key).lower().replace("per_token", "")
    return any(w in name for w in SECRET_WORDS) or is_secret_key(str(key))


def is_literal_secret(key: Any, value: Any) -> bool:
    """Is ``value`` a credential written out (not empty, not an ``os.environ/NAME`` reference)?"""
    return (
        isinstance(value, str) and bool(value) and not value.startswith(ENV_PREFIX) and is_credential_key(key)
    )


def has_literal_secret(value: Any) -> bool:
    """Does a config/model_list hold a credential literally (not as ``os.environ/NAME``)?"""
    if isinstance(value, Mapping):
        return any(is_literal_secret(k, v) or has_literal_secret(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(has_literal_secret(v) for v in value)
    return False


def masked(value: Any) -> Any:
    """``value`` as a dump or repr may show it: literal credentials masked, URL credentials,
    registered keys and key-shaped tokens scrubbed; ``os.environ/NAME`` references kept."""
    if isinstance(value, Mapping):
        return {k: MASK if is_literal_secret(k, v) else masked(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(masked(v) for v in value)
    if isinstance(value, list):
        return [masked(v) for v in value]
    if isinstance(value, str):
        return scrub(value)
    return value


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


# -- one router per configuration -----------------------------------------------------------------

_SALT = secrets.token_bytes(16)  # fingerprints are compared in this process only: never a key's hash


def _option_token(value: Any) -> Any:
    """A router option as the fingerprint sees it: plain data by value, objects by identity."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [_option_token(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _option_token(v) for k, v in value.items()}
    return f"{type(value).__qualname__}@{id(value)}"  # kept alive by the entry: ids stay unique


def router_fingerprint(spec: RouterSpec, options: Mapping[str, Any]) -> str:
    """Equal for routers built from equal specs and the same option objects (a keyed hash: it
    reveals nothing of the keys in the spec)."""
    body = json.dumps(
        {"spec": spec.model_dump(mode="json"), "options": _option_token(dict(options))},
        sort_keys=True,
        default=repr,
    )
    return hmac.new(_SALT, body.encode(), hashlib.sha256).hexdigest()


class SharedRouter:
    """The router of one configuration, built on first use and closed with its last user."""

    def __init__(self, key: str, spec: RouterSpec, options: Mapping[str, Any]) -> None:
        self.key = key
        self.spec = spec
        self.options = dict(options)
        self.users = 0
        self.router: ResilientRouter | None = None
        self._lock = threading.Lock()

    def get(self) -> ResilientRouter:
        """The router (built now if this is its first use)."""
        if self.router is None:
            with self._lock:
                if self.router is None:
                    self.router = ResilientRouter.from_spec(self.spec, **self.options)
        return self.router

    def close(self) -> None:
        """Close the router if it was built."""
        with self._lock:
            router, self.router = self.router, None
        if router is not None:
            router.close()


_shared: dict[str, SharedRouter] = {}
_shared_lock = threading.Lock()


class RouterLease:
    """One model's hold on a :class:`SharedRouter` (released once: by ``close()`` or when the
    model is collected)."""

    def __init__(self, entry: SharedRouter) -> None:
        self.entry = entry
        self.released = False

    def router(self) -> ResilientRouter:
        """The shared router."""
        return self.entry.get()

    def release(self) -> None:
        """Give the hold back; the last one closes the router (idempotent)."""
        entry = self.entry
        with _shared_lock:
            if self.released:
                return
            self.released = True
            entry.users -= 1
            last = entry.users <= 0
            if last and _shared.get(entry.key) is entry:
                del _shared[entry.key]
        if last:
            entry.close()

    def __deepcopy__(self, memo: dict[int, Any]) -> RouterLease:
        return self  # a deep-copied model shares the router (and takes its own lease on use)


def lease_router(spec: RouterSpec, options: Mapping[str, Any]) -> RouterLease:
    """A hold on the router of this configuration, shared by every model holding one."""
    key = router_fingerprint(spec, options)
    with _shared_lock:
        entry = _shared.get(key)
        if entry is None:
            entry = _shared[key] = SharedRouter(key, spec, options)
        entry.users += 1
        return RouterLease(entry)
