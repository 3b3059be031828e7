"""The batches of a split embedding call, sent concurrently (bounded) and joined in input order.

Each batch is its own engine call (retried and failed over whole, its own cost reservation and
settlement, its own ``CallReport`` event). At most ``concurrency`` batches are in flight: a few
workers take the next batch in input order, so the earliest batches go first and a bound of 1
sends them one after another. When a batch finally fails, no further batch is started, the ones in
flight are cancelled (and awaited), and the call raises that batch's error: the caller never gets
a partly filled answer. All batches share the call's deadline: each starts with the time left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from llm_resilience_plugin._engine.clock import Clock

__all__ = ["batch_concurrency", "run_batches"]

# A batch call: (index of the batch, seconds left of the call's deadline or None) -> its response.
StartBatch = Callable[[int, float | None], Awaitable[Any]]


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def batch_concurrency(
    wanted: int, deployments: Iterable[Mapping[str, Any]], default_max_parallel: Any = None
) -> int:
    """``wanted``, capped by the smallest ``max_parallel_requests`` among ``deployments`` (their
    params; the Router's ``default_max_parallel_requests`` for one without its own): however the
    batches land, none waits for a slot of LiteLLM's per-deployment semaphore."""
    cap = wanted
    fallback = _whole(default_max_parallel)
    for params in deployments:
        limit = _whole(params.get("max_parallel_requests")) or fallback
        if limit is not None:
            cap = min(cap, limit)
    return max(1, cap)


async def run_batches(
    count: int, concurrency: int, start: StartBatch, clock: Clock, deadline: float | None
) -> list[Any]:
    """The responses of batches ``0..count-1`` in order, at most ``concurrency`` in flight, under
    one ``deadline`` (seconds, or None); the first batch that fails fails the whole."""
    started = clock.monotonic()

    def left() -> float | None:
        if deadline is None:
            return None
        remaining = deadline - (clock.monotonic() - started)
        return remaining if remaining > 0 else 1e-3  # the engine refuses it: DeadlineExceededError

    results: list[Any] = [None] * count
    if concurrency <= 1 or count <= 1:
        for i in range(count):
            results[i] = await start(i, left())
        return results

    pending = iter(range(count))  # shared by the workers: each batch is taken once, in order

    async def worker() -> None:
        for i in pending:
            results[i] = await start(i, left())

    workers = [asyncio.ensure_future(worker()) for _ in range(min(concurrency, count))]
    try:
        await asyncio.wait(workers, return_when=asyncio.FIRST_EXCEPTION)
    except BaseException:  # the caller was cancelled: so are the batches in flight
        await _cancel(workers)
        raise
    failed = next((w for w in workers if w.done() and not w.cancelled() and w.exception()), None)
    if failed is not None:
        await _cancel(workers)
        raise failed.exception()  # type: ignore[misc]
    return results


async def _cancel(workers: Sequence[asyncio.Future[None]]) -> None:
    """Cancel every unfinished worker and wait until each has wound down (its attempt settled)."""
    for w in workers:
        if not w.done():
            w.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
