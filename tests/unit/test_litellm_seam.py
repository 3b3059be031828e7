"""Every LiteLLM or openai-SDK internal the package uses goes through one seam,
``llm_resilience_plugin/_litellm.py``; everything else uses LiteLLM's public API.

Internal here means: an import of a LiteLLM module other than the public ones (``litellm``,
``litellm.exceptions``, ``litellm.types.*``, ``litellm.integrations.custom_logger``), an openai
module whose name starts with ``_``, ``litellm.<submodule>`` for any other submodule, and the
Router's / SDK's internal members (read as attributes, via ``getattr`` or as a string key).
"""

from __future__ import annotations

import ast
import importlib.util
import warnings
from pathlib import Path
from typing import Any

import pytest

import llm_resilience_plugin
from llm_resilience_plugin import _litellm

PACKAGE = Path(llm_resilience_plugin.__file__).parent
SEAM = PACKAGE / "_litellm.py"
SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if p != SEAM)

PUBLIC_MODULES = ("litellm", "litellm.exceptions", "litellm.integrations.custom_logger")
PUBLIC_PREFIXES = ("litellm.types.",)
# Members of litellm.Router, its client cache, responses and openai streams that are no public API
# (absent or different on some supported LiteLLM): only the seam touches them.
INTERNAL_MEMBERS = frozenset(
    {
        "registry",
        "health",
        "deployment_tracks_usage",
        "report_stream_success",
        "report_stream_failure",
        "_shaping",
        "cache_dict",
        "ttl_dict",
        "in_memory_llm_clients_cache",
        "_hidden_params",
        "_decoder",
        "_iterator",
    }
)


def _public_module(name: str) -> bool:
    return name in PUBLIC_MODULES or name.startswith(PUBLIC_PREFIXES)


def _internal_import(name: str) -> bool:
    top = name.split(".")[0]
    if top == "litellm":
        return not _public_module(name)
    if top == "openai":
        return any(part.startswith("_") for part in name.split(".")[1:])
    return False


def _is_litellm_submodule(attr: str) -> bool:
    name = f"litellm.{attr}"
    if _public_module(name) or attr == "types":
        return False
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def internal_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) for each LiteLLM/openai internal ``source`` imports or uses."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [(line, a.name) for a in node.names if _internal_import(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _internal_import(node.module):
                found.append((line, node.module))
            elif node.module == "openai":
                found += [(line, f"openai.{a.name}") for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Attribute):
            on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if node.attr in INTERNAL_MEMBERS and not on_self:
                found.append((line, node.attr))
            elif (
                isinstance(node.value, ast.Name)
                and node.value.id == "litellm"
                and _is_litellm_submodule(node.attr)
            ):
                found.append((line, f"litellm.{node.attr}"))
        elif isinstance(node, ast.Constant) and node.value in INTERNAL_MEMBERS:
            found.append((line, repr(node.value)))
    return sorted(set(found))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_litellm_internals_only_in_the_seam(path: Path) -> None:
    uses = internal_uses(path.read_text())
    assert not uses, (
        f"{path.relative_to(PACKAGE)} uses LiteLLM/openai internals {uses}: put the use in "
        "llm_resilience_plugin/_litellm.py (a named capability, detected once) and call that"
    )


def test_the_seam_itself_is_what_the_check_sees() -> None:
    """The check finds the seam's own internals (so it would find them anywhere else)."""
    seen = {what for _, what in internal_uses(SEAM.read_text())}
    assert {"litellm.router_rust.core", "openai._streaming", "'_hidden_params'", "_shaping"} <= seen


def test_the_check_flags_every_spelling() -> None:
    src = (
        "import litellm\n"
        "from litellm.utils import supports_assistant_prefill\n"
        "from litellm.types.router import RouterRateLimitError\n"  # public
        "from litellm.exceptions import Timeout\n"  # public
        "from openai._streaming import ServerSentEvent\n"
        "from openai import AsyncStream, _exceptions\n"
        "def f(router, resp):\n"
        "    router.registry().all(); resp._hidden_params; litellm.router_utils\n"
        "    getattr(resp, '_decoder'); self.health = 1; litellm.acompletion\n"
    )
    assert {what for _, what in internal_uses(src)} == {
        "litellm.utils",
        "openai._streaming",
        "openai._exceptions",
        "registry",
        "_hidden_params",
        "litellm.router_utils",
        "'_decoder'",
    }


