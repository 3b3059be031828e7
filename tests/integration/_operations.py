"""The non-chat operations of the endpoint suites (test_endpoints.py, test_audio_endpoints.py,
test_operations_shared.py): each one's LiteLLM model, ``model_info``, response type and a small
call, and a ``build`` fixture making a ResilientRouter of such deployments on the simulator."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import litellm
import pytest
from litellm.types.llms.openai import (
    HttpxBinaryResponseContent,
    OpenAIModerationResponse,
    ResponsesAPIResponse,
)
from litellm.types.rerank import RerankResponse

from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin.testing import FakeClock, ProviderSimulator
from tests.conftest import FAST_POLICY, _merge

# operation -> (LiteLLM model, model_info beside the id)
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "embedding": ("openai/text-embedding-3-small", {"mode": "embedding"}),
    "text_completion": (
        "openai/gpt-3.5-turbo-instruct",
        {"mode": "completion", "base_model": "gpt-3.5-turbo-instruct"},
    ),
    "image_generation": ("openai/dall-e-3", {"mode": "image_generation", "output_cost_per_image": 0.04}),
    "responses": ("openai/gpt-4o-mini", {"mode": "responses"}),
    "transcription": ("openai/whisper-1", {"mode": "audio_transcription"}),
    "speech": ("openai/tts-1", {"mode": "audio_speech"}),
    "moderation": ("openai/omni-moderation-latest", {"mode": "moderation"}),
    "rerank": ("cohere/rerank-english-v3.0", {"mode": "rerank"}),
}
TYPES = {
    "embedding": litellm.EmbeddingResponse,
    "text_completion": litellm.TextCompletionResponse,
    "image_generation": litellm.ImageResponse,
    "responses": ResponsesAPIResponse,
    "transcription": litellm.TranscriptionResponse,
    "speech": HttpxBinaryResponseContent,
    "moderation": OpenAIModerationResponse,
    "rerank": RerankResponse,
}
ENDPOINTS = ["embedding", "text_completion", "image_generation", "responses"]
AUDIO_OPERATIONS = ["transcription", "speech", "moderation", "rerank"]
# LiteLLM 1.110's amoderation builds its OpenAI client with the SDK's default two retries and takes
# neither max_retries nor a client through the Router: a 500 is retried inside one attempt.
SDK_RETRIES = {"moderation": 1}
AUDIO = b"\xff\xfb" + b"x" * 4000

Call = Callable[..., Awaitable[Any]]


def call_for(router: ResilientRouter, operation: str) -> Call:
    """``call(group, **kw)`` for one operation, with a small payload."""
    calls: dict[str, Call] = {
        "embedding": lambda g, **kw: router.aembedding(model=g, input=["alpha", "beta"], **kw),
        "text_completion": lambda g, **kw: router.atext_completion(model=g, prompt="Say hello", **kw),
        "image_generation": lambda g, **kw: router.aimage_generation(model=g, prompt="a red cube", **kw),
        "responses": lambda g, **kw: router.aresponses(model=g, input="Say hello", **kw),
        "transcription": lambda g, **kw: router.atranscription(model=g, file=("hello.mp3", AUDIO), **kw),
        "speech": lambda g, **kw: router.aspeech(model=g, input="Hello there", voice="alloy", **kw),
        "moderation": lambda g, **kw: router.amoderation(input="a kind sentence", model=g, **kw),
        "rerank": lambda g, **kw: router.arerank(
            model=g, query="red cube", documents=["a blue ball", "a red cube"], **kw
        ),
    }
    return calls[operation]


def _entry(
    sim: ProviderSimulator, operation: str, group: str, dep: str, info: dict[str, Any]
) -> dict[str, Any]:
    model, extra = MODELS[operation]
    # Cohere's rerank posts to <api_base>/v2/rerank: the deployment's path without /v1
    base = sim.anthropic_base(dep) if operation == "rerank" else sim.api_base(dep)
    return {
        "model_name": group,
        "litellm_params": {"model": model, "api_base": base, "api_key": "sk-sim-secret"},
        "model_info": {"id": dep, **extra, **info},
    }


@pytest.fixture
def build(sim: ProviderSimulator) -> Iterator[Callable[..., ResilientRouter]]:
    """``build(operation, {group: [deployment, ...]}, policy=, clock=, info={dep: {...}}, **router)``."""
    made: list[ResilientRouter] = []

    def make(
        operation: str,
        groups: dict[str, list[str]],
        *,
        policy: dict[str, Any] | None = None,
        clock: Any = None,
        info: dict[str, dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> ResilientRouter:
        model_list = [
            _entry(sim, operation, g, d, (info or {}).get(d, {})) for g, deps in groups.items() for d in deps
        ]
        router = ResilientRouter(
            model_list, policy=_merge(FAST_POLICY, policy or {}), clock=clock or FakeClock(), seed=7, **kwargs
        )
        made.append(router)
        return router

    yield make
    for r in made:
        r.close()
