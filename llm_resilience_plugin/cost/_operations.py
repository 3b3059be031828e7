"""What the cost guard reserves for the router's other operations: embeddings and moderations
(input tokens only), text completions (input tokens + the output limit per prompt and per
``n``/``best_of`` completion) and Responses calls (input and instructions tokens +
``max_output_tokens``), image generations (per image, by size and quality), and per unit where
LiteLLM's price map prices one: speech per input character, transcription per second of audio
(estimated from the upload's size at 16 kbit/s, the lowest common speech bitrate, so rather too
much than too little), rerank per query (a Cohere search unit: up to 100 documents); else by
tokens of the text sent. Chat calls keep the guard's own path; settlement
is the same for all (the provider's reported cost, else usage x price, else the estimate).
"""

from __future__ import annotations

import json
import math
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
# The Price.source of a per-unit candidate (a character, a second, a query): settled from the
# provider's reported cost, else the estimate.
PER_UNIT = "per_unit"

# The price-map field that prices one unit of each unit-priced operation.
UNIT_FIELDS = {
    "speech": "input_cost_per_character",
    "transcription": "input_cost_per_second",
    "rerank": "input_cost_per_query",
}
_AUDIO_BYTES_PER_SECOND = 2000  # 16 kbit/s
_DOCUMENTS_PER_QUERY = 100  # Cohere's search unit


def unit_price(d: DeploymentInfo, operation: str) -> float | None:
    """Dollars per unit of ``operation`` for a deployment (its own ``model_info`` field, else
    LiteLLM's price map for its model), or None when neither prices one."""
    import litellm

    field = UNIT_FIELDS.get(operation)
    if field is None:
        return None
    params = d.params or {}
    own = _number(params.get(field))
    if own is not None:
        return own
    model = str(params.get("base_model") or params.get("model") or d.model)
    for name in (model, model.rpartition("/")[2]):
        info = litellm.model_cost.get(name)
        if isinstance(info, Mapping):
            price = _number(info.get(field))
            if price is not None:
                return price
    return None


def unit_priced(d: DeploymentInfo) -> bool:
    """Is the deployment priced per character, second or query (not per token)?"""
    return any(unit_price(d, op) is not None for op in UNIT_FIELDS)


def units(operation: str, payload: Any, kwargs: Mapping[str, Any]) -> int:
    """How many units an attempt of a unit-priced operation is billed (at least one)."""
    if operation == "speech":
        return max(1, len(payload) if isinstance(payload, str) else 1)
    if operation == "transcription":
        data = payload[1] if isinstance(payload, tuple) and len(payload) > 1 else payload
        size = len(data) if isinstance(data, bytes | bytearray) else 0
        return max(1, math.ceil(size / _AUDIO_BYTES_PER_SECOND))
    documents = kwargs.get("documents")
    count = len(documents) if isinstance(documents, list) else 1
    return max(1, math.ceil(count / _DOCUMENTS_PER_QUERY))


def _sent_text(operation: str, payload: Any, kwargs: Mapping[str, Any]) -> str:
    """The text a speech, rerank or transcription attempt sends (for a per-token price)."""
    if operation == "rerank":
        docs = kwargs.get("documents") or []
        return "\n".join(
            [str(payload), *(d if isinstance(d, str) else json.dumps(d, default=str) for d in docs)]
        )
    if operation == "transcription":
        prompt = kwargs.get("prompt")
        return prompt if isinstance(prompt, str) else ""
    return payload if isinstance(payload, str) else ""


def payload_text(payload: Any) -> str:
    """The text a non-chat payload sends (strings joined; token ids and items as JSON)."""
    if isinstance(payload, str):
        return payload
    if isinstance(payload, list) and all(isinstance(x, str) for x in payload):
        return "\n".join(payload)
    return json.dumps(payload, default=str)


# Image qualities LiteLLM's price map names (DALL-E: standard/hd; gpt-image: low/medium/high).
_QUALITIES = ("standard", "hd", "high", "medium", "low")


def _per_image(info: Any, size: str, sized: bool = False) -> float | None:
    """Dollars per image from one price-map entry: per image, or per pixel of ``size`` (a
    ``W-x-H`` entry, ``sized``, may state it as ``input_cost_per_image``)."""
    if not isinstance(info, Mapping):
        return None
    per_image = _number(info.get("output_cost_per_image"))
    if per_image is None and sized:
        per_image = _number(info.get("input_cost_per_image"))
    if per_image is not None:
        return per_image
    per_pixel = _number(info.get("input_cost_per_pixel"))
    w, _, h = size.partition("x")
    if per_pixel is not None and w.isdigit() and h.isdigit():
        return per_pixel * int(w) * int(h)
    return None


