"""The cost guard: prices, budgets reserved before a call and settled after, spend ledgers."""

from llm_resilience_plugin.cost._alerts import BudgetAlert
from llm_resilience_plugin.cost._budgets import Budget
from llm_resilience_plugin.cost._config import (
    BudgetConfig,
    CostConfig,
    cost_config_problems,
    cost_guard_from_config,
)
from llm_resilience_plugin.cost._estimate import UNKNOWN_MAX_OUTPUT
from llm_resilience_plugin.cost._guard import CostGuard, Ticket
from llm_resilience_plugin.cost._ledger import (
    NANO,
    BudgetKey,
    KeyUsage,
    Ledger,
    MemoryLedger,
    Reservation,
    SpendEntry,
    SpendReport,
    from_nano,
    to_nano,
)
from llm_resilience_plugin.cost._open import open_ledger
from llm_resilience_plugin.cost._prices import Price, PriceBook, coerce_price
from llm_resilience_plugin.cost._redis_ledger import LedgerUnavailableError, RedisLedger
from llm_resilience_plugin.cost._sqlite_ledger import SQLiteLedger

__all__ = [
    "NANO",
    "UNKNOWN_MAX_OUTPUT",
    "Budget",
    "BudgetAlert",
    "BudgetConfig",
    "BudgetKey",
    "CostConfig",
    "CostGuard",
    "KeyUsage",
    "Ledger",
    "LedgerUnavailableError",
    "MemoryLedger",
    "Price",
    "PriceBook",
    "RedisLedger",
    "Reservation",
    "SQLiteLedger",
    "SpendEntry",
    "SpendReport",
    "Ticket",
    "coerce_price",
    "cost_config_problems",
    "cost_guard_from_config",
    "from_nano",
    "open_ledger",
    "to_nano",
]
