"""The Router's request-shaping and response-header functions a direct attempt calls, looked up
once per dispatcher instead of on every attempt, and the per-deployment values that never change
between calls (its SDK client cache keys).

Every function here is LiteLLM's own (litellm 1.110); a direct attempt calls the very functions
the Router's attempt calls, so binding them early changes nothing but the cost of finding them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class RouterPieces:
    """LiteLLM's functions for one attempt's kwargs and its answer's headers, bound once."""

    def __init__(self) -> None:
        from litellm.litellm_core_utils.add_retry_fallback_headers import (
            add_fallback_headers_to_response,
            add_retry_headers_to_response,
            apply_quality_router_decision_headers,
            apply_remaining_usage_headers,
            apply_response_model_id,
            complexity_router_decision_headers,
            ensure_response_additional_headers,
            prepare_response_for_header_attachment,
        )
        from litellm.litellm_core_utils.routing_common_utils import without_router_only_kwargs
        from litellm.router_rust.invoke.shaping import (
            deployment_params_with_request_reasoning_override,
            stamp_deployment_num_retries,
            stamp_failed_deployment_id,
            update_kwargs_with_deployment,
        )
        from litellm.router_strategy.complexity_router.context_compaction import initialize_compaction_state
        from litellm.router_strategy.simple_shuffle import simple_shuffle
        from litellm.router_utils.router_callbacks.track_deployment_metrics import find_deployment_metadata

        self.update_kwargs_with_deployment = update_kwargs_with_deployment
        self.reasoning_override = deployment_params_with_request_reasoning_override
        self.initialize_compaction_state = initialize_compaction_state
        self.without_router_only_kwargs = without_router_only_kwargs
        self.stamp_deployment_num_retries = stamp_deployment_num_retries
        self.stamp_failed_deployment_id = stamp_failed_deployment_id
        self.simple_shuffle = simple_shuffle
        self.find_deployment_metadata = find_deployment_metadata
        self.prepare_response = prepare_response_for_header_attachment
        self.ensure_additional_headers = ensure_response_additional_headers
        self.apply_response_model_id = apply_response_model_id
        self.apply_quality_headers = apply_quality_router_decision_headers
        self.complexity_headers = complexity_router_decision_headers
        self.apply_remaining_usage_headers = apply_remaining_usage_headers
        self.add_retry_headers = add_retry_headers_to_response
        self.add_fallback_headers = add_fallback_headers_to_response

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


def client_keys(dep_id: str) -> tuple[str, str]:
    """The Router's cache keys of a deployment's async SDK clients: (plain, streaming)."""
    return f"{dep_id}_async_client", f"{dep_id}_stream_async_client"


__all__ = ["RouterPieces", "client_keys"]
