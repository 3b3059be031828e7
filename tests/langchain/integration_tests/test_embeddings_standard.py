"""langchain-tests' standard integration suite for ResilientEmbeddings over real HTTP against the
simulator, and the same embeddings surviving an outage of one deployment."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from langchain_tests.integration_tests import EmbeddingsIntegrationTests

from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin.langchain import ResilientEmbeddings
from llm_resilience_plugin.testing import FakeClock
from llm_resilience_plugin.testing._simulator import ProviderSimulator


def embed_deployment(sim: ProviderSimulator, group: str, dep_id: str) -> dict[str, Any]:
    return {
        "model_name": group,
        "litellm_params": {
            "model": "openai/text-embedding-3-small",
            "api_base": sim.api_base(dep_id),
            "api_key": "sk-sim-secret",
        },
        "model_info": {"id": dep_id, "mode": "embedding", "max_embedding_batch_size": 2},
    }


@pytest.fixture(scope="module")
def embed_router(sim_server: ProviderSimulator) -> Iterator[ResilientRouter]:
    router = ResilientRouter(
        model_list=[
            embed_deployment(sim_server, "embed", "emb-1"),
            embed_deployment(sim_server, "embed", "emb-2"),
        ],
        policy={"deadline": 20, "attempt_timeout": 10, "backoff": {"initial": 0.01, "maximum": 0.05}},
        clock=FakeClock(),
        seed=7,
    )
    yield router
    router.close()


class TestResilientEmbeddingsStandard(EmbeddingsIntegrationTests):
    _router: ClassVar[ResilientRouter | None] = None

    @pytest.fixture(autouse=True)
    def _wire_router(self, embed_router: ResilientRouter, sim: ProviderSimulator) -> None:
        type(self)._router = embed_router

    @property
    def embeddings_class(self) -> type[ResilientEmbeddings]:
        return ResilientEmbeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return {"model": "embed", "router": type(self)._router}


async def test_embeddings_survive_an_outage_of_one_deployment(
    embed_router: ResilientRouter, sim: ProviderSimulator
) -> None:
    sim.outage("emb-1", 60)
    embeddings = ResilientEmbeddings(model="embed", router=embed_router)
    docs = [f"chunk {i}" for i in range(7)]
    vectors = await embeddings.aembed_documents(docs)
    assert len(vectors) == 7 and len({len(v) for v in vectors}) == 1
    assert vectors == embeddings.embed_documents(docs)  # the same vectors, in order, sync too
    assert embeddings.embed_query("chunk 3") == vectors[3]
