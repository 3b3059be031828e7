"""Idempotency keys are scoped and bound to their request: one tenant's key never answers
another's, a key reused with other content is the caller's error, an embedding never gets a chat's
answer. Through the memory and SQLite stores and single-flight, against the simulator."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import litellm
import pytest

from llm_resilience_plugin import get_report
from llm_resilience_plugin.errors import IdempotencyConflictError
from llm_resilience_plugin.testing import Clock, Fault, ProviderSimulator
from tests.conftest import RouterFactory

A_ASKS = [{"role": "user", "content": "What is my account number?"}]
B_ASKS = [{"role": "user", "content": "What is the weather?"}]


def _tenant(name: str) -> dict[str, Any]:
    return {"metadata": {"tenant": name}}


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory" if request.param == "memory" else f"sqlite:///{tmp_path / 'idem.db'}"


async def test_a_key_of_one_tenant_never_answers_another(make_router: RouterFactory, sim, store: str):
    router = make_router({"primary": ["a"]}, idempotency_store=store)
    first = await router.acompletion(
        model="primary", messages=A_ASKS, idempotency_key="order-42", **_tenant("acme")
    )
    other = await router.acompletion(
        model="primary", messages=B_ASKS, idempotency_key="order-42", **_tenant("globex")
    )
    report = get_report(other)
    assert report is not None and not report.replayed and report.response_cost > 0
    assert sim.count("a") == 2
    # The same tenant's retry is still answered from the store, free.
    again = await router.acompletion(
        model="primary", messages=A_ASKS, idempotency_key="order-42", **_tenant("acme")
    )
    assert get_report(again).replayed and sim.count("a") == 2  # type: ignore[union-attr]
    assert again.choices[0].message.content == first.choices[0].message.content


async def test_a_key_reused_with_other_content_is_a_caller_error(make_router: RouterFactory, sim, store: str):
    router = make_router({"primary": ["a"]}, idempotency_store=store)
    await router.acompletion(model="primary", messages=A_ASKS, idempotency_key="order-42")
    events: list[Any] = []
    with pytest.raises(IdempotencyConflictError) as info:
        await router.acompletion(
            model="primary", messages=B_ASKS, idempotency_key="order-42", listener=events.append
        )
    assert info.value.field == "idempotency_key" and info.value.status_code == 409
    assert isinstance(info.value, ValueError) and "order-42" in str(info.value)
    report = get_report(info.value)
    assert report is not None and report.outcome == "failure" and report.error_class == "bad_request"
    assert sim.count("a") == 1  # nothing sent, and never the other request's answer
    # An answer-shaping argument is content too.
    with pytest.raises(IdempotencyConflictError):
        await router.acompletion(model="primary", messages=A_ASKS, idempotency_key="order-42", temperature=0)


async def test_a_key_is_scoped_to_the_model_group(make_router: RouterFactory, sim, store: str):
    router = make_router({"primary": ["a"], "other": ["b"]}, idempotency_store=store)
    await router.acompletion(model="primary", messages=A_ASKS, idempotency_key="order-42")
    resp = await router.acompletion(model="other", messages=A_ASKS, idempotency_key="order-42")
    assert not get_report(resp).replayed  # type: ignore[union-attr]
    assert sim.count("a") == 1 and sim.count("b") == 1


async def test_an_embedding_with_a_chats_key_never_gets_the_chat_answer(
    make_router: RouterFactory, sim, store: str
):
    router = make_router({"g": ["a"]}, idempotency_store=store)
    await router.acompletion(model="g", messages=A_ASKS, idempotency_key="order-42")
    vectors = await router.aembedding(model="g", input="order 42", idempotency_key="order-42")
    assert isinstance(vectors, litellm.EmbeddingResponse) and vectors.data
    assert not get_report(vectors).replayed  # type: ignore[union-attr]
    assert sim.count("a") == 2


async def test_single_flight_is_scoped_and_bound_too(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a"]}, idempotency_store="memory", clock=Clock())
    sim.set_default("a", Fault.ok(latency=0.2))

    def call(messages: Any, tenant: str) -> Any:
        return router.acompletion(
            model="primary", messages=messages, idempotency_key="order-42", **_tenant(tenant)
        )

    # Another tenant's identical key in flight: each its own request, no follower.
    a, b = await asyncio.gather(call(A_ASKS, "acme"), call(B_ASKS, "globex"))
    assert not get_report(a).replayed and not get_report(b).replayed  # type: ignore[union-attr]
    assert sim.count("a") == 2
    # The same tenant, other content, while the first is in flight: refused, never joined.
    leader = asyncio.ensure_future(call(A_ASKS, "initech"))
    await asyncio.sleep(0.05)
    with pytest.raises(IdempotencyConflictError):
        await call(B_ASKS, "initech")
    await leader
    assert sim.count("a") == 3


def test_the_scope_keys_are_configurable_and_checked(sim: ProviderSimulator, make_router: RouterFactory):
    router = make_router({"primary": ["a"]})
    router.set_idempotency_store("memory", scope=["org"])
    msgs = A_ASKS
    router.completion(model="primary", messages=msgs, idempotency_key="k", metadata={"tags": ["org:1"]})
    router.completion(model="primary", messages=msgs, idempotency_key="k", metadata={"tags": ["org:2"]})
    assert sim.count("a") == 2
    with pytest.raises(ValueError, match="idempotency_scope"):
        router.set_idempotency_store("memory", scope="tenant")  # type: ignore[arg-type]
