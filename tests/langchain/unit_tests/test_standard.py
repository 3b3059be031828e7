"""langchain-tests' standard unit suite for ResilientChatModel (no network: nothing is called)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_tests.unit_tests import ChatModelUnitTests
from syrupy.assertion import SnapshotAssertion

from llm_resilience_plugin.langchain import ResilientChatModel

CONFIG_PATH = str(Path(__file__).parents[1] / "router.yaml")

# The same config as router.yaml, as a mapping: keys are os.environ/ references, so a model built
# from it serializes (the suite's test_serdes snapshot must not depend on where the repo lives).
CONFIG_MAPPING: dict[str, Any] = {
    "model_list": [
        {
            "model_name": "alpha-model",
            "litellm_params": {
                "model": "openai/alpha-model",
                "api_base": "http://127.0.0.1:9/alpha/v1",
                "api_key": "os.environ/LLM_RESILIENCE_TEST_KEY",
            },
            "model_info": {"id": "alpha-1"},
        },
        {
            "model_name": "bravo-model",
            "litellm_params": {
                "model": "openai/bravo-model",
                "api_base": "http://127.0.0.1:9/bravo/v1",
                "api_key": "os.environ/LLM_RESILIENCE_TEST_KEY",
            },
            "model_info": {"id": "bravo-1"},
        },
    ],
    "router_settings": {"fallbacks": [{"alpha-model": ["bravo-model"]}]},
    "resilience": {"deadline": 30, "backoff": {"initial": 0.05, "maximum": 0.5}},
}


class TestResilientChatModelUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ResilientChatModel]:
        return ResilientChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": "alpha-model", "config": CONFIG_MAPPING}

    @property
    def model_override_value(self) -> str:
        return "bravo-model"

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def init_from_env_params(self) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
        return (
            {"LLM_RESILIENCE_CONFIG": CONFIG_PATH, "LLM_RESILIENCE_API_KEY": "sk-from-env"},
            {"model": "alpha-model"},
            {"config": CONFIG_PATH, "model": "alpha-model"},
        )

    @pytest.mark.xfail(
        strict=True,
        raises=ValueError,
        reason=(
            "langchain-core 1.8 load(allowed_objects='all') only admits classes listed in its own "
            "registry (langchain_core.load.mapping); dumpd() matches the snapshot and the round "
            "trip with allowed_objects=[ResilientChatModel] is tested in test_langchain_chat_model.py"
        ),
    )
    def test_serdes(self, model: BaseChatModel, snapshot: SnapshotAssertion) -> None:
        super().test_serdes(model, snapshot)