def test_capabilities_are_named_and_detected_once() -> None:
    caps = _litellm.capabilities()
    assert set(caps) == {
        "direct_dispatch",
        "usage_counting",
        "sse_skipping",
        "prefill_lookup",
        "token_count_function",
        "client_cache",
        "eof_check",
        "single_send",
        "image_sdk_retries_off",
        "error_body_bound",
    }
    assert _litellm.internals() is _litellm.internals()
    for cap in caps.values():
        assert cap.purpose and cap.instead
        assert cap.available or cap.missing, f"{cap.name} is off without saying what is missing"


def test_a_litellm_outside_the_range_is_an_import_error_naming_it() -> None:
    for outside in ("1.104.9", "1.82.8", "1.82.7", "0.1.824", "2.0.0"):
        with pytest.raises(
            ImportError, match=r"litellm>=1\.105\.0,<2.*litellm " + outside.replace(".", r"\.")
        ):
            _litellm.check_supported(outside)
    for inside in ("1.105.0", "1.105.7", "1.108.14", "1.109.3", "1.110.2", "1.199.0rc1"):
        _litellm.check_supported(inside)


def test_a_missing_capability_warns_once_naming_the_version_and_the_capability(caplog) -> None:
    found = _litellm.Internals(
        version="1.105.7",
        capabilities={
            "direct_dispatch": _litellm.Capability(
                "direct_dispatch", False, "faster", "every attempt goes through the Router", "no RustCore"
            )
        },
    )
    with pytest.warns(
        _litellm.CapabilityWarning,
        match=r"litellm 1\.105\.7: direct_dispatch is not available \(no RustCore\)",
    ):
        found.warn_missing("direct_dispatch")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found.warn_missing("direct_dispatch")  # once per process
    assert [r.message for r in caplog.records if "direct_dispatch" in r.message][:1]


def test_deployments_come_from_the_public_model_list_without_a_registry() -> None:
    class OldRouter:  # a LiteLLM Router before registry(): only its public model_list
        model_list = [{"model_name": "g", "litellm_params": {"model": "openai/x"}, "model_info": {"id": "a"}}]

    assert _litellm.deployments_of(OldRouter()) == OldRouter.model_list
    assert _litellm.shaping_of(OldRouter()) is None  # no direct dispatch, not an AttributeError


def test_a_finish_litellm_supplied_is_told_from_the_providers() -> None:
    """Without ``eof_check`` the plugin reads the provider's stream wrapper (looked through the
    Router's fallback generator); with it, LiteLLM checks and there is nothing to read."""

    class Wrapper:  # LiteLLM's CustomStreamWrapper, as far as the witness reads it
        def __init__(self, finish: str | None, source: object = None) -> None:
            self.received_finish_reason = finish
            self.intermittent_finish_reason = None
            self.completion_stream = source

    def router_wrapper(inner: Wrapper) -> Wrapper:
        async def stream_with_fallbacks() -> Any:  # the Router's generator over the provider's
            async for item in model_response:  # type: ignore[attr-defined]
                yield item

        model_response = inner
        return Wrapper(None, stream_with_fallbacks())

    found = _litellm.internals()
    if found.has("eof_check"):
        assert _litellm.finish_witness(Wrapper(None)) is None
        return
    provider = Wrapper(None)
    witness = _litellm.finish_witness(router_wrapper(provider))
    assert witness is not None and witness() is False  # LiteLLM would supply "stop"
    provider.received_finish_reason = "stop"
    assert witness() is True
    assert _litellm.finish_witness(object()) is None  # not LiteLLM's chat stream
