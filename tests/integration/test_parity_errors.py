"""Drop-in parity of errors: on one deployment without fallbacks, a plain ``litellm.Router`` and
``ResilientRouter`` raise errors a caller catches the same way (the LiteLLM exception class, its
``status_code``, a message), sync and async, plain and streaming.

The plugin may retry first (429, 500, timeouts) and then raises ``AllRoutesFailedError`` - which
is also an instance of the provider's exception class with its status, so ``except
litellm.RateLimitError`` written for a plain Router still catches it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import litellm
import pytest

from llm_resilience_plugin import AllRoutesFailedError, ResilientRouter
from llm_resilience_plugin.testing import Clock
from llm_resilience_plugin.testing._simulator import Fault
from tests.integration._parity import close_all, router_pair

MSG = [{"role": "user", "content": "hello there"}]

FAULTS: dict[str, tuple[Any, type[BaseException], int]] = {
    "400": (Fault.http_error(400, "bad thing"), litellm.BadRequestError, 400),
    "401": (Fault.auth(), litellm.AuthenticationError, 401),
    "404": (Fault.not_found(), litellm.NotFoundError, 404),
    "429": (Fault.rate_limit(), litellm.RateLimitError, 429),
    "500": (Fault.server_error(), litellm.InternalServerError, 500),
    "context_window": (Fault.context_length(), litellm.ContextWindowExceededError, 400),
    "timeout": (Fault.silence(3), litellm.Timeout, 408),
}
# Retried by the plugin before it gives up (the others are the caller's or the account's mistake).
RETRIED = {"429", "500"}


@pytest.fixture
def pair(sim) -> Iterator[tuple[litellm.Router, ResilientRouter]]:
    routers = router_pair(sim, clock=Clock(), policy={"backoff": {"initial": 0.01, "maximum": 0.02}})
    yield routers
    close_all(routers)


def _kwargs(case: str) -> dict[str, Any]:
    return {"timeout": 0.5} if case == "timeout" else {}


def _same_error(case: str, plain_exc: BaseException, our_exc: BaseException) -> None:
    _, cls, status = FAULTS[case]
    assert type(plain_exc) is cls and isinstance(our_exc, cls)
    # every class a plain Router's error is, the plugin's is too (except litellm.X / openai.X)
    assert all(isinstance(our_exc, base) for base in type(plain_exc).__mro__)
    assert plain_exc.status_code == our_exc.status_code == status  # type: ignore[attr-defined]
    assert str(plain_exc) and str(our_exc)
    assert our_exc.message  # type: ignore[attr-defined]
    assert getattr(our_exc, "llm_provider", None) == getattr(plain_exc, "llm_provider", None)
    if isinstance(our_exc, AllRoutesFailedError):
        assert case in RETRIED | {"401", "timeout"} and our_exc.report is not None
        assert isinstance(our_exc.__cause__, cls)


def _raise_sync(router: Any, case: str, stream: bool) -> BaseException:
    with pytest.raises(Exception) as info:
        out = router.completion(model="g", messages=MSG, stream=stream, **_kwargs(case))
        if stream:
            list(out)
    return info.value


async def _raise_async(router: Any, case: str, stream: bool) -> BaseException:
    with pytest.raises(Exception) as info:
        out = await router.acompletion(model="g", messages=MSG, stream=stream, **_kwargs(case))
        if stream:
            async for _ in out:
                pass
    return info.value


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("case", sorted(FAULTS))
async def test_async_errors_match(pair, sim, case: str, stream: bool) -> None:
    plain, ours = pair
    sim.set_default("a", FAULTS[case][0])
    _same_error(case, await _raise_async(plain, case, stream), await _raise_async(ours, case, stream))


@pytest.mark.parametrize("case", ["400", "429", "context_window", "404"])
def test_sync_errors_match(pair, sim, case: str) -> None:
    plain, ours = pair
    sim.set_default("a", FAULTS[case][0])
    _same_error(case, _raise_sync(plain, case, False), _raise_sync(ours, case, False))


def test_the_plugins_error_keeps_its_own_shape(pair, sim) -> None:
    """The drop-in class adds the provider's identity; the plugin's attempt list stays."""
    _, ours = pair
    sim.set_default("a", Fault.server_error())
    err = _raise_sync(ours, "500", False)
    assert isinstance(err, AllRoutesFailedError) and isinstance(err, litellm.InternalServerError)
    assert type(err).__name__ == "AllRoutesFailedError"
    assert str(err).startswith("all routes failed for 'g' after 3 request(s)")
    assert len(err.attempts) == 3 and sim.count("a") == 3
