"""State shared by a fleet of processes on Redis: circuit breakers and retry budgets.

Every worker process (uvicorn/gunicorn workers, hosts) that points at the same Redis and
namespace shares:

* **breakers** (:class:`RedisBreakerBackend`): pybreaker's state machine as Lua scripts, one
  atomic round trip per admit / success / failure / release, half-open probes counted
  fleet-wide as leases that expire;
* **retry budgets** (:class:`RedisTokenBucket`): one token bucket per model group, changes
  applied atomically in batches every ``sync_interval``;
* the connection, its health and the background sync thread (:class:`RedisSharedState`), which
  the cost ledger on Redis (:class:`llm_resilience_plugin.cost.RedisLedger`) also runs on.

Needs the ``redis`` extra (``pip install 'llm-resilience-plugin[redis]'``).
"""

from llm_resilience_plugin.shared_state._breakers import RedisBreakerBackend
from llm_resilience_plugin.shared_state._budgets import RedisTokenBucket
from llm_resilience_plugin.shared_state._connection import (
    RedisSharedState,
    attach_router,
    redis_url_from_settings,
    router_key,
)

__all__ = [
    "RedisBreakerBackend",
    "RedisSharedState",
    "RedisTokenBucket",
    "attach_router",
    "redis_url_from_settings",
    "router_key",
]
