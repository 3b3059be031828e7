"""``ResilientEmbeddings``: LangChain's ``Embeddings`` over one embedding model group of a
:class:`~llm_resilience_plugin.ResilientRouter`, so a RAG ingest gets the router's retries,
per-deployment breakers, fallbacks, deadline, batch splitting and dimension checks."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from langchain_core.embeddings import Embeddings
from pydantic import BaseModel, ConfigDict, Field

from llm_resilience_plugin.errors import ConfigError
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


class ResilientEmbeddings(BaseModel, Embeddings):
    """LangChain embeddings through a router's embedding model group::

        embeddings = ResilientEmbeddings(router=router, model="embed")
        vectors = embeddings.embed_documents(["first chunk", "second chunk"])

    Give ``router=`` (shared breakers and budgets) or ``config=`` (a LiteLLM proxy YAML path or
    its mapping; the model builds and owns the router). ``dimensions`` and ``model_kwargs`` go to
    LiteLLM with each call; ``vectors_compatible=True`` allows fallback to a group whose vectors
    have another length (see the router's ``aembedding``).
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
    model_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Other LiteLLM embedding arguments (``encoding_format``, ``user``, ``metadata``, ...)."""

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)
        self._check()  # outside pydantic's validation: the ConfigError reaches the caller as is

    def _check(self) -> None:
        """Exactly one router source; the group exists and its deployments embed."""
        if (self.router is None) == (self.config is None):
            raise ConfigError("router, config", "give exactly one of router= or config=")
        if self.router is None:
            self.router = ResilientRouter.from_config(self.config)  # type: ignore[arg-type]
        self.router.check_call("embedding", self.model)
        if self.dimensions is not None and (
            isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int) or self.dimensions < 1
        ):
            raise ConfigError("dimensions", "must be a whole number >= 1")

    def _kwargs(self) -> dict[str, Any]:
        kwargs = dict(self.model_kwargs)
        if self.dimensions is not None:
            kwargs["dimensions"] = self.dimensions
        if self.deadline is not None:
            kwargs["deadline"] = self.deadline
        kwargs["vectors_compatible"] = self.vectors_compatible
        return kwargs

    @property
    def _router(self) -> ResilientRouter:
        assert self.router is not None  # set by the validator
        return self.router

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """One vector per text, in order (a long list is split into the deployments' batches)."""
        if not texts:
            return []
        return _vectors(self._router.embedding(self.model, list(texts), **self._kwargs()))

    def embed_query(self, text: str) -> list[float]:
        """The vector of one text."""
        return self.embed_documents([text])[0]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """Async :meth:`embed_documents` (on the caller's event loop)."""
        if not texts:
            return []
        return _vectors(await self._router.aembedding(self.model, list(texts), **self._kwargs()))

    async def aembed_query(self, text: str) -> list[float]:
        """Async :meth:`embed_query`."""
        return (await self.aembed_documents([text]))[0]
