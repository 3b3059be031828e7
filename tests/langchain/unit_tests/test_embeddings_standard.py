"""langchain-tests' standard unit suite for ResilientEmbeddings (no network: nothing is called)."""

from __future__ import annotations

from typing import Any

from langchain_tests.unit_tests import EmbeddingsUnitTests

from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.langchain import ResilientEmbeddings

CONFIG: dict[str, Any] = {
    "model_list": [
        {
            "model_name": "embed",
            "litellm_params": {
                "model": "openai/text-embedding-3-small",
                "api_base": "http://127.0.0.1:9/embed/v1",
                "api_key": "os.environ/LLM_RESILIENCE_TEST_KEY",
            },
            "model_info": {"id": "embed-1", "mode": "embedding"},
        },
        {
            "model_name": "chat",
            "litellm_params": {
                "model": "openai/gpt-4o-mini",
                "api_base": "http://127.0.0.1:9/chat/v1",
                "api_key": "os.environ/LLM_RESILIENCE_TEST_KEY",
            },
            "model_info": {"id": "chat-1", "mode": "chat"},
        },
    ],
}


class TestResilientEmbeddingsUnit(EmbeddingsUnitTests):
    @property
    def embeddings_class(self) -> type[ResilientEmbeddings]:
        return ResilientEmbeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return {"model": "embed", "config": CONFIG}


def test_a_chat_group_is_refused_at_construction() -> None:
    try:
        ResilientEmbeddings(model="chat", config=CONFIG)
    except ConfigError as e:
        assert "model_info.mode" in str(e)
    else:
        raise AssertionError("expected a ConfigError")


def test_exactly_one_router_source() -> None:
    try:
        ResilientEmbeddings(model="embed")
    except ConfigError as e:
        assert "router" in str(e)
    else:
        raise AssertionError("expected a ConfigError")
