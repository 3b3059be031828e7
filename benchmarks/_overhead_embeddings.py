"""The embeddings row of benchmarks/overhead.py: ``ResilientRouter.aembedding`` against a bare
``litellm.Router.aembedding`` on the same simulator deployments in the same run, measured with the
chat rows' paired sequential method (ABBA blocks, median of block-pair ratios)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from llm_resilience_plugin import ResilientRouter

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Resilience is a property of the whole path."]
Call = Callable[[], Awaitable[Any]]


def embedding_model_list(sim: Any) -> list[dict[str, Any]]:
    """Two embedding deployments of one group on the simulator."""
    return [
        {
            "model_name": "embed",
            "litellm_params": {
                "model": "openai/text-embedding-3-small",
                "api_base": sim.api_base(dep),
                "api_key": "sk-sim",
            },
            "model_info": {"id": dep, "mode": "embedding"},
        }
        for dep in ("ea", "eb")
    ]


def build_embeddings(kind: str, sim: Any) -> tuple[Any, Call]:
    """A router (bare or resilient) and its embedding call."""
    import litellm

    if kind == "bare":
        router: Any = litellm.Router(
            model_list=embedding_model_list(sim), num_retries=0, disable_cooldowns=True
        )
    else:
        router = ResilientRouter(model_list=embedding_model_list(sim))

    async def call() -> Any:
        return await router.aembedding(model="embed", input=TEXTS)

    return router, call


async def embeddings_row(
    sim: Any,
    pairs: int,
    block: int,
    sequential: Callable[[dict[str, Call], int, int], Awaitable[dict[str, Any]]],
    warm: Callable[[Call, int, int], Awaitable[Any]],
) -> dict[str, Any]:
    """The sequential paired measurement of both systems' ``aembedding`` (what the row prints)."""
    built = {kind: build_embeddings(kind, sim) for kind in ("bare", "resilient")}
    systems = {kind: call for kind, (_, call) in built.items()}
    for call in systems.values():
        await warm(call, 50, 1)
    try:
        return await sequential(systems, pairs, block)
    finally:
        built["resilient"][0].close()
