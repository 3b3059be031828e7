"""Prices: dollars per token for every model and deployment, resolved once and never a silent $0.

Prices come from LiteLLM's bundled price map (offline), overridden per deployment by
``input_cost_per_token`` / ``output_cost_per_token`` (``litellm_params`` or ``model_info``) or per
model by ``CostGuard(prices=...)``. A model with no known price is a :class:`ConfigError` unless
``unknown_model`` says otherwise (``"zero"`` or a fixed price).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from llm_resilience_plugin import _env  # noqa: F401  (offline price map before litellm loads)
from llm_resilience_plugin.errors import ConfigError

if TYPE_CHECKING:
    from llm_resilience_plugin.events import DeploymentInfo


def is_number(x: Any) -> bool:
    """A finite int or float, not a bool: the check every dollar, token and fraction passes."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True, slots=True)
class Price:
    """Dollars per input and per output token. ``source`` says where it came from:
    ``"litellm"`` (bundled price map), ``"deployment"`` (deployment params), ``"override"``
    (``CostGuard(prices=...)``), ``"resolver"`` or ``"unknown_model"`` (the policy)."""

    input_cost_per_token: float
    output_cost_per_token: float
    source: str = "litellm"
    max_output_tokens: int | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        for name in ("input_cost_per_token", "output_cost_per_token"):
            v = getattr(self, name)
            if not is_number(v) or v < 0:
                raise ConfigError(name, f"must be a non-negative number of dollars, got {v!r}")

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """Dollars for this many prompt and completion tokens."""
        return prompt_tokens * self.input_cost_per_token + completion_tokens * self.output_cost_per_token

    @property
    def known(self) -> bool:
        """False when the price is the ``unknown_model`` policy's stand-in, not a real price."""
        return self.source != "unknown_model"


PriceLike = Price | tuple[float, float] | Mapping[str, Any]
UnknownModelPolicy = Literal["error", "zero"] | PriceLike


def coerce_price(value: Any, field_name: str, *, source: str, model: str | None = None) -> Price:
    """A :class:`Price` from a Price, an ``(input, output)`` pair, or a mapping with
    ``input_cost_per_token`` / ``output_cost_per_token`` (either may be omitted as 0)."""
    if isinstance(value, Price):
        return value
    if isinstance(value, tuple | list) and len(value) == 2 and all(is_number(v) for v in value):
        return Price(float(value[0]), float(value[1]), source=source, model=model)
    if isinstance(value, Mapping):
        unknown = set(value) - {"input_cost_per_token", "output_cost_per_token", "max_output_tokens"}
        if unknown or not value:
            raise ConfigError(
                field_name,
                f"unexpected keys {sorted(unknown)}; give input_cost_per_token and "
                "output_cost_per_token (dollars per token)",
            )
        mot = value.get("max_output_tokens")
        return Price(
            float(value.get("input_cost_per_token", 0.0)),
            float(value.get("output_cost_per_token", 0.0)),
            source=source,
            max_output_tokens=int(mot) if mot is not None else None,
            model=model,
        )
    raise ConfigError(
        field_name,
        f"expected a Price, an (input, output) pair of dollars per token, or a mapping with "
        f"input_cost_per_token/output_cost_per_token; got {value!r}",
    )


def _map_names(model: str) -> list[str]:
    """``model`` and the name LiteLLM's price map may know it by: OpenAI's completion-mode models
    (``gpt-3.5-turbo-instruct``, ``davinci-002``) are listed under provider
    ``text-completion-openai``, so ``openai/gpt-3.5-turbo-instruct`` finds no price as is."""
    prefix, _, rest = model.partition("/")
    return [model, f"text-completion-openai/{rest}"] if prefix == "openai" and rest else [model]


def _litellm_info(model: str, provider: str | None = None) -> dict[str, Any] | None:
    """LiteLLM's model info for ``model`` when its bundled map states a price, else None."""
    import litellm

    quiet = litellm.suppress_debug_info
    litellm.suppress_debug_info = True  # get_llm_provider prints to stdout on a miss
    try:
        names = _map_names(model)
        for m, p in [(names[0], provider), *((n, None) for n in names)]:
            try:
                info = litellm.get_model_info(m, custom_llm_provider=p)
            except Exception:
                continue
            # A Router registers every deployment's model with an EMPTY entry, after which
            # get_model_info reports a price of 0 for a model nobody priced: trust only a raw
            # map entry that states a price.
            raw = litellm.model_cost.get(str(info.get("key") or m)) or {}
            if "input_cost_per_token" in raw or "output_cost_per_token" in raw:
                return dict(info)
        return None
    finally:
        litellm.suppress_debug_info = quiet


