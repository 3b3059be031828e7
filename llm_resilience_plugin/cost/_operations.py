"""What the cost guard reserves for the router's other operations: embeddings (input tokens only),
text completions and Responses calls (input tokens + the output limit), image generations (per
image). Chat calls keep the guard's own path; settlement is the same for all (the provider's
reported cost, else usage x price, else the estimate).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from llm_resilience_plugin.cost._prices import Candidate, Price
from llm_resilience_plugin.errors import ConfigError

if TYPE_CHECKING:
    from llm_resilience_plugin.events import DeploymentInfo


def _number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
    return float(value) if ok else None


# The Price.source of a per-image candidate: its "input token" is one image.
PER_IMAGE = "per_image"


def payload_text(payload: Any) -> str:
    """The text a non-chat payload sends (strings joined; token ids and items as JSON)."""
    if isinstance(payload, str):
        return payload
    if isinstance(payload, list) and all(isinstance(x, str) for x in payload):
        return "\n".join(payload)
    return json.dumps(payload, default=str)


def image_price(d: DeploymentInfo, size: Any, quality: Any) -> float:
    """Dollars per image of a deployment: ``model_info.output_cost_per_image``, else LiteLLM's
    price map (per image, or per pixel of ``size``); a ConfigError naming the field if unknown."""
    import litellm

    params = d.params or {}
    own = _number(params.get("output_cost_per_image"))
    if own is not None:
        return own
    model = str(params.get("base_model") or params.get("model") or d.model)
    base = model.split("/", 1)[-1]
    size_s = size if isinstance(size, str) and "x" in size else "1024x1024"
    quality_s = quality if isinstance(quality, str) and quality in ("hd", "standard") else "standard"
    names = [model, base, f"{quality_s}/{size_s.replace('x', '-x-')}/{base}"]
    for name in names:
        info = litellm.model_cost.get(name)
        if not isinstance(info, Mapping):
            continue
        per_image = _number(info.get("output_cost_per_image"))
        if per_image is not None:
            return per_image
        per_pixel = _number(info.get("input_cost_per_pixel"))
        if per_pixel is not None:
            w, _, h = size_s.partition("x")
            if w.isdigit() and h.isdigit():
                return per_pixel * int(w) * int(h)
    raise ConfigError(
        f"model_list[{d.id}].model_info.output_cost_per_image",
        f"no per-image price for {model!r} in LiteLLM's price map: set output_cost_per_image "
        "(dollars per image) on the deployment so the cost guard can reserve image generations",
    )


def reserve_arguments(
    operation: str,
    payload: Any,
    kwargs: Mapping[str, Any],
    deployments: Sequence[DeploymentInfo],
    candidates: Callable[[], list[Candidate]],
) -> dict[str, Any]:
    """``CostGuard.reserve`` keyword arguments for one attempt of ``operation`` (not chat)."""
    if operation == "image_generation":
        n = _number(kwargs.get("n"))
        images = int(n) if n is not None and n >= 1 else 1
        per_image = [
            (d.id, d.model, Price(image_price(d, kwargs.get("size"), kwargs.get("quality")), 0.0, PER_IMAGE))
            for d in deployments
        ]
        return {"candidates": per_image, "prompt_tokens": images, "max_tokens": 0}
    text = payload_text(payload)
    if operation == "embedding":
        return {"candidates": candidates(), "text": text, "max_tokens": 0}
    limit = kwargs.get("max_output_tokens") if operation == "responses" else kwargs.get("max_tokens")
    return {"candidates": candidates(), "text": text, "max_tokens": limit, "n": kwargs.get("n")}


def images_made(response: Any) -> int | None:
    """How many images an image response holds (what a per-image ticket settles on)."""
    data = getattr(response, "data", None)
    return len(data) if isinstance(data, list) else None
