"""What a model group can do, read from LiteLLM's model map (offline): the LangChain ``profile`` of
a group (the smallest capability across it and its fallbacks, since any of them may answer), the
groups that take strict structured output, and the model token counts are made for.

A deployment's own ``model_info`` declarations (``supports_vision: false``, ``max_input_tokens``,
...) win over the map; a model the map does not know leaves its capabilities unknown.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import ModelProfile
from langchain_core.messages import BaseMessage
from langchain_core.utils.function_calling import convert_to_openai_tool

from llm_resilience_plugin.errors import ErrorClass
from llm_resilience_plugin.policy import RouterSpec

# ModelProfile flag -> LiteLLM model-map key (its ``supports_*`` functions read the same keys).
PROFILE_FLAGS: dict[str, str] = {
    "tool_calling": "supports_function_calling",
    "tool_choice": "supports_tool_choice",
    "structured_output": "supports_response_schema",
    "image_inputs": "supports_vision",
    "image_url_inputs": "supports_vision",
    "pdf_inputs": "supports_pdf_input",
    "audio_inputs": "supports_audio_input",
    "video_inputs": "supports_video_input",
    "audio_outputs": "supports_audio_output",
    "reasoning_output": "supports_reasoning",
}
PROFILE_LIMITS = ("max_input_tokens", "max_output_tokens")

# The error classes whose fallback chains a call may walk (the generic chain covers the rest).
_CHAINS = (ErrorClass.RATE_LIMIT, ErrorClass.CONTEXT_WINDOW, ErrorClass.CONTENT_POLICY)


@dataclass(frozen=True, slots=True)
class Deployment:
    """One deployment as far as capabilities go: its model, provider and ``model_info``."""

    model: str
    provider: str | None
    declared: Mapping[str, Any]

    def model_map(self) -> Mapping[str, Any] | None:
        """LiteLLM's entry for the model (``base_model`` first), or None when it has none (an
        entry with neither a mode nor a context window only carries a price someone registered)."""
        import litellm

        for name in (self.declared.get("base_model"), self.model):
            if isinstance(name, str) and name:
                try:
                    info = litellm.get_model_info(name, custom_llm_provider=self.provider)
                except Exception:
                    continue
                if info.get("mode") or info.get("max_input_tokens"):
                    return info
        return None

    def capability(self, key: str, known: Mapping[str, Any] | None) -> Any:
        """The declared value of ``key``, else the map's (a mapped model without a flag lacks
        it), else None (unknown)."""
        if self.declared.get(key) is not None:
            return self.declared[key]
        if known is None:
            return None
        value = known.get(key)
        return bool(value) if key.startswith("supports_") else value

    def takes_strict_schema(self) -> bool:
        """Strict ``json_schema`` output: declared or in the map, and (as ``ChatOpenAI`` decides
        it) not one of the models before OpenAI's structured outputs; an unmapped model gets it."""
        name = self.model.split("/", 1)[-1]
        if name.startswith(("gpt-3", "gpt-4-")) or name == "gpt-4":
            return bool(self.declared.get("supports_response_schema"))
        flag = self.capability("supports_response_schema", self.model_map())
        return True if flag is None else bool(flag)


