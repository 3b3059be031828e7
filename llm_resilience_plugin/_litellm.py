"""The one seam to LiteLLM's (and the openai SDK's) internals: every private or internal name the
package uses is imported or read here, and nowhere else (``tests/unit/test_litellm_seam.py``).

Each internal feature is found once, on first use (:func:`internals`, which the routing package
calls at import), and named as a capability. Where one is missing (an older LiteLLM, or a newer one
whose internals moved) the plugin serves that feature through LiteLLM's public API instead and
warns once, naming the LiteLLM version and the capability; ``llm-resilience check`` lists them.
A LiteLLM below :data:`SUPPORTED` is an ``ImportError`` naming the supported range.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from types import SimpleNamespace
from typing import Any

from llm_resilience_plugin import _env  # noqa: F401  (must run before litellm is imported)

# The LiteLLM versions the plugin supports (pyproject.toml says the same; 1.82.7 and 1.82.8 were
# compromised releases, kept out by the floor). 1.105.0 is the oldest release the unit and
# integration suites pass on (docs/litellm-versions.md).
FLOOR = (1, 105, 0)
CEILING = (2, 0, 0)
SUPPORTED = ">=1.105.0,<2"
# Direct dispatch reproduces the Router's attempt with LiteLLM's own internal functions; it is on
# only for the minor releases whose equivalence suite passed (tests/integration/test_direct_*.py).
DIRECT_VERIFIED = ((1, 110),)

logger = logging.getLogger("llm_resilience")


class CapabilityWarning(RuntimeWarning):
    """A LiteLLM internal the plugin would use is missing; that part goes through the public API."""


def _parse(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit()) if piece else ""
        if not digits:
            break
        parts.append(int(digits))
        if not piece.isdigit():
            break
    return tuple(parts)


def litellm_version() -> str:
    """The installed LiteLLM's version (``litellm`` has no ``__version__``)."""
    try:
        return version("litellm")
    except PackageNotFoundError:  # pragma: no cover - a source checkout without metadata
        return "0+unknown"


def check_supported(text: str) -> None:
    """ImportError if LiteLLM ``text`` is outside :data:`SUPPORTED`."""
    parsed = _parse(text)
    if parsed and not (FLOOR <= parsed < CEILING):
        raise ImportError(
            f"llm-resilience-plugin supports litellm{SUPPORTED}; litellm {text} is installed: "
            f'run pip install "litellm{SUPPORTED}"'
        )


@dataclass(frozen=True, slots=True)
class Capability:
    """One internal LiteLLM feature the plugin can use, and, when it cannot, why and what instead."""

    name: str
    available: bool
    purpose: str
    instead: str  # what the plugin does without it
    missing: str = ""  # what was not found
    holds: bool = True  # does every resilience guarantee hold without it?


@dataclass(frozen=True)
class Internals:
    """LiteLLM's internal pieces, found once; None (and the capability off) where missing."""

    version: str
    capabilities: dict[str, Capability]
    direct: Any = None  # a namespace of the Router's shaping/header functions (direct dispatch)
    prefill: Callable[..., Any] | None = None
    count_function: Callable[[str], Any] | None = None
    loop_token: Callable[[], Any] | None = None
    sse_event: type[Any] | None = None
    async_stream: type[Any] | None = None
    _warned: set[str] = field(default_factory=set)

    def has(self, name: str) -> bool:
        """Is capability ``name`` available on this LiteLLM?"""
        cap = self.capabilities.get(name)
        return cap is not None and cap.available

    def warn_missing(self, name: str) -> None:
        """Say once per process that capability ``name`` is off, naming LiteLLM's version."""
        cap = self.capabilities[name]
        if cap.available or name in self._warned:
            return
        self._warned.add(name)
        message = f"litellm {self.version}: {cap.name} is not available ({cap.missing}); {cap.instead}. " + (
            "Every resilience guarantee holds." if cap.holds else "The other guarantees hold."
        )
        warnings.warn(message, CapabilityWarning, stacklevel=3)
        logger.warning(message)


