"""The LangChain models that build their router from a config: ``close()``, ``aclose()``, ``with``
and ``async with`` release it (shared by the chat model and embeddings of one configuration); the
finalizer is only a safety net; a ``router=`` router is never closed by a model."""

from __future__ import annotations

import gc
import threading
from typing import Any

import pytest

from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin.langchain import ResilientChatModel, ResilientEmbeddings
from llm_resilience_plugin.testing import ProviderSimulator


def config(sim: ProviderSimulator, tag: str) -> dict[str, Any]:
    """A config with an embedding group and a chat group (``tag`` makes it unique to the test)."""
    return {
        "model_list": [
            {
                "model_name": "embed",
                "litellm_params": {
                    "model": "openai/text-embedding-3-small",
                    "api_base": sim.api_base(f"emb-{tag}"),
                    "api_key": "sk-sim",
                },
                "model_info": {"id": f"emb-{tag}", "mode": "embedding"},
            },
            {
                "model_name": "chat",
                "litellm_params": {
                    "model": "openai/gpt-4o-mini",
                    "api_base": sim.api_base(f"chat-{tag}"),
                    "api_key": "sk-sim",
                },
                "model_info": {"id": f"chat-{tag}", "mode": "chat"},
            },
        ]
    }


def sync_threads() -> set[threading.Thread]:
    """The live private-loop threads of routers (one per router that made a blocking call)."""
    return {t for t in threading.enumerate() if t.name == "llm-resilience-sync" and t.is_alive()}


def test_with_closes_the_router_it_built(sim):
    before = sync_threads()
    with ResilientEmbeddings(model="embed", config=config(sim, "with")) as embeddings:
        assert len(embeddings.embed_documents(["a", "b"])) == 2
        assert len(sync_threads() - before) == 1  # the router's private loop thread
    assert sync_threads() <= before  # closed on exit
    embeddings.close()  # idempotent
    # (no ResourceWarning at exit either: test_blocking_calls_then_close_leave_no_connection_open_at_exit)


async def test_async_with_and_aclose(sim):
    before = sync_threads()
    async with ResilientEmbeddings(model="embed", config=config(sim, "awith")) as embeddings:
        assert len(await embeddings.aembed_documents(["a"])) == 1
        assert len(embeddings.embed_documents(["b"])) == 1
    assert sync_threads() <= before
    chat = ResilientChatModel(model="chat", config=config(sim, "achat"))
    chat.invoke("hi")
    await chat.aclose()
    assert sync_threads() <= before


def test_chat_model_and_embeddings_of_one_config_share_the_router(sim):
    cfg = config(sim, "shared")
    before = sync_threads()
    with ResilientChatModel(model="chat", config=cfg) as chat:
        embeddings = ResilientEmbeddings(model="embed", config=cfg)
        assert embeddings.get_router() is chat.get_router()
        embeddings.embed_query("x")
        embeddings.close()  # the chat model still holds the router
        assert chat.invoke("hi").content
        assert len(sync_threads() - before) == 1
    assert sync_threads() <= before  # the last holder closed it


def test_use_after_close_takes_the_router_again(sim):
    embeddings = ResilientEmbeddings(model="embed", config=config(sim, "again"))
    first = embeddings.get_router()
    embeddings.close()
    assert len(embeddings.embed_documents(["a"])) == 1
    assert embeddings.get_router() is not first
    embeddings.close()


def test_the_finalizer_is_a_safety_net(sim):
    before = sync_threads()
    embeddings = ResilientEmbeddings(model="embed", config=config(sim, "gc"))
    embeddings.embed_documents(["a"])
    assert len(sync_threads() - before) == 1
    del embeddings
    gc.collect()
    assert sync_threads() <= before


def test_a_router_given_is_never_closed_by_the_model(sim):
    router = ResilientRouter.from_config(config(sim, "given"))
    try:
        with ResilientEmbeddings(model="embed", router=router) as embeddings:
            embeddings.embed_query("a")
        assert len(router.embedding("embed", ["still open"]).data) == 1
    finally:
        router.close()


def test_a_group_that_cannot_embed_releases_the_router_it_built(sim):
    from llm_resilience_plugin import ConfigError

    before = sync_threads()
    with pytest.raises(ConfigError):
        ResilientEmbeddings(model="chat", config=config(sim, "refused"))
    gc.collect()
    assert sync_threads() <= before


EXIT_SCRIPT = """
import llm_resilience_plugin
from llm_resilience_plugin.langchain import ResilientChatModel, ResilientEmbeddings
from llm_resilience_plugin.testing import ProviderSimulator

with ProviderSimulator() as sim:
    def dep(group, model, mode):
        return {"model_name": group, "model_info": {"id": group, "mode": mode},
                "litellm_params": {"model": model, "api_base": sim.api_base(group), "api_key": "sk-sim"}}

    config = {"model_list": [dep("embed", "openai/text-embedding-3-small", "embedding"),
                             dep("chat", "openai/gpt-4o-mini", "chat")]}
    with ResilientEmbeddings(model="embed", config=config) as embeddings, \\
            ResilientChatModel(model="chat", config=config) as llm:
        embeddings.embed_documents(["a", "b"])
        llm.invoke("hi")
print("done")
"""


def test_blocking_calls_then_close_leave_no_connection_open_at_exit(tmp_path):
    """LiteLLM's HTTP clients of the router's private loop are closed with it: no "unclosed
    transport" ResourceWarning when the interpreter exits (-X dev shows every one)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "PYTHONWARNINGS": "always::ResourceWarning"}
    done = subprocess.run(
        [sys.executable, "-X", "dev", str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "done" in done.stdout
    assert "ResourceWarning" not in done.stderr, done.stderr[-2000:]
