"""State shared by a fleet of processes on Redis: breakers, retry budgets, the spend ledger.

Needs the ``redis`` extra (``pip install 'llm-resilience-plugin[redis]'``).
"""

from llm_resilience_plugin.shared_state._redis import (
    LedgerUnavailableError,
    RedisBreakerBackend,
    RedisLedger,
    RedisSharedState,
    RedisTokenBucket,
    attach_router,
    redis_url_from_settings,
    router_key,
)

__all__ = [
    "LedgerUnavailableError",
    "RedisBreakerBackend",
    "RedisLedger",
    "RedisSharedState",
    "RedisTokenBucket",
    "attach_router",
    "redis_url_from_settings",
    "router_key",
]
