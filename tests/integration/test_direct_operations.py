"""Direct dispatch of embeddings, text completions, image generations and Responses calls is
equivalent to the Router's: the same calls through both dispatchers against the simulator pass the
same kwargs to LiteLLM's function, send the same request bodies and headers, and give the same
responses (``_hidden_params``, usage), errors, callbacks and SDK clients; an embedding attempt is
one request (no SDK retries) on both paths."""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import litellm
import pytest

from llm_resilience_plugin import AllRoutesFailedError, ResilientRouter
from llm_resilience_plugin.events import hidden_params_of
from llm_resilience_plugin.routing._direct import DirectDispatcher
from llm_resilience_plugin.testing import FakeClock
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator
from tests.conftest import FAST_POLICY, requires_capability
from tests.integration._parity import Events

# The equivalence suite of a LiteLLM internal: skipped, naming it, where this LiteLLM lacks it.
pytestmark = requires_capability("direct_dispatch")

MODES = ("router", "direct")
# operation -> (model, model_info extras, payload)
OPS: dict[str, tuple[str, dict[str, Any], Any]] = {
    "embedding": (
        "openai/text-embedding-3-small",
        {"mode": "embedding", "output_vector_size": 16},
        ["alpha", "beta"],
    ),
    "text_completion": (
        "openai/gpt-3.5-turbo-instruct",
        {"mode": "completion", "base_model": "gpt-3.5-turbo-instruct"},
        "Say hello",
    ),
    "image_generation": (
        "openai/dall-e-3",
        {"mode": "image_generation", "output_cost_per_image": 0.04},
        "a red cube",
    ),
    "responses": ("openai/gpt-4o-mini", {"mode": "responses"}, "Say hello"),
}
FUNCTIONS = {
    "embedding": "aembedding",
    "text_completion": "atext_completion",
    "image_generation": "aimage_generation",
    "responses": "aresponses",
}
VOLATILE_HIDDEN = {"_response_ms", "litellm_overhead_time_ms", "litellm_call_id", "llm_resilience_report"}
VOLATILE_HEADERS = {"date", "llm_provider-date", "x-litellm-response-duration-ms", "content-length"}
VOLATILE_HEADERS |= {"llm_provider-content-length"}  # the provider's response ids differ in length


def _model_list(sim: ProviderSimulator, op: str, deps: tuple[str, ...] = ("a",), **params: Any) -> list[Any]:
    model, info, _ = OPS[op]
    return [
        {
            "model_name": "g",
            "litellm_params": {
                "model": model,
                "api_base": sim.api_base(d),
                "api_key": "sk-sim-secret",
                **params,
            },
            "model_info": {"id": d, **info},
        }
        for d in deps
    ]


@pytest.fixture
def pair(sim: ProviderSimulator) -> Iterator[Callable[..., dict[str, ResilientRouter]]]:
    made: list[ResilientRouter] = []

    def make(
        model_list: list[Any], policy: dict[str, Any] | None = None, **kw: Any
    ) -> dict[str, ResilientRouter]:
        rs = {
            mode: ResilientRouter(
                model_list=model_list,
                policy={**FAST_POLICY, **(policy or {}), "dispatch": mode},
                clock=FakeClock(),
                seed=7,
                **kw,
            )
            for mode in MODES
        }
        made.extend(rs.values())
        return rs

    yield make
    for r in made:
        r.close()


