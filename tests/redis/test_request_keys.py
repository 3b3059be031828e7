"""On a real redis-server: a per-request budget key expires with its call (the guard's
``reservation_ttl``), not a day later, so the shared ledger does not grow with traffic."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

pytest.importorskip("redis")

from llm_resilience_plugin import Budget, CostGuard, ResilientRouter
from llm_resilience_plugin.cost import RedisLedger
from llm_resilience_plugin.shared_state import RedisSharedState
from llm_resilience_plugin.testing import ProviderSimulator
from tests.conftest import MSG, deployment
from tests.redis.redis_server import RedisServer, redis_server_fixture  # noqa: F401

PRICED = {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}


@pytest.fixture
def ledger(redis_server: RedisServer) -> Iterator[RedisLedger]:
    yield RedisLedger(RedisSharedState.get(redis_server.url, {"namespace": f"rk-{uuid.uuid4().hex[:8]}"}))
    RedisSharedState.close_all()


def test_per_request_keys_expire_with_the_call(
    sim: ProviderSimulator, ledger: RedisLedger, redis_server: RedisServer
) -> None:
    guard = CostGuard([Budget.per_request(1.0), Budget.daily(100.0)], ledger=ledger, reservation_ttl=60)
    router = ResilientRouter(model_list=[deployment(sim, "g", "a", **PRICED)], guards=[guard])
    try:
        started = time.time()
        for _ in range(5):
            router.completion(model="g", messages=MSG)
    finally:
        router.close()
    import redis

    client = redis.Redis.from_url(redis_server.url)
    expiry = dict(client.zrange(f"{ledger.prefix}:kexp", 0, -1, withscores=True))
    client.close()
    request_keys = {k: v for k, v in expiry.items() if b"request=" in k}
    assert len(request_keys) == 5
    # Each is forgotten reservation_ttl after its call (it was kept 24 h: GBs a day at 50 rps).
    assert all(started < exp <= time.time() + 60 for exp in request_keys.values()), request_keys
    assert len(ledger.list_usage()) == 6 and len(expiry) == 5  # the daily key stays, no expiry