def _direct_pieces(router_cls: Any) -> tuple[Any, str]:
    """The functions a direct attempt calls (the Router's own), or (None, what is missing)."""
    try:
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
        from litellm.litellm_core_utils.clientside_credential_handler import clientside_credential_keys
        from litellm.litellm_core_utils.routing_common_utils import (
            provider_for_generic_call,
            without_router_only_kwargs,
        )
        from litellm.router_attempt import ROUTING_KEYS
        from litellm.router_rust.core import RustCore
        from litellm.router_rust.invoke.shaping import (
            STREAM_TIMEOUT_AWARE_GENERIC_HANDLERS,
            deployment_params_with_request_reasoning_override,
            stamp_deployment_num_retries,
            stamp_failed_deployment_id,
            stamp_retry_skip_deployment_id,
            update_kwargs_with_deployment,
        )
        from litellm.router_strategy.complexity_router.context_compaction import (
            initialize_compaction_state,
            surface_for_call,
        )
        from litellm.router_strategy.simple_shuffle import simple_shuffle
        from litellm.router_utils.client_initalization_utils import MaxParallelRequestsLimit
        from litellm.router_utils.router_callbacks.track_deployment_metrics import find_deployment_metadata
        from litellm.utils import calculate_max_parallel_requests
    except ImportError as e:
        return None, str(e).split(" (")[0]
    for member in ("registry", "health"):
        if not callable(getattr(router_cls, member, None)):
            return None, f"litellm.Router.{member}()"
    return (
        SimpleNamespace(
            core_members=RustCore.__dict__,
            routing_keys=frozenset(ROUTING_KEYS),
            clientside_keys=frozenset(clientside_credential_keys),
            update_kwargs_with_deployment=update_kwargs_with_deployment,
            reasoning_override=deployment_params_with_request_reasoning_override,
            initialize_compaction_state=initialize_compaction_state,
            surface_for_call=surface_for_call,
            without_router_only_kwargs=without_router_only_kwargs,
            provider_for_generic_call=provider_for_generic_call,
            stream_timeout_aware_generic_handlers=STREAM_TIMEOUT_AWARE_GENERIC_HANDLERS,
            stamp_deployment_num_retries=stamp_deployment_num_retries,
            stamp_failed_deployment_id=stamp_failed_deployment_id,
            stamp_retry_skip_deployment_id=stamp_retry_skip_deployment_id,
            simple_shuffle=simple_shuffle,
            find_deployment_metadata=find_deployment_metadata,
            prepare_response=prepare_response_for_header_attachment,
            ensure_additional_headers=ensure_response_additional_headers,
            apply_response_model_id=apply_response_model_id,
            apply_quality_headers=apply_quality_router_decision_headers,
            complexity_headers=complexity_router_decision_headers,
            apply_remaining_usage_headers=apply_remaining_usage_headers,
            add_retry_headers=add_retry_headers_to_response,
            add_fallback_headers=add_fallback_headers_to_response,
            max_parallel_limit=MaxParallelRequestsLimit,
            calculate_max_parallel_requests=calculate_max_parallel_requests,
        ),
        "",
    )


def _prefill_from_model_info(model: str, provider: str | None = None) -> bool:
    """``supports_assistant_prefill`` from LiteLLM's public ``get_model_info``."""
    import litellm

    info = litellm.get_model_info(model, custom_llm_provider=provider)
    return bool(info.get("supports_assistant_prefill"))


def _capability(
    name: str, ok: bool, missing: str, purpose: str, instead: str, holds: bool = True
) -> Capability:
    return Capability(name, ok, purpose, instead, "" if ok else missing, holds)


def _run_probe(probe: Callable[[], Any]) -> Any:
    """Run coroutine function ``probe`` on a loop of its own (a thread: the caller's loop may run)."""
    import asyncio
    import threading

    out: list[Any] = []

    def run() -> None:
        try:
            out.append(asyncio.run(probe()))
        except Exception as e:  # a probe that cannot run says the capability is missing
            out.append(e)

    thread = threading.Thread(target=run, name="llm-resilience-probe", daemon=True)
    thread.start()
    thread.join(5.0)
    return out[0] if out else TimeoutError("probe did not finish")