class Recorder:
    """Wraps LiteLLM's module functions to record the kwargs each attempt passes them (keeping
    their ``__name__``: the Router's generic path reads it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        for name in FUNCTIONS.values():
            orig = getattr(litellm, name)

            def wrap(orig: Any, name: str) -> Any:
                @functools.wraps(orig)
                async def rec(*args: Any, **kwargs: Any) -> Any:
                    self.calls.append((name, kwargs))
                    return await orig(*args, **kwargs)

                return rec

            monkeypatch.setattr(litellm, name, wrap(orig, name))


def _call(r: ResilientRouter, op: str, **kw: Any) -> Any:
    return getattr(r, "a" + op)("g", OPS[op][2], **kw)


def _normal_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    out = dict(kw)
    out.pop("litellm_trace_id")
    state = out.pop("_context_compaction_state", None)
    if state is not None:
        out["_context_compaction_state"] = (type(state).__name__, state.surface, state.config)
    for field in ("metadata", "litellm_metadata"):
        if isinstance(out.get(field), dict):
            md = dict(out[field])
            md.pop("_llm_resilience_attempt", None)
            md.pop("llm_api_timing_windows", None)  # written by LiteLLM during the call
            md.pop("hidden_params", None)  # written by LiteLLM's success logging after the call
            out[field] = md
    return out


def _body(op: str, resp: Any) -> Any:
    d = resp.model_dump() if hasattr(resp, "model_dump") else dict(resp)
    for k in ("id", "created", "created_at"):
        d.pop(k, None)
    if op == "responses":
        for item in d.get("output") or []:
            if isinstance(item, dict):
                item.pop("id", None)
    return d


@pytest.mark.parametrize("op", list(OPS))
async def test_same_arguments_bodies_headers_and_responses(
    sim: ProviderSimulator, monkeypatch: pytest.MonkeyPatch, pair: Any, op: str
) -> None:
    monkeypatch.setenv("DIRECT_OPS_KEY", "sk-from-env")
    ml = _model_list(
        sim, op, api_key="os.environ/DIRECT_OPS_KEY", extra_headers={"x-team": "blue"}, timeout=7
    )
    rs = pair(ml, router_settings={"timeout": 9})
    rec = Recorder(monkeypatch)
    for call in ({}, {"metadata": {"tags": ["t1"], "user_id": "u"}, "user": "me"}):
        resps, kws, reqs = {}, {}, {}
        for mode, r in rs.items():
            sim.clear_log()
            n = len(rec.calls)
            resps[mode] = await _call(r, op, **call)
            assert len(rec.calls) == n + 1 and rec.calls[-1][0] == FUNCTIONS[op]
            kws[mode] = rec.calls[-1][1]
            (reqs[mode],) = sim.requests()
        assert rs["direct"].engine.dispatcher.sent_direct > 0  # type: ignore[union-attr]
        assert _normal_kwargs(kws["router"]) == _normal_kwargs(kws["direct"])
        assert kws["direct"]["api_key"] == "sk-from-env"
        assert reqs["router"].body == reqs["direct"].body
        assert reqs["router"].headers == reqs["direct"].headers
        a, b = resps["router"], resps["direct"]
        assert _body(op, a) == _body(op, b)
        ha, hb = hidden_params_of(a), hidden_params_of(b)
        for key in ("model_id", "api_base", "response_cost", "litellm_model_name", "custom_llm_provider"):
            assert ha.get(key) == hb.get(key), key
        assert ha["model_id"] == "a" and ha["response_cost"] > 0
        assert {k for k in ha if k not in VOLATILE_HIDDEN} == {k for k in hb if k not in VOLATILE_HIDDEN}
        norm = lambda h: {k: v for k, v in (h or {}).items() if k not in VOLATILE_HEADERS}  # noqa: E731
        assert norm(ha.get("additional_headers")) == norm(hb.get("additional_headers"))
        assert getattr(a, "usage", None) == getattr(b, "usage", None)
        ra, rb = hidden_params_of(a)["llm_resilience_report"], hidden_params_of(b)["llm_resilience_report"]
        assert (ra.deployment_id, ra.usage, ra.response_cost) == (
            rb.deployment_id,
            rb.usage,
            rb.response_cost,
        )


@pytest.mark.parametrize("op", list(OPS))
async def test_errors_are_the_same(sim: ProviderSimulator, pair: Any, op: str) -> None:
    fail_all = {c: {"action": "fail"} for c in ("server", "rate_limit", "auth", "bad_request")}
    rs = pair(_model_list(sim, op), policy={"classes": fail_all})
    for fault in (Fault.server_error(500), Fault.rate_limit(), Fault.auth(), Fault.http_error(400)):
        errors = {}
        for mode, r in rs.items():
            sim.script("a", fault)
            with pytest.raises(Exception) as e:
                await _call(r, op)
            errors[mode] = e.value
        a, b = errors["router"], errors["direct"]
        assert type(a) is type(b)
        if isinstance(a, AllRoutesFailedError):
            assert [(x.error_class, x.status) for x in a.attempts] == [
                (x.error_class, x.status) for x in b.attempts
            ]
            a, b = a.__cause__, b.__cause__
        assert type(a) is type(b)
        assert getattr(a, "status_code", None) == getattr(b, "status_code", None)
        assert getattr(a, "failed_deployment_id", None) == getattr(b, "failed_deployment_id", None) == "a"
        assert getattr(a, "retry_skip_deployment_id", None) == getattr(b, "retry_skip_deployment_id", None)
        assert str(a).startswith(str(b)), (str(a), str(b))


@pytest.mark.parametrize("op", list(OPS))
async def test_one_request_per_attempt_no_sdk_retries(sim: ProviderSimulator, pair: Any, op: str) -> None:
    """The plugin retries itself: a 500 is one request to the provider per attempt on both paths
    (LiteLLM's OpenAI embedding path turns a plain ``max_retries=0`` into the SDK's 2)."""
    rs = pair(_model_list(sim, op), policy={"classes": {"server": {"action": "fail"}}})
    for r in rs.values():
        sim.clear_log()
        sim.script("a", Fault.server_error(500), Fault.server_error(500), Fault.server_error(500))
        with pytest.raises(Exception):  # noqa: B017 - the count is what matters
            await _call(r, op)
        assert sim.count("a") == 1


SLO_KEYS = (
    "model_id",
    "model_group",
    "api_base",
    "response_cost",
    "prompt_tokens",
    "status",
    "model",
    "call_type",
)


async def test_callbacks_fire_alike(
    sim: ProviderSimulator, monkeypatch: pytest.MonkeyPatch, pair: Any
) -> None:
    """One logger for all operations. LiteLLM copies ``litellm.callbacks`` into its own lists and
    caps them at 30, where other tests' loggers stay: those lists get this test's own copies."""
    for name in (
        "callbacks",
        "input_callback",
        "success_callback",
        "failure_callback",
        "_async_success_callback",
        "_async_failure_callback",
    ):
        kept = [cb for cb in getattr(litellm, name) if not type(cb).__module__.startswith("tests.")]
        monkeypatch.setattr(litellm, name, kept)
    events = Events()
    monkeypatch.setattr(litellm, "callbacks", [*litellm.callbacks, events])
    for op in OPS:
        dep = "cb" + "".join(w[0] for w in op.split("_"))  # an id per op (background logs land late)
        rs = pair(_model_list(sim, op, (dep,)), policy={"classes": {"server": {"action": "fail"}}})
        got: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        for mode, r in rs.items():
            assert r.dispatch_plan()["g"]["dispatcher"] == mode
            events.seen.clear()
            await _call(r, op, metadata={"k": "v"})
            sim.script(dep, Fault.server_error(500))
            with pytest.raises(Exception):  # noqa: B017 - the same for both: compared below
                await _call(r, op)
            for _ in range(100):  # the success event is logged in the background
                if sum(e[1].get("model_id") == dep for e in events.seen) >= 2:
                    break
                await asyncio.sleep(0.01)
            got[mode] = sorted((e for e in events.seen if e[1].get("model_id") == dep), key=lambda e: e[0])
            assert [kind for kind, _ in got[mode]] == ["failure", "success"], (op, mode)
        for (kind_a, a), (kind_b, b) in zip(got["router"], got["direct"], strict=True):
            assert kind_a == kind_b
            assert {k: a.get(k) for k in SLO_KEYS} == {k: b.get(k) for k in SLO_KEYS}, (op, kind_a)
            assert set(a["metadata"]) == set(b["metadata"]), op


@pytest.mark.parametrize("op", list(OPS))
async def test_no_new_http_client_per_call(sim: ProviderSimulator, pair: Any, op: str) -> None:
    r = pair(_model_list(sim, op))["direct"]
    await _call(r, op)
    cache = litellm.in_memory_llm_clients_cache
    before = dict(getattr(cache, "cache_dict", {}) or {})
    for _ in range(10):
        await _call(r, op)
    after = dict(getattr(cache, "cache_dict", {}) or {})
    assert before.keys() == after.keys()
    assert all(after[k] is before[k] for k in before)


async def test_embedding_batch_limits_stay_on_the_router(sim: ProviderSimulator, pair: Any) -> None:
    """Not proven equivalent: an embedding group with a batch limit (the Router's own refusal)."""
    ml = _model_list(sim, "embedding")
    ml[0]["model_info"]["max_embedding_batch_size"] = 4
    r = pair(ml)["direct"]
    assert isinstance(r.engine.dispatcher, DirectDispatcher)
    await r.aembedding("g", ["x", "y"])
    assert r.engine.dispatcher.sent_direct == 0


def _event(e: Any) -> Any:
    """A Responses stream event without the provider's per-response ids."""
    text = json.dumps(e.model_dump() if hasattr(e, "model_dump") else dict(e), default=str)
    d = json.loads(re.sub(r"msg_sim_\d+", "msg", text))
    if isinstance(d.get("response"), dict):
        d["response"].pop("id", None)
        d["response"].pop("created_at", None)
    return type(e).__name__, d


async def test_responses_streams_give_the_same_events(
    sim: ProviderSimulator, monkeypatch: pytest.MonkeyPatch, pair: Any
) -> None:
    """Healthy, and cut after content (``recover_streams=False``): the same events, report and
    error through both dispatchers."""
    from llm_resilience_plugin.errors import StreamInterruptedError

    rs = pair(_model_list(sim, "responses"))
    rec = Recorder(monkeypatch)
    events, reports, cut = {}, {}, {}
    for mode, r in rs.items():
        sim.clear_log()
        stream = await r.aresponses("g", "Say hello", stream=True)
        events[mode] = [_event(e) async for e in stream]
        (req,) = sim.requests()
        rep = stream.report
        reports[mode] = (rep.outcome, rep.deployment_id, rep.usage, rep.response_cost, req.body, req.headers)
        sim.script("a", Fault.stream_cut(after_chunks=3))
        stream = await r.aresponses("g", "Say hello", stream=True, recover_streams=False)
        with pytest.raises(StreamInterruptedError) as e:
            _ = [x async for x in stream]
        cut[mode] = (e.value.partial_text, stream.report.outcome, stream.report.error_class)
    assert rs["direct"].engine.dispatcher.sent_direct == 2  # type: ignore[union-attr]
    assert events["router"] == events["direct"] and len(events["direct"]) > 5
    assert reports["router"] == reports["direct"] and reports["direct"][:2] == ("success", "a")
    assert cut["router"] == cut["direct"]
    assert _normal_kwargs(rec.calls[-4][1]) == _normal_kwargs(rec.calls[-2][1])


def test_sync_twins_go_direct(sim: ProviderSimulator, pair: Any) -> None:
    r = pair(_model_list(sim, "embedding"))["direct"]
    resp = r.embedding("g", ["x"])
    assert hidden_params_of(resp)["model_id"] == "a"
    assert r.engine.dispatcher.sent_direct == 1  # type: ignore[union-attr]


async def test_text_completion_streams_give_the_same_chunks(
    sim: ProviderSimulator, monkeypatch: pytest.MonkeyPatch, pair: Any
) -> None:
    rs = pair(_model_list(sim, "text_completion"))
    rec = Recorder(monkeypatch)
    chunks: dict[str, list[Any]] = {}
    reqs, reports = {}, {}
    for mode, r in rs.items():
        sim.clear_log()
        stream = await r.atext_completion("g", "Say hello", stream=True)
        got = []
        async for chunk in stream:
            d = chunk.model_dump() if hasattr(chunk, "model_dump") else dict(chunk)
            d.pop("id", None), d.pop("created", None)
            hidden = hidden_params_of(chunk) or {}
            d["_hidden"] = {k: hidden.get(k) for k in ("model_id", "api_base", "custom_llm_provider")}
            got.append(d)
        chunks[mode] = got
        (reqs[mode],) = sim.requests()
        rep = stream.report
        reports[mode] = (rep.outcome, rep.deployment_id, rep.usage, rep.response_cost)
    assert rs["direct"].engine.dispatcher.sent_direct == 1  # type: ignore[union-attr]
    assert chunks["router"] == chunks["direct"] and len(chunks["direct"]) > 1
    assert reports["router"] == reports["direct"] and reports["direct"][:2] == ("success", "a")
    assert reqs["router"].body == reqs["direct"].body and reqs["router"].headers == reqs["direct"].headers
    assert _normal_kwargs(rec.calls[-2][1]) == _normal_kwargs(rec.calls[-1][1])


@pytest.mark.parametrize("op", ["embedding", "responses"])
async def test_max_parallel_requests_is_one_shared_limit(sim: ProviderSimulator, pair: Any, op: str) -> None:
    """The Router holds a deployment's slot around these endpoints' attempts too: a call over it
    gets the same 429 whichever dispatcher holds the slot."""
    rs = pair(
        _model_list(sim, op, max_parallel_requests=1), policy={"classes": {"rate_limit": {"action": "fail"}}}
    )
    errors = {}
    for mode, r in rs.items():
        await _call(r, op)  # the Router builds its limit on first use
        limit = r.litellm_router.health().store.get_cache(
            key="a_max_parallel_requests_client", local_only=True
        )
        assert limit is not None and limit.max_parallel_requests == 1
        sim.script("a", Fault.ok(latency=0.3))
        first = asyncio.ensure_future(_call(r, op))
        await asyncio.sleep(0.1)
        assert limit.in_flight == 1
        with pytest.raises(AllRoutesFailedError) as e:
            await _call(r, op)
        errors[mode] = e.value.__cause__
        await first
        assert limit.in_flight == 0
    assert rs["direct"].engine.dispatcher.sent_direct == 3  # type: ignore[union-attr]
    a, b = errors["router"], errors["direct"]
    assert isinstance(b, litellm.RateLimitError) and type(a) is type(b)
    assert str(a).startswith(str(b))
