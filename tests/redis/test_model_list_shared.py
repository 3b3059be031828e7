"""A model list that changes on shared state (a real redis-server): an added deployment's breaker
is the fleet's (another worker with the same router name sees it open), and a deleted one's is no
longer synced by the worker that took it out."""

from __future__ import annotations

import time
import uuid

import pytest

pytest.importorskip("redis")

from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin.testing import Fault
from llm_resilience_plugin.testing._simulator import ProviderSimulator
from tests.conftest import MSG, deployment
from tests.redis.redis_server import RedisServer, redis_server_fixture  # noqa: F401


def _worker(sim: ProviderSimulator, url: str, ns: str, deps: list[str]) -> ResilientRouter:
    return ResilientRouter(
        model_list=[deployment(sim, "primary", d) for d in deps],
        policy={
            "deadline": 10,
            "attempt_timeout": 5,
            "backoff": {"initial": 0.01, "maximum": 0.05},
            "breaker": {"fail_max": 3, "reset_timeout": 30},
            # one name for the fleet however its model list changes
            "shared_state": {"namespace": ns, "sync_interval": 0.05, "router_name": "fleet"},
        },
        shared_state=url,
    )


def test_an_added_deployment_shares_its_breaker_with_the_fleet(
    sim: ProviderSimulator, redis_server: RedisServer
) -> None:
    ns = f"modellist-{uuid.uuid4().hex[:6]}"
    reloaded = _worker(sim, redis_server.url, ns, ["a"])
    other = _worker(sim, redis_server.url, ns, ["a", "c"])  # started with the new config
    try:
        reloaded.add_deployment(deployment(sim, "primary", "c"))
        sim.set_default("c", Fault.server_error(500))
        for _ in range(40):
            if reloaded.breakers()["c"]["state"] == "open":
                break
            reloaded.completion(model="primary", messages=MSG)
        assert reloaded.breakers()["c"]["state"] == "open"
        deadline = time.monotonic() + 5
        while other.breakers()["c"]["state"] != "open" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert other.breakers()["c"]["state"] == "open"  # the fleet's breaker, not a local copy
        reloaded.delete_deployment("c")
        assert "c" not in reloaded.breakers()
        sim.clear_log()
        for _ in range(5):
            reloaded.completion(model="primary", messages=MSG)
        assert sim.count("c") == 0 and sim.count("a") == 5
    finally:
        reloaded.close()
        other.close()