def _single_send_capability() -> Capability:
    """Does LiteLLM's HTTP handler (Anthropic and the other non-SDK providers) send a request
    once? Probed offline: a transport that resets the connection, counting the sends."""
    import httpx

    try:
        from litellm.llms.custom_httpx.http_handler import AsyncHTTPHandler
    except ImportError as e:  # pragma: no cover - another layout
        return _capability("single_send", False, str(e), "", "")
    sent: list[int] = []

    def reset(request: httpx.Request) -> httpx.Response:
        sent.append(1)
        raise httpx.RemoteProtocolError("probe: connection reset", request=request)

    async def probe() -> int:
        handler = AsyncHTTPHandler(transport=httpx.MockTransport(reset))
        clients = [httpx.AsyncClient(transport=httpx.MockTransport(reset))]
        handler.client = clients[0]

        def fresh(*args: Any, **kwargs: Any) -> httpx.AsyncClient:
            clients.append(httpx.AsyncClient(transport=httpx.MockTransport(reset)))
            return clients[-1]

        handler.create_client = fresh  # type: ignore[method-assign]
        with contextlib.suppress(Exception):
            await handler.post("http://127.0.0.1:9/probe", json={})
        for client in clients:
            await client.aclose()
        return len(sent)

    got = _run_probe(probe)
    return _capability(
        "single_send",
        got == 1,
        "LiteLLM's AsyncHTTPHandler.post sends a request again after a connection reset",
        "one attempt is one request on every provider",
        "a reset connection to Anthropic (or another provider LiteLLM calls over its own HTTP "
        "handler) is resent once inside the attempt: the plugin sees one attempt",
        holds=False,
    )


def _image_retries_capability() -> Capability:
    """Does LiteLLM's OpenAI image generation turn the openai SDK's own retries off for the
    Router? Found where the Router's call marks itself (``sdk_max_retries``); older releases
    drop ``max_retries`` on that path, and the SDK retries a 429 twice inside one attempt."""
    import inspect

    try:
        from litellm.images import main as images_main

        source = inspect.getsource(images_main)
    except (ImportError, OSError, TypeError) as e:  # pragma: no cover - no source shipped
        source, why = "", str(e)
    else:
        why = "litellm.images.main passes no max_retries to the openai SDK"
    return _capability(
        "image_sdk_retries_off",
        "sdk_max_retries" in source,
        why,
        "one image-generation attempt is one request",
        "the openai SDK retries a 429 or 5xx of an OpenAI image generation up to twice inside "
        "one attempt: the plugin sees the attempt's outcome only",
        holds=False,
    )


def _bounding(original: Callable[..., Any]) -> Callable[..., Any]:
    """LiteLLM's transport factory, made to bound what it builds (``_error_bodies``)."""
    from llm_resilience_plugin._error_bodies import bound_transport

    @functools.wraps(original)
    def create_async_transport(*args: Any, **kwargs: Any) -> Any:
        transport = original(*args, **kwargs)
        if transport is not None:
            with contextlib.suppress(TypeError, AttributeError):  # a transport with __slots__: as it is
                bound_transport(transport)
        return transport

    create_async_transport.bounds_error_bodies = True  # type: ignore[attr-defined]
    return create_async_transport


def _error_body_capability() -> Capability:
    """Cut long provider error bodies of the plugin's attempts at the transport, before LiteLLM
    redacts them on the loop (``_error_bodies``): every httpx transport LiteLLM builds through
    ``AsyncHTTPHandler.create_async_transport`` (``_create_async_transport`` before 1.108) - the
    OpenAI SDK's clients and LiteLLM's own HTTP handler - is made to cut them. Installed once, at
    the first :func:`internals`; transports built before then are not."""
    from llm_resilience_plugin._error_bodies import ERROR_BODY_LIMIT

    try:
        from litellm.llms.custom_httpx.http_handler import AsyncHTTPHandler
    except ImportError as e:  # pragma: no cover - another layout
        factories: dict[str, Any] = {}
        missing = f"litellm.llms.custom_httpx.http_handler.AsyncHTTPHandler ({e})"
    else:
        names = ("create_async_transport", "_create_async_transport")
        factories = {n: AsyncHTTPHandler.__dict__[n] for n in names if n in AsyncHTTPHandler.__dict__}
        missing = "" if factories else "AsyncHTTPHandler.create_async_transport"
    for name, made in factories.items():
        if isinstance(made, staticmethod) and not getattr(made.__func__, "bounds_error_bodies", False):
            setattr(AsyncHTTPHandler, name, staticmethod(_bounding(made.__func__)))
    return _capability(
        "error_body_bound",
        not missing,
        missing,
        f"a provider's error body over {ERROR_BODY_LIMIT:,} characters cut before LiteLLM reads "
        "it (LiteLLM redacts a long body on the event loop, several times per error)",
        "a long error body reaches LiteLLM whole: its redaction stalls the loop ~0.5 s per 100 kB",
        holds=False,
    )


