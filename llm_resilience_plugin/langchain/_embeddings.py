"""``ResilientEmbeddings``: LangChain's ``Embeddings`` over one embedding model group of a
:class:`~llm_resilience_plugin.ResilientRouter`, so a RAG ingest gets the router's retries,
per-deployment breakers, fallbacks, deadline, batch splitting and dimension checks."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from langchain_core.embeddings import Embeddings
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.langchain._bridge import config_deadline
from llm_resilience_plugin.langchain._construction import RouterLease, build_router_spec, lease_router
from llm_resilience_plugin.langchain._lifecycle import ClosesRouter
from llm_resilience_plugin.policy import RouterSpec
from llm_resilience_plugin.routing import ResilientRouter


def _vectors(response: Any) -> list[list[float]]:
    """The vectors of a LiteLLM ``EmbeddingResponse``, in input order."""
    items = []
    for item in response.data:
        if isinstance(item, Mapping):
            index, vector = item.get("index"), item.get("embedding")
        else:
            index, vector = getattr(item, "index", None), getattr(item, "embedding", None)
        items.append((int(index or 0), [float(x) for x in vector or []]))
    items.sort(key=lambda pair: pair[0])
    return [vector for _, vector in items]


class ResilientEmbeddings(ClosesRouter, BaseModel, Embeddings):
    """LangChain embeddings through a router's embedding model group::

        embeddings = ResilientEmbeddings(router=router, model="embed")
        vectors = embeddings.embed_documents(["first chunk", "second chunk"])

    Give ``router=`` (shared breakers and budgets; yours to close) or ``config=`` (a LiteLLM proxy
    YAML path or its mapping): the router of that configuration, shared with every chat model and
    embeddings built from the same one, held until :meth:`close` (or ``with`` / ``async with``,
    :meth:`aclose`). ``dimensions`` and ``model_kwargs`` go to LiteLLM with each call;
    ``vectors_compatible=True`` allows fallback to a group whose vectors have another length and
    ``batch_concurrency`` bounds the batches in flight (see the router's ``aembedding``).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    model: str
    """The embedding model group (a ``model_name`` whose deployments have mode ``embedding``)."""
    router: ResilientRouter | None = Field(default=None, exclude=True, repr=False)
    """An existing router (shared breakers, budgets and events)."""
    config: str | Path | dict[str, Any] | None = Field(default=None, repr=False)
    """A LiteLLM proxy-style config (path or mapping) to build a router from."""
    dimensions: int | None = None
    """The vector length to ask for (models that support it, e.g. text-embedding-3-*)."""
    vectors_compatible: bool = False
    """Allow fallback to a group with another vector length (you vouch for the vector space)."""
    deadline: float | None = None
    """Seconds for each ``embed_*`` call (all its batches), or the policy's deadline."""
    batch_concurrency: int | None = None
    """Batches of one split call in flight at once (the policy's ``embedding_batch_concurrency``)."""
    model_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Other LiteLLM embedding arguments (``encoding_format``, ``user``, ``metadata``, ...)."""

    _spec: RouterSpec | None = PrivateAttr(default=None)
    _lease: RouterLease | None = PrivateAttr(default=None)

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)
        self._check()  # outside pydantic's validation: the ConfigError reaches the caller as is

    def _check(self) -> None:
        """Exactly one router source; the group exists and its deployments embed."""
        if (self.router is None) == (self.config is None):
            raise ConfigError("router, config", "give exactly one of router= or config=")
        for name in ("dimensions", "batch_concurrency"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(name, "must be a whole number >= 1")
        if self.router is not None:
            self.router.check_call("embedding", self.model)
            return
        config = str(self.config) if isinstance(self.config, Path) else self.config
        self._spec = build_router_spec(
            model_list=None, config=config, policy=None, fallbacks=None,
            router_settings=None, api_key=None, max_retries=None,
        )  # fmt: skip
        try:
            self.get_router().check_call("embedding", self.model)
        except BaseException:
            self.close()
            raise

    def get_router(self) -> ResilientRouter:
        """The router this model calls: ``router=``, or the one shared by every model built with
        the same configuration (taken again on use after :meth:`close`)."""
        if self.router is not None:
            return self.router
        lease = self._lease
        if lease is None or lease.released:
            assert self._spec is not None  # set by _check whenever router is None
            lease = self._lease = lease_router(self._spec, {})
            weakref.finalize(self, lease.release)  # the safety net: close() is the way
        return lease.router()

    def close(self) -> None:
        """Give back this model's hold on the router of its ``config``; the router closes with its
        last holder (idempotent; a ``router=`` router is left alone)."""
        if self._lease is not None:
            self._lease.release()

    def _kwargs(self) -> dict[str, Any]:
        kwargs = dict(self.model_kwargs)
        if self.dimensions is not None:
            kwargs["dimensions"] = self.dimensions
        if self.deadline is not None:
            kwargs["deadline"] = self.deadline
        cap = config_deadline()  # inside a LangChain run (a retriever in a chain): what it has left
        if cap is not None:
            kwargs["deadline_cap"] = cap
        if self.batch_concurrency is not None:
            kwargs["batch_concurrency"] = self.batch_concurrency
        kwargs["vectors_compatible"] = self.vectors_compatible
        return kwargs

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """One vector per text, in order (a long list is split into the deployments' batches)."""
        if not texts:
            return []
        return _vectors(self.get_router().embedding(self.model, list(texts), **self._kwargs()))

    def embed_query(self, text: str) -> list[float]:
        """The vector of one text."""
        return self.embed_documents([text])[0]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """Async :meth:`embed_documents` (on the caller's event loop)."""
        if not texts:
            return []
        return _vectors(await self.get_router().aembedding(self.model, list(texts), **self._kwargs()))

    async def aembed_query(self, text: str) -> list[float]:
        """Async :meth:`embed_query`."""
        return (await self.aembed_documents([text]))[0]