class PriceBook:
    """Resolves prices, first match wins: deployment params, ``prices`` overrides, LiteLLM's
    bundled map (``base_model`` first when a deployment names one), the ``unknown_model`` policy."""

    def __init__(self, prices: Mapping[str, PriceLike] | None = None, unknown_model: Any = "error") -> None:
        if prices is not None and not isinstance(prices, Mapping):
            raise ConfigError(
                "prices", "expected a mapping of model name -> (input, output) dollars per token"
            )
        self.overrides = {
            str(k): coerce_price(v, f"prices[{k!r}]", source="override", model=str(k))
            for k, v in (prices or {}).items()
        }
        if isinstance(unknown_model, str):
            if unknown_model not in ("error", "zero"):
                raise ConfigError(
                    "unknown_model",
                    f"expected 'error', 'zero' or a fixed price (input, output); got {unknown_model!r}",
                )
            self.unknown_model: str | Price = unknown_model
        else:
            self.unknown_model = coerce_price(unknown_model, "unknown_model", source="unknown_model")
            if self.unknown_model.source != "unknown_model":
                p = self.unknown_model
                self.unknown_model = Price(
                    p.input_cost_per_token,
                    p.output_cost_per_token,
                    "unknown_model",
                    p.max_output_tokens,
                )
        self._cache: dict[tuple[Any, ...], Price] = {}
        self._lock = threading.Lock()

    def for_model(
        self,
        model: str,
        params: Mapping[str, Any] | None = None,
        *,
        provider: str | None = None,
        where: str | None = None,
    ) -> Price:
        """The price of ``model`` under deployment ``params`` (cached; ``where`` names the
        deployment in errors)."""
        params = params or {}
        key = (
            model,
            provider,
            params.get("input_cost_per_token"),
            params.get("output_cost_per_token"),
            params.get("base_model"),
            params.get("max_output_tokens"),
        )
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            return hit
        price = self._resolve(model, params, provider, where)
        with self._lock:
            self._cache[key] = price
        return price

    def _resolve(
        self, model: str, params: Mapping[str, Any], provider: str | None, where: str | None
    ) -> Price:
        names = [n for n in (params.get("base_model"), model) if isinstance(n, str) and n]
        short = [n.split("/", 1)[1] for n in names if "/" in n]
        info: dict[str, Any] | None = None
        for n in names:
            info = _litellm_info(n, provider)
            if info is not None:
                break
        mot: Any = (info.get("max_output_tokens") or info.get("max_tokens")) if info else None
        declared = params.get("max_output_tokens")  # the deployment's model_info says so
        if declared is not None:
            if not is_number(declared) or declared < 1:
                raise ConfigError(
                    "max_output_tokens",
                    f"deployment {where or model!r}: must be a positive number of tokens, got {declared!r}",
                )
            mot = declared
        max_out = int(mot) if is_number(mot) else None
        inp, out = params.get("input_cost_per_token"), params.get("output_cost_per_token")
        if inp is not None or out is not None:
            base_in = (info or {}).get("input_cost_per_token") if inp is None else inp
            base_out = (info or {}).get("output_cost_per_token") if out is None else out
            if base_in is None or base_out is None:
                missing = "output_cost_per_token" if base_out is None else "input_cost_per_token"
                raise ConfigError(
                    missing,
                    f"deployment {where or model!r} sets only one of input_cost_per_token/"
                    f"output_cost_per_token and {model!r} has no bundled price; set both",
                )
            return Price(float(base_in), float(base_out), "deployment", max_out, model)
        for n in [*names, *short]:
            if n in self.overrides:
                o = self.overrides[n]
                return Price(
                    o.input_cost_per_token,
                    o.output_cost_per_token,
                    "override",
                    o.max_output_tokens or max_out,
                    n,
                )
        if info is not None:
            return Price(
                float(info.get("input_cost_per_token") or 0.0),
                float(info.get("output_cost_per_token") or 0.0),
                "litellm",
                max_out,
                model,
            )
        policy = self.unknown_model
        if policy == "zero":
            return Price(0.0, 0.0, "unknown_model", None, model)
        if isinstance(policy, Price):
            return Price(
                policy.input_cost_per_token,
                policy.output_cost_per_token,
                "unknown_model",
                policy.max_output_tokens,
                model,
            )
        raise ConfigError(
            "unknown_model",
            f"no price known for model {model!r}"
            + (f" (deployment {where!r})" if where and where != model else "")
            + "; set input_cost_per_token/output_cost_per_token in its litellm_params or "
            "model_info, add it to CostGuard(prices={...}), or choose unknown_model='zero' or a "
            "fixed price (input, output)",
        )

    def for_deployment(self, d: DeploymentInfo) -> Price:
        """The price of one router deployment, from its ``litellm_params``/``model_info``."""
        params = d.params or {}
        provider = params.get("custom_llm_provider")
        return self.for_model(
            str(params.get("model") or d.model),
            params,
            provider=provider if isinstance(provider, str) else None,
            where=d.id,
        )


# What may serve a call: (deployment id or model name, model, its Price).
Candidate = tuple[str, str, Price]


def settled_cost(
    price: Price,
    *,
    reported: Any,
    prompt_tokens: int | None,
    completion_tokens: int | None,
    estimate: float,
) -> tuple[float, bool]:
    """What an attempt cost: the provider's ``reported`` figure, else usage x ``price``, else the
    ``estimate`` (nothing known: conservative). Returns ``(dollars, True if it is the estimate)``."""
    has_usage = prompt_tokens is not None or completion_tokens is not None
    computed = price.cost(int(prompt_tokens or 0), int(completion_tokens or 0)) if has_usage else None
    free = price.input_cost_per_token == 0 and price.output_cost_per_token == 0
    # A reported 0 is believed only when our own figure agrees (LiteLLM reports 0 for a
    # model it cannot price - e.g. under a fixed unknown_model price).
    if (
        reported is not None
        and is_number(reported)
        and reported >= 0
        and (reported > 0 or computed == 0 or (computed is None and free))
    ):
        return float(reported), False
    if computed is not None:
        return computed, False
    return estimate, True