@functools.cache
def internals() -> Internals:
    """Find LiteLLM's internal pieces once (ImportError below the supported floor)."""
    text = litellm_version()
    check_supported(text)
    import litellm

    caps: dict[str, Capability] = {}
    direct, missing = _direct_pieces(litellm.Router)
    minor = _parse(text)[:2]
    if direct is not None and minor not in DIRECT_VERIFIED:
        missing = "its equivalence suite passed on litellm " + ", ".join(
            ".".join(map(str, v)) + ".x" for v in DIRECT_VERIFIED
        )
        direct = None
    caps["direct_dispatch"] = _capability(
        "direct_dispatch",
        direct is not None,
        missing,
        "an attempt sent straight through litellm.acompletion with the Router's own kwargs",
        "every attempt goes through the Router (slower, same behaviour)",
    )
    usage = direct is not None and all(
        callable(getattr(litellm.Router, m, None))
        for m in ("deployment_tracks_usage", "report_stream_success", "report_stream_failure")
    )
    caps["usage_counting"] = _capability(
        "usage_counting",
        usage,
        "litellm.Router.deployment_tracks_usage()/report_stream_success()",
        "direct attempts counted in the Router's rpm/tpm usage",
        "groups with rpm/tpm limits go through the Router",
    )
    try:
        from openai import AsyncStream
        from openai._streaming import ServerSentEvent
    except ImportError:  # pragma: no cover - another SDK layout
        AsyncStream = ServerSentEvent = None  # type: ignore[assignment,misc]
    caps["sse_skipping"] = _capability(
        "sse_skipping",
        ServerSentEvent is not None and direct is not None,
        "direct_dispatch and openai._streaming.ServerSentEvent",
        "a malformed, text-free stream event of a direct attempt skipped instead of breaking the stream",
        "a malformed stream event breaks the stream, which is recovered like any other break",
    )
    prefill: Any = getattr(litellm, "supports_assistant_prefill", None)
    if prefill is None:
        try:
            from litellm.utils import supports_assistant_prefill as prefill
        except ImportError:  # older LiteLLM: its public model-info lookup says the same
            prefill = _prefill_from_model_info if callable(getattr(litellm, "get_model_info", None)) else None
    caps["prefill_lookup"] = _capability(
        "prefill_lookup",
        callable(prefill),
        "litellm.utils.supports_assistant_prefill and litellm.get_model_info",
        "LiteLLM's model map says which models continue an assistant message",
        "only model_info.supports_assistant_prefill says so (unset: not supported)",
    )
    try:
        from litellm.litellm_core_utils.token_counter import _get_count_function as count_function
    except ImportError:
        count_function = None  # type: ignore[assignment]
    caps["token_count_function"] = _capability(
        "token_count_function",
        count_function is not None,
        "litellm.litellm_core_utils.token_counter._get_count_function",
        "a model's text token counter resolved once per model",
        "litellm.token_counter() on every count (same counts, slower)",
    )
    try:
        from litellm.caching.evicted_client_closer import running_loop_token as loop_token
    except ImportError:
        loop_token = None  # type: ignore[assignment]
    cache = getattr(litellm, "in_memory_llm_clients_cache", None)
    client_cache = loop_token is not None and isinstance(getattr(cache, "cache_dict", None), dict)
    caps["client_cache"] = _capability(
        "client_cache",
        client_cache,
        "litellm.caching.evicted_client_closer.running_loop_token",
        "a router's private-loop HTTP clients closed when it closes",
        "those clients are closed by LiteLLM's own exit hook",
    )
    from litellm.litellm_core_utils.streaming_handler import CustomStreamWrapper

    caps["eof_check"] = _capability(
        "eof_check",
        callable(getattr(CustomStreamWrapper, "_should_fail_on_clean_eof", None)),
        "CustomStreamWrapper._should_fail_on_clean_eof",
        "LiteLLM fails a stream that ends without the provider's finish (an undecodable event, "
        "a cut Anthropic stream)",
        "the plugin reads whether the provider sent the finish itself; a stream whose 'stop' "
        "LiteLLM supplied is a break",
    )
    caps["single_send"] = _single_send_capability()
    caps["image_sdk_retries_off"] = _image_retries_capability()
    caps["error_body_bound"] = _error_body_capability()
    return Internals(
        version=text,
        capabilities=caps,
        direct=direct,
        prefill=prefill if callable(prefill) else None,
        count_function=count_function,
        loop_token=loop_token if client_cache else None,
        sse_event=ServerSentEvent,
        async_stream=AsyncStream,
    )


