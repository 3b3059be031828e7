"""What the cost guard reserves for the router's other operations, from LiteLLM's bundled price map
(offline): OpenAI completion-mode models under their ``openai/`` name, images by size and quality,
prompts x ``n``/``best_of`` for text completions, instructions for Responses, token-id inputs."""

from __future__ import annotations

from typing import Any

import pytest

from llm_resilience_plugin.cost._operations import image_price, reserve_arguments
from llm_resilience_plugin.cost._prices import PriceBook
from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.events import DeploymentInfo


def dep(model: str, **params: Any) -> DeploymentInfo:
    return DeploymentInfo(
        id="d", model_group="g", model=model, api_base=None, params={"model": model, **params}
    )


@pytest.mark.parametrize(
    ("model", "inp", "out"),
    [
        ("openai/gpt-3.5-turbo-instruct", 1.5e-06, 2e-06),  # listed as text-completion-openai
        ("text-completion-openai/gpt-3.5-turbo-instruct", 1.5e-06, 2e-06),
        ("openai/davinci-002", 2e-06, 2e-06),
        ("openai/text-embedding-3-small", 2e-08, 0.0),
        ("openai/gpt-4o-mini", 1.5e-07, 6e-07),  # a chat model keeps its own entry
    ],
)
def test_completion_and_embedding_models_are_priced_from_litellms_map(model, inp, out):
    price = PriceBook().for_deployment(dep(model, custom_llm_provider=None))
    assert (price.input_cost_per_token, price.output_cost_per_token, price.source) == (inp, out, "litellm")


def test_a_completion_model_is_bounded_by_its_maximum_output():
    assert PriceBook().for_deployment(dep("openai/gpt-3.5-turbo-instruct")).max_output_tokens == 4096


def test_an_unknown_openai_model_is_still_refused():
    with pytest.raises(ConfigError):
        PriceBook().for_deployment(dep("openai/no-such-model"))


def _map_price(key: str, pixels: int) -> float:
    """An image's price from LiteLLM's bundled map (its per-pixel price times the pixels)."""
    import litellm

    return float(litellm.model_cost[key]["input_cost_per_pixel"]) * pixels


@pytest.mark.parametrize(
    ("model", "size", "quality", "dollars"),
    [
        # per pixel of 1024x1024, at the price of LiteLLM's bundled map (1.105.0: $0.040; 1.105.7 and
        # later: $0.044)
        ("azure/dall-e-3", None, "standard", _map_price("azure/standard/1024-x-1024/dall-e-3", 1024 * 1024)),
        ("azure/dall-e-3", "1024x1792", "hd", _map_price("azure/hd/1024-x-1792/dall-e-3", 1024 * 1792)),
        ("openai/gpt-image-1", "1024x1536", "low", 0.016),
        ("openai/gpt-image-1", None, None, 0.167),  # no quality: the dearest listed (high)
        ("openai/gpt-image-1", None, "auto", 0.167),
        ("openai/gpt-image-1.5", None, "medium", 0.034),  # stated as input_cost_per_image
    ],
)
def test_images_are_priced_by_size_and_quality(model, size, quality, dollars):
    assert image_price(dep(model), size, quality) == pytest.approx(dollars, rel=1e-3)


def test_an_image_model_without_a_price_names_the_field():
    with pytest.raises(ConfigError) as ei:
        image_price(dep("openai/no-such-image-model"), None, None)
    assert "output_cost_per_image" in str(ei.value)
    assert image_price(dep("openai/no-such-image-model", output_cost_per_image=0.5), None, "hd") == 0.5


def test_text_completion_reserves_every_prompt_times_n_or_best_of():
    args = reserve_arguments("text_completion", ["a", "b"], {"n": 2, "max_tokens": 10}, [], list)
    assert args["n"] == 4 and args["max_tokens"] == 10
    assert reserve_arguments("text_completion", "a", {"best_of": 3, "n": 1}, [], list)["n"] == 3
    assert reserve_arguments("text_completion", [1, 2, 3], {}, [], list)["n"] == 1  # one prompt of ids


def test_embeddings_reserve_input_tokens_only_and_count_token_ids_exactly():
    args = reserve_arguments("embedding", [[1, 2, 3], [4, 5]], {}, [], list)
    assert args["prompt_tokens"] == 5 and args["max_tokens"] == 0 and "text" not in args
    assert reserve_arguments("embedding", ["x", "y"], {}, [], list)["text"] == "x\ny"


def test_responses_count_the_instructions_as_input():
    args = reserve_arguments(
        "responses", "hi", {"instructions": "be brief", "max_output_tokens": 5}, [], list
    )
    assert args["text"] == "be brief\nhi" and args["max_tokens"] == 5


@pytest.mark.parametrize(
    "model",
    ["openai/text-embedding-3-small", "openai/gpt-3.5-turbo-instruct", "gpt-4o-mini", "claude-3-5-haiku"],
)
def test_the_cached_text_counter_counts_as_litellms_token_counter(model):
    import litellm

    from llm_resilience_plugin.cost._estimate import text_counter

    counter = text_counter(model)
    assert counter is not None
    for text in ("Say hello", "The quick brown fox\njumps over the lazy dog. " * 40, "héllo wörld ✓"):
        assert counter(text) == litellm.token_counter(model=model, text=text)