def image_price(d: DeploymentInfo, size: Any, quality: Any) -> float:
    """Dollars per image of a deployment: ``model_info.output_cost_per_image``, else LiteLLM's
    price map for its model at ``size`` and ``quality`` (``quality/W-x-H/model`` entries, per
    image or per pixel; no quality or ``"auto"``: the dearest listed, as the provider picks);
    a ConfigError naming the field if unknown."""
    import litellm

    params = d.params or {}
    own = _number(params.get("output_cost_per_image"))
    if own is not None:
        return own
    model = str(params.get("base_model") or params.get("model") or d.model)
    prefix, _, base = model.rpartition("/")
    size_s = size if isinstance(size, str) and "x" in size else "1024x1024"
    sized = size_s.replace("x", "-x-")
    for name in (model, base):
        price = _per_image(litellm.model_cost.get(name), size_s)
        if price is not None:
            return price
    asked = quality.lower() if isinstance(quality, str) else None
    qualities = [asked] if asked in _QUALITIES else list(_QUALITIES)
    found: list[float] = []
    for q in [*qualities, ""]:  # "": a size-only entry (W-x-H/model)
        keyed = f"{q}/{sized}" if q else sized
        names = [f"{keyed}/{base}"] + ([f"{prefix}/{keyed}/{base}"] if prefix else [])
        for name in names:
            price = _per_image(litellm.model_cost.get(name), size_s, sized=True)
            if price is not None:
                if asked is not None:
                    return price
                found.append(price)
                break
    if found:
        return max(found)
    raise ConfigError(
        f"model_list[{d.id}].model_info.output_cost_per_image",
        f"no per-image price for {model!r} ({size_s}, quality {quality or 'auto'}) in LiteLLM's "
        "price map: set output_cost_per_image (dollars per image) on the deployment so the cost "
        "guard can reserve image generations",
    )


def _prompt_count(payload: Any) -> int:
    """How many prompts a text-completion payload holds (a list of strings or of token lists)."""
    if isinstance(payload, list) and payload and all(isinstance(p, str | list) for p in payload):
        return len(payload)
    return 1


def _token_ids(payload: Any) -> int | None:
    """The exact input tokens of a payload of token ids (one list, or a list of lists), else None."""
    if not isinstance(payload, list) or not payload:
        return None
    if all(isinstance(x, int) and not isinstance(x, bool) for x in payload):
        return len(payload)
    if all(isinstance(x, list) and all(isinstance(t, int) for t in x) for x in payload):
        return sum(len(x) for x in payload)
    return None


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
    if operation in UNIT_FIELDS:
        prices = [unit_price(d, operation) for d in deployments]
        if deployments and all(p is not None for p in prices):
            per_unit = [
                (d.id, d.model, Price(p or 0.0, 0.0, PER_UNIT))
                for d, p in zip(deployments, prices, strict=True)
            ]
            return {
                "candidates": per_unit,
                "prompt_tokens": units(operation, payload, kwargs),
                "max_tokens": 0,
            }
        text = _sent_text(operation, payload, kwargs)
        # a transcription's output is text of unknown length: the model's output limit bounds it
        out = kwargs.get("max_tokens") if operation == "transcription" else 0
        return {"candidates": candidates(), "text": text, "max_tokens": out}
    ids = _token_ids(payload)
    counted: dict[str, Any] = {"prompt_tokens": ids} if ids is not None else {"text": payload_text(payload)}
    if operation in ("embedding", "moderation"):  # input tokens only
        return {"candidates": candidates(), **counted, "max_tokens": 0}
    if operation == "responses":
        instructions = kwargs.get("instructions")
        if isinstance(instructions, str) and "text" in counted:  # sent (and billed) as input too
            counted["text"] = f"{instructions}\n{counted['text']}"
        return {"candidates": candidates(), **counted, "max_tokens": kwargs.get("max_output_tokens")}
    # text completion: every prompt gets n completions (best_of are generated and billed)
    n, best_of = _number(kwargs.get("n")), _number(kwargs.get("best_of"))
    copies = _prompt_count(payload) * int(max(n or 1, best_of or 1, 1))
    return {"candidates": candidates(), **counted, "max_tokens": kwargs.get("max_tokens"), "n": copies}


def images_made(response: Any) -> int | None:
    """How many images an image response holds (what a per-image ticket settles on)."""
    data = getattr(response, "data", None)
    return len(data) if isinstance(data, list) else None
