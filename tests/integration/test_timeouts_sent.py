"""The timeout values LiteLLM receives: few of them, since it builds an SDK client (with its own
connection pool) per distinct value."""

from __future__ import annotations

from typing import Any

from llm_resilience_plugin import get_report
from tests.conftest import MSG, RouterFactory


async def test_learned_answer_timeouts_reach_litellm_as_few_coarse_values(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a", "b"]}, policy={"attempt_timeout": 30, "dispatch": "router"})
    inner = router.litellm_router
    seen: list[Any] = []
    original = inner.acompletion

    async def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("timeout"))
        return await original(*args, **kwargs)

    inner.acompletion = spy  # type: ignore[method-assign]
    timings = router.engine.timings["primary"]
    learned: set[float] = set()
    for i in range(40):  # answer times that drift: the learned limit changes every few answers
        timings.observe_answer(0.3 + 0.01 * i)
        learned.add(timings.answer(30.0))
        resp = await router.acompletion(model="primary", messages=MSG)
        assert get_report(resp).outcome == "success"  # type: ignore[union-attr]
    assert len(learned) > 3  # many exact limits ...
    reads = {getattr(t, "read", t) for t in seen}
    assert reads <= {10.0, 1.0, 2.0, 3.0}  # ... few values sent: whole seconds (10: the deadline)
    assert len({id(t) for t in seen}) == len(reads)  # one timeout object (one client) per value
