"""langchain-tests' standard integration suite for ResilientChatModel, over real HTTP against the
fault-injecting simulator (healthy here: the resilience paths are covered in
tests/test_langchain_*.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from langchain_tests.integration_tests import ChatModelIntegrationTests

from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin.langchain import ResilientChatModel
from llm_resilience_plugin.testing import FakeClock
from llm_resilience_plugin.testing._simulator import ProviderSimulator


def sim_deployment(sim: ProviderSimulator, group: str, dep_id: str) -> dict[str, Any]:
    return {
        "model_name": group,
        "litellm_params": {
            "model": f"openai/{group}",  # the simulator answers with the model it was asked for
            "api_base": sim.api_base(dep_id),
            "api_key": "sk-sim-secret",
            "input_cost_per_token": 1e-6,
            "output_cost_per_token": 2e-6,
        },
        "model_info": {"id": dep_id},
    }


@pytest.fixture(scope="module")
def standard_router(sim_server: ProviderSimulator) -> Iterator[ResilientRouter]:
    router = ResilientRouter(
        model_list=[
            sim_deployment(sim_server, "alpha-model", "alpha-1"),
            sim_deployment(sim_server, "alpha-model", "alpha-2"),
            sim_deployment(sim_server, "bravo-model", "bravo-1"),
        ],
        fallbacks=[{"alpha-model": ["bravo-model"]}],
        policy={"deadline": 20, "attempt_timeout": 10, "backoff": {"initial": 0.01, "maximum": 0.05}},
        clock=FakeClock(),
        seed=7,
    )
    yield router
    router.close()


class TestResilientChatModelStandard(ChatModelIntegrationTests):
    _router: ClassVar[ResilientRouter | None] = None

    @pytest.fixture(autouse=True)
    def _wire_router(self, standard_router: ResilientRouter, sim: ProviderSimulator) -> None:
        type(self)._router = standard_router

    @property
    def chat_model_class(self) -> type[ResilientChatModel]:
        return ResilientChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        assert self._router is not None
        return {"router": self._router, "model": "alpha-model"}

    @property
    def model_override_value(self) -> str:
        return "bravo-model"  # another model group; neither name contains the other

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def supports_anthropic_inputs(self) -> bool:
        return True
