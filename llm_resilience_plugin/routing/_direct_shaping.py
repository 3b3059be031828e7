"""The Router's request-shaping and response-header functions a direct attempt calls, looked up
once per dispatcher instead of on every attempt.

Every function here is LiteLLM's own (found by :mod:`llm_resilience_plugin._litellm`); a direct
attempt calls the very functions the Router's attempt calls, so binding them early changes nothing
but the cost of finding them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class RouterPieces:
    """LiteLLM's functions for one attempt's kwargs and its answer's headers, bound once (from the
    LiteLLM seam's ``internals().direct``)."""

    def __init__(self, found: Any) -> None:
        self.update_kwargs_with_deployment = found.update_kwargs_with_deployment
        self.reasoning_override = found.reasoning_override
        self.initialize_compaction_state = found.initialize_compaction_state
        self.without_router_only_kwargs = found.without_router_only_kwargs
        self.stamp_deployment_num_retries = found.stamp_deployment_num_retries
        self.stamp_failed_deployment_id = found.stamp_failed_deployment_id
        self.simple_shuffle = found.simple_shuffle
        self.find_deployment_metadata = found.find_deployment_metadata
        self.prepare_response = found.prepare_response
        self.ensure_additional_headers = found.ensure_additional_headers
        self.apply_response_model_id = found.apply_response_model_id
        self.apply_quality_headers = found.apply_quality_headers
        self.complexity_headers = found.complexity_headers
        self.apply_remaining_usage_headers = found.apply_remaining_usage_headers
        self.add_retry_headers = found.add_retry_headers
        self.add_fallback_headers = found.add_fallback_headers

    def deployment_params(self, dep: Mapping[str, Any], request: Mapping[str, Any]) -> Mapping[str, Any]:
        """``deployment_params_with_request_reasoning_override``: without a request
        ``reasoning_effort`` that is the deployment's params as they are (no copy needed: the
        caller only spreads them into the attempt's kwargs)."""
        if request.get("reasoning_effort") is None:
            return dep["litellm_params"]  # type: ignore[no-any-return]
        return self.reasoning_override(dep["litellm_params"], request)  # type: ignore[no-any-return]

    def stamp_response(
        self, resp: Any, group: str, sent: Mapping[str, Any], remaining: Mapping[str, Any] | None = None
    ) -> Any:
        """The headers the Router's ``finish_async`` stamps on a served answer (model id, the group
        it was served as, the group's remaining usage if counted, zero retries and fallbacks: the
        plugin's own are in its report)."""
        response = self.prepare_response(resp)
        if response is None:
            return resp
        additional = self.ensure_additional_headers(response)
        self.apply_response_model_id(response, self.find_deployment_metadata(sent))
        additional["x-litellm-model-group"] = group
        self.apply_quality_headers(additional, sent)
        additional.update(self.complexity_headers(sent))
        if remaining:
            self.apply_remaining_usage_headers(additional, dict(remaining))
        response = self.add_retry_headers(response=response, attempted_retries=0, max_retries=None)
        return self.add_fallback_headers(response=response, attempted_fallbacks=0)


__all__ = ["RouterPieces"]
