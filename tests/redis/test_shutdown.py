"""A worker's shutdown is not an outage for the fleet: on shared state in a real redis-server,
closing a router with calls or streams in flight publishes no failure (drained, or cancelled
after the grace), so the breakers other workers read stay closed."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import pytest

pytest.importorskip("redis")

import redis

from llm_resilience_plugin import ResilientRouter, get_report
from llm_resilience_plugin.errors import RouterClosedError
from llm_resilience_plugin.shared_state import RedisSharedState
from llm_resilience_plugin.testing import Fault
from llm_resilience_plugin.testing._simulator import ProviderSimulator
from tests.conftest import MSG, deployment
from tests.redis.redis_server import RedisServer, redis_server_fixture  # noqa: F401


def _worker(sim: ProviderSimulator, url: str, ns: str) -> ResilientRouter:
    return ResilientRouter(
        model_list=[deployment(sim, "primary", d) for d in ("a", "b")],
        policy={
            "deadline": 30,
            "attempt_timeout": 20,
            "backoff": {"initial": 0.01, "maximum": 0.05},
            "breaker": {"fail_max": 3, "reset_timeout": 5},
            "shared_state": {"namespace": ns, "sync_interval": 0.05},
        },
        shared_state=url,
    )


def _fail_counters(url: str, ns: str) -> dict[str, int]:
    client = redis.Redis.from_url(url)
    try:
        return {k.decode(): int(client.get(k) or 0) for k in client.scan_iter(f"{ns}:*fail_counter*")}
    finally:
        client.close()


@pytest.mark.parametrize("grace", [10.0, 0.2], ids=["drained", "cancelled"])
def test_closing_a_worker_under_24_calls_publishes_no_failure(
    sim: ProviderSimulator, redis_server: RedisServer, grace: float
) -> None:
    ns = f"shutdown-{uuid.uuid4().hex[:6]}"
    behaviour = Fault.ok(latency=0.4) if grace > 1 else Fault.silence(max_hold=30)
    for d in ("a", "b"):
        sim.set_default(d, behaviour)
    leaving = _worker(sim, redis_server.url, ns)
    outcomes: list[Any] = []

    def one() -> None:
        try:
            outcomes.append(leaving.completion(model="primary", messages=MSG))
        except Exception as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=one) for _ in range(24)]
    for t in threads:
        t.start()
    end = time.monotonic() + 20
    while sim.count() < 24 and time.monotonic() < end:
        time.sleep(0.01)
    assert sim.count() == 24
    leaving.close(grace=grace)
    for t in threads:
        t.join(10)
    assert len(outcomes) == 24
    if grace > 1:
        assert not [o for o in outcomes if isinstance(o, Exception)]
    else:
        assert all(isinstance(o, RouterClosedError) for o in outcomes)
    assert sim.count() == 24  # nothing retried
    # What the rest of the fleet reads: no failure counted, every breaker closed.
    assert all(v == 0 for v in _fail_counters(redis_server.url, ns).values()), _fail_counters(
        redis_server.url, ns
    )
    staying = _worker(sim, redis_server.url, ns)
    try:
        view = staying.breakers()
        assert all(b["state"] == "closed" and b["fail_counter"] == 0 for b in view.values()), view
    finally:
        staying.close()
        RedisSharedState.close_all()


def _all_closed(sim: ProviderSimulator, url: str, ns: str) -> None:
    assert all(v == 0 for v in _fail_counters(url, ns).values()), _fail_counters(url, ns)
    staying = _worker(sim, url, ns)
    try:
        view = staying.breakers()
        assert all(b["state"] == "closed" and b["fail_counter"] == 0 for b in view.values()), view
    finally:
        staying.close()


@pytest.mark.parametrize("grace", [10.0, 0.2], ids=["drained", "cut"])
async def test_closing_a_worker_under_8_streams_being_read_publishes_no_failure(
    sim: ProviderSimulator, redis_server: RedisServer, grace: float
) -> None:
    ns = f"shutdown-streams-{uuid.uuid4().hex[:6]}"
    words = 15 if grace > 1 else 400  # ~0.5 s of chunks (read to the end), or ~20 s (only a cut ends it)
    for d in ("a", "b"):
        sim.set_default(d, Fault.ok(text="word " * words, chunk_delay=0.03 if grace > 1 else 0.05))
    leaving = _worker(sim, redis_server.url, ns)
    try:
        streams = [await leaving.acompletion(model="primary", messages=MSG, stream=True) for _ in range(8)]
        got: list[list[Any]] = [[] for _ in streams]

        async def read(stream: Any, into: list[Any]) -> int:
            async for chunk in stream:
                into.append(chunk)
            return len(into)

        readers = [asyncio.create_task(read(s, g)) for s, g in zip(streams, got, strict=True)]
        end = time.monotonic() + 20
        while not all(len(g) >= 2 for g in got):
            assert time.monotonic() < end, "the streams did not start"
            await asyncio.sleep(0.01)
        started = time.monotonic()
        await leaving.aclose(grace=grace)
        assert time.monotonic() - started < 8
        outcomes = await asyncio.gather(*readers, return_exceptions=True)
        if grace > 1:
            assert all(isinstance(o, int) and o > words / 2 for o in outcomes), outcomes
        else:
            assert all(isinstance(o, RouterClosedError) for o in outcomes), outcomes
            assert {get_report(o).outcome for o in outcomes} == {"cancelled"}  # type: ignore[union-attr]
        assert sim.count() == 8  # nothing retried or recovered elsewhere
        await asyncio.sleep(0.1)  # a sync interval: anything published would be there now
        _all_closed(sim, redis_server.url, ns)
    finally:
        RedisSharedState.close_all()