def capabilities() -> dict[str, Capability]:
    """Each internal capability and whether this LiteLLM has it (``llm-resilience check``)."""
    return dict(internals().capabilities)


# -- the Router's internal members --------------------------------------------------------------


def deployments_of(router: Any) -> list[dict[str, Any]]:
    """The Router's deployments as dicts (``model_name``, ``litellm_params``, ``model_info``):
    its registry where it has one (``os.environ/`` resolved), else its public ``model_list``."""
    registry = getattr(router, "registry", None)
    if callable(registry):
        return list(registry().all())
    return [d for d in (getattr(router, "model_list", None) or []) if isinstance(d, dict)]


def shaping_of(router: Any) -> tuple[Any, Any] | None:
    """The Router's request shaping and routing cache (direct dispatch), or None."""
    if internals().direct is None:
        return None
    try:
        return router._shaping, router.health().store
    except Exception:
        return None


def router_health(router: Any) -> Any:
    """The Router's health state (usage counters), for :mod:`routing._direct_usage`."""
    return router.health()


def tracks_usage(router: Any, dep_id: str, group: str) -> bool:
    """Does the Router count ``dep_id``'s per-minute usage (rpm/tpm)?"""
    return bool(router.deployment_tracks_usage(dep_id, group))


async def remaining_usage(health: Any, group: str) -> Mapping[str, Any]:
    """A group's remaining usage, which the Router puts in ``x-ratelimit-remaining-*``."""
    got = await health.usage(group, kind="remaining")
    return got if isinstance(got, Mapping) else {}


async def report_usage_success(router: Any, logged: Mapping[str, Any], response: Any) -> None:
    """Count a direct attempt's request and tokens where the Router counts a finished stream's."""
    await router.report_stream_success(logged, response)


async def report_usage_failure(router: Any, logged: Mapping[str, Any]) -> None:
    """Count a failed direct attempt where the Router counts a failed stream."""
    await router.report_stream_failure(logged)


def client_cache_keys(dep_id: str) -> tuple[str, str]:
    """The Router's cache keys of a deployment's async SDK clients: (plain, streaming)."""
    return f"{dep_id}_async_client", f"{dep_id}_stream_async_client"


def slot_key(dep_id: str) -> str:
    """The Router's cache key of a deployment's ``max_parallel_requests`` limit."""
    return f"{dep_id}_max_parallel_requests_client"


def loop_clients() -> tuple[list[tuple[str, Any]], Callable[[str], None]]:
    """LiteLLM's cached HTTP clients bound to the running loop, and a function dropping one from
    its cache; nothing where this LiteLLM keys no clients per loop."""
    import litellm

    got = internals()
    token = got.loop_token() if got.loop_token is not None else None
    cache = getattr(litellm, "in_memory_llm_clients_cache", None)
    entries = getattr(cache, "cache_dict", None)
    if token is None or not isinstance(entries, dict):
        return [], _keep
    suffix = f"-{token}"
    ttl = getattr(cache, "ttl_dict", None)

    def drop(key: str) -> None:
        entries.pop(key, None)
        if isinstance(ttl, dict):
            ttl.pop(key, None)

    return [(k, entries.get(k)) for k in list(entries) if isinstance(k, str) and k.endswith(suffix)], drop


def _keep(key: str) -> None:
    return None


# -- responses and streams ------------------------------------------------------------------------


def hidden_params_of(obj: Any) -> dict[str, Any] | None:
    """LiteLLM's ``_hidden_params`` of a response or chunk (model id, cost, headers), or None.

    Read from pydantic's private-attribute store when there is one: plain ``getattr`` on a
    LiteLLM response goes through pydantic's Python-level ``__getattr__`` (about 2 µs a read).
    """
    private = getattr(obj, "__pydantic_private__", None)
    # ``type(x) is dict`` first: what pydantic and LiteLLM keep, without an isinstance call
    hidden = private.get("_hidden_params") if type(private) is dict or isinstance(private, dict) else None
    if hidden is None:
        hidden = getattr(obj, "_hidden_params", None)
    return hidden if type(hidden) is dict or isinstance(hidden, dict) else None


def set_hidden_params(obj: Any, params: dict[str, Any]) -> None:
    """Give a response LiteLLM's ``_hidden_params`` (LiteLLM 1.105-1.108 have no public
    ``hidden_params`` setter, and its constructor's ``hidden_params`` is lost to pydantic)."""
    obj._hidden_params = params


