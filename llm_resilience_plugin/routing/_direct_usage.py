"""Per-deployment usage of direct attempts, counted in the wrapped Router's own health state.

A deployment with ``rpm``/``tpm`` limits has its requests and tokens of the minute counted by the
Router (``deployment_callback_on_success`` / the failure report of the Rust core, litellm 1.110
``router_rust/surface/health.py``): the counts feed the ``x-ratelimit-remaining-*`` response
headers and any strategy or check that reads them. A direct attempt on such a deployment reports
its outcome through the same health entry points the Router uses for a stream that ended
(``report_stream_success`` / ``report_stream_failure``), so the counters both paths write are one.
Proven by ``tests/integration/test_direct_usage.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llm_resilience_plugin import _litellm


def _raised_before_provider(error: BaseException) -> bool:
    """The Router core's rule: a request LiteLLM refused before it reached the provider (a
    parameter the provider does not take, a malformed priority) is no request of the deployment."""
    from litellm.exceptions import UnsupportedParamsError

    body = getattr(error, "body", None)
    return isinstance(error, UnsupportedParamsError) or (
        isinstance(body, Mapping) and body.get("param") == "priority"
    )


class UsageAccounting:
    """Counts direct attempts against their deployment's minute, as the wrapped Router would."""

    def __init__(self, router: Any) -> None:
        self.router = router  # its outcome callbacks (``report_stream_success`` ...) are the core's
        self.health_state = _litellm.router_health(router)
        self._tracks: dict[tuple[str, str], bool] = {}

    def tracks(self, dep_id: str, group: str) -> bool:
        """Does the Router count this deployment's usage (a limit on it or in its model info)?"""
        key = (dep_id, group)
        known = self._tracks.get(key)
        if known is None:
            known = self._tracks[key] = _litellm.tracks_usage(self.router, dep_id, group)
        return known

    @staticmethod
    def _logged(sent: Mapping[str, Any], field: str, group: str, **extra: Any) -> dict[str, Any]:
        md = dict(sent.get(field) or {})
        md["model_group"] = group
        return {
            "litellm_params": {"metadata": md, "model_info": sent.get("model_info")},
            **extra,
        }

    async def success(self, resp: Any, sent: Mapping[str, Any], field: str, group: str) -> None:
        """One request and the response's tokens against the deployment (and the session re-pin
        the Router's attempt runs after a success)."""
        tokens = getattr(getattr(resp, "usage", None), "total_tokens", None)  # the core's ``total_tokens``
        logged = self._logged(
            sent,
            field,
            group,
            standard_logging_object={"total_tokens": tokens if isinstance(tokens, int) else 0},
        )
        await _litellm.report_usage_success(self.router, logged, resp)

    async def failure(self, error: BaseException, sent: Mapping[str, Any], field: str, group: str) -> None:
        """A failed request: one more request of the minute and a failure of the deployment."""
        if _raised_before_provider(error):
            return
        await _litellm.report_usage_failure(self.router, self._logged(sent, field, group, exception=error))

    async def remaining(self, group: str) -> Mapping[str, Any]:
        """The group's remaining usage, which the Router puts in ``x-ratelimit-remaining-*``."""
        return await _litellm.remaining_usage(self.health_state, group)


__all__ = ["UsageAccounting"]
