"""What the cost guard reserves for speech, transcription, rerank and moderation attempts: per
character, second of audio or query where a price states one, else by tokens of the text sent."""

from __future__ import annotations

from typing import Any

import pytest

import llm_resilience_plugin  # noqa: F401  (LiteLLM offline)
from llm_resilience_plugin.cost._operations import PER_UNIT, reserve_arguments, unit_price, unit_priced, units
from llm_resilience_plugin.events import DeploymentInfo


def dep(model: str, **params: Any) -> DeploymentInfo:
    return DeploymentInfo(
        id="d", model_group="g", model=model, api_base=None, params={"model": model, **params}
    )


def test_unit_prices_come_from_the_deployment_else_litellms_map() -> None:
    assert unit_price(dep("openai/tts-1"), "speech") == pytest.approx(1.5e-05)
    assert unit_price(dep("openai/whisper-1"), "transcription") == pytest.approx(0.0001)
    assert unit_price(dep("cohere/rerank-english-v3.0"), "rerank") == pytest.approx(0.002)
    assert unit_price(dep("openai/whisper-1", input_cost_per_second=0.5), "transcription") == 0.5
    assert unit_price(dep("openai/gpt-4o-mini"), "speech") is None
    assert unit_priced(dep("openai/whisper-1")) and not unit_priced(dep("openai/gpt-4o-mini"))


def test_units_billed() -> None:
    assert units("speech", "hello", {}) == 5
    assert units("transcription", ("a.mp3", b"x" * 4001), {}) == 3  # 16 kbit/s: 2000 bytes a second
    assert units("rerank", "q", {"documents": ["d"] * 250}) == 3  # 100 documents a search unit


def test_a_per_unit_reservation_is_units_times_the_unit_price() -> None:
    args = reserve_arguments("speech", "hello", {"voice": "alloy"}, [dep("openai/tts-1")], lambda: [])
    ((_, _, price),) = args["candidates"]
    assert price.source == PER_UNIT and args["prompt_tokens"] == 5 and args["max_tokens"] == 0
    assert price.cost(args["prompt_tokens"], 0) == pytest.approx(5 * 1.5e-05)


def test_without_a_unit_price_the_text_sent_is_counted() -> None:
    sentinel: list[Any] = [("d", "m", None)]
    args = reserve_arguments(
        "rerank", "red cube", {"documents": ["a", {"text": "b"}]}, [dep("jina_ai/x")], lambda: sentinel
    )
    assert args["candidates"] is sentinel and "red cube" in args["text"] and args["max_tokens"] == 0
    mod = reserve_arguments(
        "moderation", "hello", {}, [dep("openai/omni-moderation-latest")], lambda: sentinel
    )
    assert mod["max_tokens"] == 0 and mod["text"] == "hello"