def finish_witness(stream: Any) -> Callable[[], bool] | None:
    """Where LiteLLM lets a chat stream end without the provider's finish and supplies ``stop``
    itself (no ``eof_check``: an undecodable Anthropic event swallows the rest of the stream), a
    function telling, once the stream has ended, whether the provider sent a finish reason.
    None where LiteLLM checks this itself, or the stream is not LiteLLM's chat stream.

    Call it on the unread stream: the Router's fallback wrapper (an async generator over the
    provider's stream) is looked through while its frame is alive."""
    if internals().has("eof_check"):
        return None
    wrapper = stream
    for _ in range(4):  # the Router's wrapper around the provider's stream, if any
        frame = getattr(getattr(wrapper, "completion_stream", None), "ag_frame", None)
        inner = frame.f_locals.get("model_response") if frame is not None else None
        if inner is None:
            break
        wrapper = inner
    if not hasattr(wrapper, "received_finish_reason"):
        return None

    def finished() -> bool:
        return (
            getattr(wrapper, "received_finish_reason", None) is not None
            or getattr(wrapper, "intermittent_finish_reason", None) is not None
        )

    return finished


def sdk_stream_decoder(stream: Any) -> Any:
    """The SSE decoder of an unread ``openai.AsyncStream`` (None if not one, or already read)."""
    stream_type = internals().async_stream
    if stream_type is None or not isinstance(stream, stream_type):
        return None
    return getattr(stream, "_decoder", None)


def set_sdk_stream_decoder(stream: Any, decoder: Any) -> None:
    """Swap an unread ``openai.AsyncStream``'s SSE decoder (before its generator takes it)."""
    stream._decoder = decoder


def sdk_stream_generator(stream: Any) -> Any:
    """The async generator behind an ``openai.AsyncStream`` (to tell whether it started)."""
    return getattr(stream, "_iterator", None)


def count_function(model: str) -> Callable[[str], int] | None:
    """LiteLLM's text token counter for ``model``, or None (then ``litellm.token_counter``)."""
    fn = internals().count_function
    if fn is None:
        return None
    try:
        return fn(model)  # type: ignore[no-any-return]
    except Exception:
        return None


def supports_assistant_prefill(model: str, provider: str | None) -> bool:
    """LiteLLM's model map: can ``model`` continue an assistant message? False if unknown."""
    fn = internals().prefill
    if fn is None:
        internals().warn_missing("prefill_lookup")
        return False
    try:
        return bool(fn(model, provider))
    except Exception:
        return False


__all__ = [
    "SUPPORTED",
    "Capability",
    "CapabilityWarning",
    "Internals",
    "capabilities",
    "check_supported",
    "client_cache_keys",
    "count_function",
    "deployments_of",
    "finish_witness",
    "hidden_params_of",
    "internals",
    "litellm_version",
    "loop_clients",
    "remaining_usage",
    "report_usage_failure",
    "report_usage_success",
    "router_health",
    "sdk_stream_decoder",
    "sdk_stream_generator",
    "set_hidden_params",
    "set_sdk_stream_decoder",
    "shaping_of",
    "slot_key",
    "supports_assistant_prefill",
    "tracks_usage",
]


def response_format_of(schema: type) -> dict[str, Any]:
    """The ``response_format`` LiteLLM (and the OpenAI SDK) build for a Pydantic class: its strict
    JSON schema (closed objects, every property required). Where this LiteLLM has no builder,
    the class's own JSON schema, named after it."""
    try:
        from litellm.utils import type_to_response_format_param
    except ImportError:
        type_to_response_format_param = None  # type: ignore[assignment]
    if type_to_response_format_param is not None:
        built = type_to_response_format_param(schema)
        if built is not None:
            return dict(built)
    json_schema = schema.model_json_schema()  # type: ignore[attr-defined]
    return {"type": "json_schema", "json_schema": {"name": schema.__name__, "schema": json_schema}}


def proxy_general_settings() -> Any:
    """LiteLLM proxy's model of a config's ``general_settings`` (a pydantic class), or None where
    this LiteLLM has none; read by ``llm-resilience check`` only (the router never reads them)."""
    try:
        from litellm.proxy._types import ConfigGeneralSettings
    except Exception:  # an older or slimmer LiteLLM: the keys cannot be checked
        return None
    return ConfigGeneralSettings
