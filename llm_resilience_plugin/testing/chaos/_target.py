"""A user's router config pointed at the simulator: each deployment keeps its provider's dialect
where the simulator speaks it, loses its secrets, and gets its own simulator deployment.

Also resolves a scenario's selectors (``primary[0]``, ``primary-provider``, ...) to deployments.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from llm_resilience_plugin._redaction import is_call_secret
from llm_resilience_plugin.errors import ConfigError

__all__ = ["DIALECTS", "Deployment", "Target", "provider_of", "simulated_target"]

_ENV_PREFIX = "os.environ/"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
# Deployment parameters that send a request somewhere else, or carry credentials for it.
_ELSEWHERE = frozenset({"base_url", "extra_headers", "headers", "vertex_credentials", "aws_profile_name"})

# provider -> how to point a deployment at the simulator: (params, sim base URL, sim deployment).
# The OpenAI dialect is the fallback for every provider without its own.
Rewrite = Callable[[dict[str, Any], str, str], dict[str, Any]]


def _openai(params: dict[str, Any], base_url: str, name: str) -> dict[str, Any]:
    model = str(params["model"]).split("/", 1)[-1]
    return {**params, "model": f"openai/{model}", "api_base": f"{base_url}/{name}/v1", "api_key": "sk-chaos"}


def _azure(params: dict[str, Any], base_url: str, name: str) -> dict[str, Any]:
    version = params.get("api_version") or "2024-06-01"
    return {**params, "api_base": f"{base_url}/{name}", "api_key": "sk-chaos", "api_version": version}


def _anthropic(params: dict[str, Any], base_url: str, name: str) -> dict[str, Any]:
    # LiteLLM's anthropic/ provider posts to <api_base>/v1/messages: the simulator's Messages dialect.
    return {**params, "api_base": f"{base_url}/{name}", "api_key": "sk-chaos"}


DIALECTS: dict[str, Rewrite] = {"openai": _openai, "azure": _azure, "anthropic": _anthropic}
"""Provider name -> rewrite into the simulator dialect that provider speaks (else OpenAI's)."""


def provider_of(params: Mapping[str, Any]) -> str:
    """The provider LiteLLM would use for a deployment's ``litellm_params`` (``openai`` if unsure)."""
    explicit = params.get("custom_llm_provider")
    if isinstance(explicit, str) and explicit:
        return explicit
    model = str(params.get("model", ""))
    if "/" in model:
        return model.split("/", 1)[0]
    try:
        import litellm

        return str(litellm.get_llm_provider(model=model)[1])
    except Exception:
        return "openai"


@dataclass(frozen=True)
class Deployment:
    """One deployment of the user's config: group, id, provider, and its simulator name."""

    group: str
    id: str
    provider: str
    model: str
    sim_name: str
    dialect: str
    prices: tuple[float, float] | None


@dataclass(frozen=True)
class Target:
    """The user's config pointed at the simulator for one (scenario, system) run."""

    model_list: list[dict[str, Any]]
    deployments: list[Deployment]
    primary: str
    fallbacks: list[str]

    def by_sim_name(self, name: str) -> Deployment | None:
        """The deployment served as simulator deployment ``name``."""
        return next((d for d in self.deployments if d.sim_name == name), None)

    def select(self, selector: str) -> list[Deployment]:
        """The deployments a scenario selector names (``ConfigError`` if it names none)."""
        s = selector.strip()
        in_group = [d for d in self.deployments if d.group == self.primary]
        fallback = [d for d in self.deployments if self.fallbacks and d.group == self.fallbacks[0]]
        indexed = re.fullmatch(r"(primary|fallback)\[(\d+)\]", s)
        found: list[Deployment]
        if indexed:
            pool = in_group if indexed.group(1) == "primary" else fallback
            i = int(indexed.group(2))
            found = [pool[i]] if i < len(pool) else []
        elif s == "primary":
            found = in_group
        elif s == "fallback":
            found = fallback
        elif s == "primary-provider":
            provider = in_group[0].provider if in_group else None
            found = [d for d in self.deployments if d.provider == provider]
        elif s in ("all", "*"):
            found = list(self.deployments)
        elif s.startswith("provider:"):
            found = [d for d in self.deployments if d.provider == s.removeprefix("provider:")]
        elif s.startswith("group:"):
            found = [d for d in self.deployments if d.group == s.removeprefix("group:")]
        elif s.startswith("id:"):
            found = [d for d in self.deployments if d.id == s.removeprefix("id:")]
        else:
            found = [d for d in self.deployments if s in (d.id, d.group)]
        if not found:
            raise ConfigError(
                f"timeline.{selector}",
                "names no deployment of this config (selectors: primary, primary[N], fallback, "
                "fallback[N], primary-provider, all, provider:<p>, group:<g>, id:<id>, or an id/group)",
            )
        return found


def _prices(params: Mapping[str, Any], info: Mapping[str, Any]) -> tuple[float, float] | None:
    for source in (params, info):
        cin, cout = source.get("input_cost_per_token"), source.get("output_cost_per_token")
        if isinstance(cin, (int, float)) and isinstance(cout, (int, float)):
            return float(cin), float(cout)
    return None


def simulated_target(
    model_list: list[dict[str, Any]],
    *,
    base_url: str,
    prefix: str,
    primary: str,
    fallbacks: list[str],
) -> Target:
    """``model_list`` with every deployment pointed at the simulator at ``base_url`` under
    ``<prefix>-<id>``: no secret, no environment lookup, the provider's dialect where spoken."""
    out: list[dict[str, Any]] = []
    deps: list[Deployment] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(model_list):
        group = str(entry["model_name"])
        params = {  # no environment lookup, no credential, no other endpoint than the simulator
            k: v
            for k, v in dict(entry.get("litellm_params") or {}).items()
            if not (isinstance(v, str) and v.startswith(_ENV_PREFIX))
            and k not in _ELSEWHERE
            and not is_call_secret(str(k))
        }  # no credential reaches the simulator, a traceback or a report (the dialect sets a fake key)
        info = dict(entry.get("model_info") or {})
        dep_id = str(info.get("id") or f"{group}-{seen.get(group, 0)}")
        seen[group] = seen.get(group, 0) + 1
        info["id"] = dep_id
        provider = provider_of(entry.get("litellm_params") or {})
        dialect = provider if provider in DIALECTS else "openai"
        name = _UNSAFE.sub("_", f"{prefix}-{dep_id}")
        if not name or len(name) > 200:
            raise ConfigError(f"model_list[{i}].model_info.id", "cannot be served by the simulator")
        simulated = DIALECTS[dialect](params, base_url, name)
        out.append({**entry, "litellm_params": simulated, "model_info": info})
        deps.append(
            Deployment(
                group=group,
                id=dep_id,
                provider=provider,
                model=str(params.get("model", "")),
                sim_name=name,
                dialect=dialect,
                prices=_prices(params, info),
            )
        )
    return Target(model_list=out, deployments=deps, primary=primary, fallbacks=fallbacks)
