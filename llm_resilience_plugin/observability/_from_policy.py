"""The policy's ``observability:`` section applied when a router is built: ``auto`` is on when the
package imports, ``on`` without it is a :class:`ConfigError` naming the extra to install."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.observability._instrumentation import instrument, wanted

if TYPE_CHECKING:
    from llm_resilience_plugin.policy import ObservabilityPolicy


def _nothing() -> None:
    return None


def apply_observability(router: Any, section: ObservabilityPolicy | None) -> Callable[[], None]:
    """Instrument ``router`` as ``section`` says (None: nothing); returns the detach function."""
    if section is None:
        return _nothing
    switches = {"otel": section.otel, "prometheus": section.prometheus}
    for backend, switch in switches.items():
        try:
            switches[backend] = "on" if wanted(backend, switch) else "off"
        except ImportError as exc:
            raise ConfigError(f"observability.{backend}", str(exc)) from None
    if switches["otel"] == switches["prometheus"] == "off":
        return _nothing  # neither installed nor wanted: nothing subscribes, calls pay nothing
    return instrument(
        router,
        otel=switches["otel"],  # type: ignore[arg-type]
        prometheus=switches["prometheus"],  # type: ignore[arg-type]
        capture_content=section.capture_content,
        budget_scope_values=section.budget_scope_values,
    )
