"""Names shared by the OpenTelemetry and Prometheus instrumentation: GenAI semantic-convention
attribute names, the ``llm_resilience.*`` namespace, provider names and breaker-state values."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from llm_resilience_plugin.events import DeploymentInfo

# GenAI semantic conventions (development status, names as of semconv 1.37).
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
INPUT_MESSAGES = "gen_ai.input.messages"
TOKEN_TYPE = "gen_ai.token.type"
ERROR_TYPE = "error.type"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
HTTP_STATUS = "http.response.status_code"
OUTPUT_TYPE = "gen_ai.output.type"
TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"  # s, streams (semconv-genai openai.md)
OPENAI_API_TYPE = "openai.api.type"
CHAT = "chat"

# ``gen_ai.operation.name`` per LiteLLM call. The conventions' well-known values (semconv-genai
# docs/gen-ai/openai.md and the gen_ai registry) are chat, embeddings, text_completion and
# generate_content ("multimodal content generation"); a well-known value MUST be used when one
# applies. The Responses API is an OpenAI inference span like Chat Completions, told apart by
# ``openai.api.type`` (``responses`` / ``chat_completions``): so ``chat``. Image generation has no
# value of its own: ``generate_content`` with ``gen_ai.output.type = image``.
OPERATION_NAMES = {
    "completion": CHAT,
    "embedding": "embeddings",
    "text_completion": "text_completion",
    "responses": CHAT,
    "image_generation": "generate_content",
}
_OPENAI_API_TYPES = {"completion": "chat_completions", "responses": "responses"}


def operation_name(operation: str) -> str:
    """The ``gen_ai.operation.name`` of a LiteLLM call (``"embedding"`` -> ``"embeddings"``)."""
    return OPERATION_NAMES.get(operation, operation)


def operation_attributes(operation: str, provider: str | None = None) -> dict[str, str]:
    """Span attributes that name the operation: the convention's name, LiteLLM's call under
    ``llm_resilience.operation``, the output type of images, and ``openai.api.type`` for OpenAI."""
    attrs = {OPERATION: operation_name(operation), f"{NS}.operation": operation}
    if operation == "image_generation":
        attrs[OUTPUT_TYPE] = "image"
    api_type = _OPENAI_API_TYPES.get(operation)
    if api_type is not None and provider in ("openai", "azure.ai.openai"):
        attrs[OPENAI_API_TYPE] = api_type
    return attrs


# Everything the resilience layer adds lives under one namespace.
NS = "llm_resilience"

# LiteLLM provider names whose GenAI convention spelling differs.
_PROVIDER_NAMES = {
    "azure": "azure.ai.openai",
    "azure_ai": "azure.ai.inference",
    "bedrock": "aws.bedrock",
    "vertex_ai": "gcp.vertex_ai",
    "vertex_ai_beta": "gcp.vertex_ai",
    "gemini": "gcp.gemini",
    "mistral": "mistral_ai",
    "xai": "x_ai",
    "watsonx": "ibm.watsonx.ai",
}

BREAKER_STATE_VALUES = {"closed": 0, "half-open": 1, "half_open": 1, "open": 2}


def breaker_value(state: str | None) -> int:
    """A breaker state as a gauge value: 0 closed, 1 half-open, 2 open (unknown counts as closed)."""
    return BREAKER_STATE_VALUES.get(state or "closed", 0)


@dataclass(frozen=True, slots=True)
class DeploymentNames:
    """What spans and metrics say of one deployment: provider, model, server address and port."""

    provider: str | None
    model: str | None
    address: str | None
    port: int | None


_NAMES: dict[tuple[str, str, str | None], DeploymentNames] = {}
_NAMES_LOCK = threading.Lock()


def provider_name(model: str, custom_provider: str | None = None) -> tuple[str | None, str]:
    """The GenAI provider name and bare model of a LiteLLM model string (offline, via LiteLLM)."""
    provider: str | None = custom_provider
    bare = model
    try:
        import litellm

        bare, found, _, _ = litellm.get_llm_provider(model, custom_llm_provider=custom_provider)
        provider = found or provider
    except Exception:  # an unknown model: keep the prefix as the provider
        if "/" in model:
            provider, bare = model.split("/", 1)
    return (_PROVIDER_NAMES.get(provider, provider) if provider else None), bare


def names_of(dep: DeploymentInfo | None) -> DeploymentNames:
    """Provider, bare model and server of a deployment, computed once per deployment."""
    if dep is None:
        return DeploymentNames(None, None, None, None)
    custom = (dep.params or {}).get("custom_llm_provider")
    key = (dep.model, dep.api_base or "", custom if isinstance(custom, str) else None)
    with _NAMES_LOCK:
        known = _NAMES.get(key)
    if known is not None:
        return known
    provider, bare = provider_name(dep.model, key[2])
    address: str | None = None
    port: int | None = None
    if dep.api_base:
        try:
            parts = urlsplit(dep.api_base)
            address, port = parts.hostname, parts.port
        except ValueError:
            pass
    names = DeploymentNames(provider, bare, address, port)
    with _NAMES_LOCK:
        _NAMES[key] = names
    return names


OTHER = "other"


class BoundedNames:
    """Metric attribute values a provider chooses (the response model), kept to a bounded set:
    the configured names, then the first ``extra`` others seen, then ``"other"`` - so attribute
    sets (and the SDK's memory of them) cannot grow with what providers send."""

    def __init__(self, configured: Iterable[str], extra: int = 16) -> None:
        self._known = set(configured)
        self._extra = extra
        self._lock = threading.Lock()

    def __call__(self, name: str) -> str:
        if name in self._known:
            return name
        with self._lock:
            if name in self._known:
                return name
            if self._extra > 0:
                self._extra -= 1
                self._known.add(name)
                return name
        return OTHER
