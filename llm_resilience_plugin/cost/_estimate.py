"""Pre-call estimation: what may serve a call, at what price, and its worst-case cost.

Before every attempt the guard prices each deployment that may serve it and takes the maximum of
prompt tokens counted offline with LiteLLM's ``token_counter`` (plus ``prompt_margin``) times the
input price, plus ``max_tokens`` (or ``default_max_tokens``, or the model's maximum output) times
the output price - so a reservation is never smaller than what the attempt can cost.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from llm_resilience_plugin import _env  # noqa: F401  (offline tokenizers before litellm loads)
from llm_resilience_plugin.cost._prices import (
    Candidate,
    Price,
    PriceBook,
    PriceLike,
    UnknownModelPolicy,
    coerce_price,
    is_number,
)
from llm_resilience_plugin.errors import ConfigError

if TYPE_CHECKING:
    from llm_resilience_plugin.events import DeploymentInfo
    from llm_resilience_plugin.routing._router import ResilientRouter

# The output tokens reserved for a call without max_tokens to a model whose maximum output is
# unknown (no default_max_tokens, nothing in LiteLLM's map or the deployment's model_info): a
# conservative bound (twice gpt-4o's maximum output), so such a fallback never fails mid-outage
# for want of one. ``llm-resilience check`` names the deployments it applies to.
UNKNOWN_MAX_OUTPUT = 32_768

# Deployment modes whose calls produce no output tokens (nothing to bound).
_NO_OUTPUT = frozenset({"embedding", "rerank", "moderation", "audio_transcription"})
_UNIT_MODES = frozenset({"audio_speech", "audio_transcription", "rerank"})

TokenCounter = Callable[[str, list[dict[str, Any]]], int]
PriceResolver = Callable[[str], Any]


@functools.lru_cache(maxsize=512)
def text_counter(model: str) -> Callable[[str], int] | None:
    """LiteLLM's text token counter for ``model``, resolved once: ``litellm.token_counter(model,
    text=...)`` finds the model's tokenizer on every call (~20 of its ~27 us for a short text,
    each attempt of each embedding, text completion or Responses call); counting is the same.
    None when this LiteLLM has no such function (``token_counter`` is used then)."""
    from llm_resilience_plugin._litellm import count_function

    return count_function(model)  # capability token_count_function of the LiteLLM seam


class CostEstimator:
    """Prices the candidates for a call (price book, ``price_resolver``, a bound router's groups)
    and bounds its cost from counted prompt tokens and the output-token ceiling."""

    def __init__(
        self,
        *,
        prices: Mapping[str, PriceLike] | None = None,
        unknown_model: UnknownModelPolicy = "error",
        default_max_tokens: int | None = None,
        prompt_margin: float = 0.1,
        token_counter: TokenCounter | None = None,
    ) -> None:
        if default_max_tokens is not None and (
            isinstance(default_max_tokens, bool)
            or not isinstance(default_max_tokens, int)
            or default_max_tokens <= 0
        ):
            raise ConfigError("default_max_tokens", "must be a positive integer number of tokens")
        self.default_max_tokens = default_max_tokens
        if not is_number(prompt_margin) or prompt_margin < 0:
            raise ConfigError("prompt_margin", "must be a non-negative fraction such as 0.1")
        self.prompt_margin = float(prompt_margin)
        if token_counter is not None and not callable(token_counter):
            raise ConfigError("token_counter", "must be a callable (model, messages) -> int")
        self._token_counter = token_counter
        self.prices = PriceBook(prices, unknown_model)
        self._router: ResilientRouter | None = None
        self.unbounded: list[str] = []  # deployments of the bound router reserved UNKNOWN_MAX_OUTPUT
        self._resolver: PriceResolver | None = None

    def set_sources(
        self,
        *,
        price_resolver: PriceResolver | ResilientRouter | None = None,
        router: ResilientRouter | None = None,
        models: Iterable[str] = (),
    ) -> None:
        """Where model names get prices beyond the price book (a resolver callable, or a router
        whose groups they may name); ``models`` and the router's deployments are priced now."""
        if price_resolver is not None:
            if hasattr(price_resolver, "deployments") and hasattr(price_resolver, "model_groups"):
                router = router or price_resolver  # type: ignore[assignment]
            elif callable(price_resolver):
                self._resolver = price_resolver
            else:
                raise ConfigError(
                    "price_resolver", "expected a callable model -> price, or a ResilientRouter"
                )
        if isinstance(models, str):
            models = [models]
        for m in models:
            self.prices.for_model(m)
        if router is not None:
            self.bind_router(router)

    def bind_router(self, router: ResilientRouter) -> None:
        """Price every deployment of ``router`` now (``ConfigError`` for an unknown price under
        ``unknown_model="error"``) and let the LangChain handler map its group names to them."""
        self.unbounded = self.check_deployments(router.deployments())
        self._router = router

    def check_deployments(self, deployments: Iterable[DeploymentInfo]) -> list[str]:
        """Price each deployment (``ConfigError`` for an unknown price under
        ``unknown_model="error"``, as :meth:`bind_router`); the ids with no bound on output."""
        from llm_resilience_plugin.cost._operations import image_price, unit_priced

        unbounded: list[str] = []
        for d in deployments:
            mode = (d.params or {}).get("mode")
            if mode == "image_generation":
                image_price(d, None, None)  # priced per image, not per token
                continue
            if (mode is None or mode in _UNIT_MODES) and unit_priced(d):
                continue  # priced per character, second or query (speech, transcription, rerank)
            price = self.prices.for_deployment(d)
            if mode not in _NO_OUTPUT and self.default_max_tokens is None and not price.max_output_tokens:
                # Bounded by UNKNOWN_MAX_OUTPUT when a call sets no max_tokens (check warns).
                unbounded.append(d.id)
        return unbounded

    def count_prompt_tokens(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]] | None = None,
        *,
        text: str | None = None,
        tools: Any = None,
    ) -> int:
        """Prompt tokens, offline: the injected counter, else LiteLLM's ``token_counter``
        (images at its default count - no download), else ``ceil(chars / 3)``."""
        msgs = [dict(m) for m in messages] if messages is not None else None
        if self._token_counter is not None and msgs is not None:
            return int(self._token_counter(model, msgs))
        import litellm

        try:
            if msgs is not None:
                return int(
                    litellm.token_counter(
                        model=model,
                        messages=msgs,
                        tools=tools or None,
                        use_default_image_token_count=True,
                    )
                )
            counter = None if litellm.disable_token_counter else text_counter(model)
            if counter is not None:
                return int(counter(text or ""))
            return int(litellm.token_counter(model=model, text=text or ""))
        except Exception:
            import json

            raw = json.dumps(msgs, default=str) if msgs is not None else (text or "")
            return math.ceil(len(raw) / 3) + 8

    def _output_tokens(self, max_tokens: Any, n: Any, price: Price, model: str | None) -> int:
        if is_number(max_tokens) and max_tokens >= 0:  # 0: no output (embeddings, images)
            out = int(max_tokens)
        elif self.default_max_tokens is not None:
            out = self.default_max_tokens
        elif price.max_output_tokens:
            out = price.max_output_tokens
        else:
            out = UNKNOWN_MAX_OUTPUT
        copies = int(n) if is_number(n) and n >= 1 else 1
        return out * copies

    def estimate(
        self,
        candidates: Sequence[Candidate],
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        text: str | None = None,
        tools: Any = None,
        max_tokens: Any = None,
        n: Any = None,
        prompt_tokens: int | None = None,
    ) -> tuple[float, int, int, str]:
        """Worst-case cost over ``candidates`` = ``(key, model, price)``; returns
        ``(dollars, prompt_tokens, output_tokens, key of the worst candidate)``."""
        counted: dict[str, int] = {}
        worst: tuple[float, int, int, str] | None = None
        for key, model, price in candidates:
            if prompt_tokens is not None:
                pt = prompt_tokens
            else:
                if model not in counted:
                    counted[model] = self.count_prompt_tokens(model, messages, text=text, tools=tools)
                pt = math.ceil(counted[model] * (1 + self.prompt_margin))
            out = self._output_tokens(max_tokens, n, price, model)
            cost = price.cost(pt, out)
            if worst is None or cost > worst[0]:
                worst = (cost, pt, out, key)
        if worst is None:
            raise ConfigError("model", "no deployment or model to price")
        return worst

    def candidates_for_deployments(self, deployments: Iterable[DeploymentInfo]) -> list[Candidate]:
        """Each deployment as ``(id, model, its price)`` (``base_model`` names the model when set)."""
        out = []
        for d in deployments:
            params = d.params or {}
            model = str(params.get("base_model") or d.model)
            out.append((d.id, model, self.prices.for_deployment(d)))
        return out

    def candidates_for_model(self, model: str, *, provider: str | None = None) -> list[Candidate]:
        """What a model name (as a LangChain model reports it) costs: the ``price_resolver``,
        then a bound router's group of that name, then the price book."""
        if self._resolver is not None:
            got = self._resolver(model)
            if got is not None:
                items = got if isinstance(got, list) else [got]
                out = []
                for i, item in enumerate(items):
                    if hasattr(item, "params") and hasattr(item, "model_group"):
                        out.extend(self.candidates_for_deployments([item]))
                    else:
                        p = coerce_price(item, "price_resolver", source="resolver", model=model)
                        out.append((model if len(items) == 1 else f"{model}#{i}", model, p))
                if out:
                    return out
        router = self._router
        if router is not None and model in router.model_groups:
            return self.candidates_for_deployments(router.deployments(model))
        return [(model, model, self.prices.for_model(model, provider=provider))]