@dataclass(frozen=True, slots=True)
class GroupMap:
    """The deployments of each group a call to ``group`` may reach (it first, then its fallbacks)."""

    group: str
    routes: dict[str, list[Deployment]]

    @classmethod
    def of(cls, spec: RouterSpec | None, group: str, fallback: Sequence[Any] = ()) -> GroupMap:
        """From the router's spec; without one, from ``fallback`` (its ``DeploymentInfo``s of
        ``group``, whose params hold ``model_info``)."""
        if spec is None:
            deps = [Deployment(d.model, _provider(d.params), d.params) for d in fallback]
            return cls(group, {group: deps})
        names = [group]
        for error_class in _CHAINS:
            names += [g for g in spec.fallback_chain(group, error_class) if g not in names]
        routes: dict[str, list[Deployment]] = {g: [] for g in names}
        for d in spec.model_list:
            if d.get("model_name") in routes:
                lp = d.get("litellm_params") or {}
                routes[d["model_name"]].append(
                    Deployment(str(lp.get("model", "")), _provider(lp), d.get("model_info") or {})
                )
        return cls(group, {g: deps for g, deps in routes.items() if deps})

    def token_model(self) -> str:
        """The model the group's token counts are made for: its first deployment's."""
        deps = self.routes.get(self.group) or []
        return deps[0].model if deps else self.group

    def profile(self) -> ModelProfile:
        """LangChain's profile: each capability the smallest across every reachable deployment
        (a limit is the minimum, a flag is true only if all have it); unknown ones are left out."""
        deps = [d for group in self.routes.values() for d in group]
        known = [(d, d.model_map()) for d in deps]
        out: dict[str, Any] = {"text_inputs": True, "text_outputs": True}
        for key in PROFILE_LIMITS:
            limit = smallest(d.capability(key, k) for d, k in known)
            if limit is not None:
                out[key] = int(limit)
        for flag, key in PROFILE_FLAGS.items():
            value = all_true([d.capability(key, k) for d, k in known])
            if value is not None:
                out[flag] = value
        if "tool_calling" in out:
            out["tool_call_streaming"] = out["tool_calling"]  # tool calls stream as indexed chunks
        return ModelProfile(**out)  # type: ignore[typeddict-item]

    def strict_routes(self) -> dict[str, bool]:
        """Each reachable group (the model's own first): do all its deployments take a strict
        ``json_schema``? (A group is asked one way, whichever of its deployments serves.)"""
        return {g: all(d.takes_strict_schema() for d in deps) for g, deps in self.routes.items()}


def _provider(params: Mapping[str, Any]) -> str | None:
    provider = params.get("custom_llm_provider")
    return provider if isinstance(provider, str) else None


def smallest(values: Iterable[Any]) -> int | None:
    """The minimum when every value is known, else None."""
    seen = list(values)
    if not seen or any(not isinstance(v, int) or isinstance(v, bool) for v in seen):
        return None
    return min(seen)


def all_true(values: list[Any]) -> bool | None:
    """False if any says no, True if all say yes, None (unknown) otherwise."""
    if any(v is False for v in values):
        return False
    if values and all(v is True for v in values):
        return True
    return None


class GroupCapabilities:
    """What a chat model over a router group knows of itself (a mixin of the chat model): token
    counts by LiteLLM's counter for the group's model, offline, without ``transformers``."""

    def _capability_map(self) -> GroupMap:
        """The group's routes and their deployments (the chat model says where they are)."""
        raise NotImplementedError

    def get_num_tokens_from_messages(
        self, messages: list[BaseMessage], tools: Sequence[Any] | None = None
    ) -> int:
        """Prompt tokens by LiteLLM's counter for the group's first deployment model (offline for
        OpenAI, Anthropic and DeepSeek models; others fall back to LiteLLM's default encoding)."""
        from llm_resilience_plugin.langchain._convert import to_openai_messages

        oai_tools = [convert_to_openai_tool(t) for t in tools] if tools else None
        model = self._capability_map().token_model()
        return count_tokens(model, messages=to_openai_messages(messages), tools=oai_tools)

    def get_num_tokens(self, text: str) -> int:
        """Tokens of ``text`` by LiteLLM's counter for the group's model (no ``transformers``)."""
        return count_tokens(self._capability_map().token_model(), text=text)


def count_tokens(model: str, *, text: str | None = None, messages: Any = None, tools: Any = None) -> int:
    """LiteLLM's ``token_counter`` for ``model`` (offline for OpenAI, Anthropic and DeepSeek
    models; others get LiteLLM's default encoding)."""
    import litellm

    if text is not None:
        return int(litellm.token_counter(model=model, text=text))
    return int(litellm.token_counter(model=model, messages=messages, tools=tools))
