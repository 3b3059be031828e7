"""Every public name of ``litellm.Router`` on the installed LiteLLM has a standing on
ResilientRouter (resilient, pass-through, refused or the Router's machinery), and each standing
behaves as documented, over real HTTP against the simulator."""

from __future__ import annotations

import inspect

import litellm
import pytest

from llm_resilience_plugin import ResilientRouter
from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.routing import _surface


def _public_names() -> list[str]:
    return sorted(n for n in dir(litellm.Router) if not n.startswith("_"))


def test_every_public_router_name_is_classified() -> None:
    unknown = [n for n in _public_names() if _surface.standing(n) is None]
    assert not unknown, (
        f"litellm.Router has names ResilientRouter does not place: {unknown}; add each to "
        "llm_resilience_plugin/routing/_surface.py (resilient, pass-through, refused or machinery) "
        "and to docs/litellm-versions.md"
    )


def test_resilient_names_are_the_routers_own(sim, make_router) -> None:
    router = make_router({"g": ["a"]})
    for name in _surface.RESILIENT:
        assert name in vars(ResilientRouter) or any(name in vars(c) for c in ResilientRouter.__mro__), name
        assert callable(getattr(router, name))


def test_pass_through_names_reach_the_wrapped_router(sim, make_router) -> None:
    router = make_router({"g": ["a"], "h": ["b"]})
    inner = router.litellm_router
    assert router.model_list is inner.model_list
    assert sorted(router.get_model_names()) == ["g", "h"]
    assert [d["model_name"] for d in router.get_model_list()] == [d["model_name"] for d in inner.model_list]
    present = [n for n in _public_names() if _surface.standing(n) == "pass-through"]
    assert present
    for name in present:
        if name in ("model_list", "get_model_list", "get_model_names"):
            continue
        mine, theirs = getattr(router, name), getattr(inner, name)  # endpoints are made per read
        assert type(mine) is type(theirs), name
        assert getattr(mine, "__qualname__", mine) == getattr(theirs, "__qualname__", theirs), name


def test_model_list_changes_are_the_routers_own_with_litellms_signatures(sim, make_router) -> None:
    """add_deployment, upsert_deployment, delete_deployment, set_model_list: drop-in for
    litellm.Router's (same parameters); what they keep consistent: tests/integration/test_model_list.py."""
    router = make_router({"g": ["a"]})
    for name in sorted(_surface.MODEL_LIST_CHANGES):
        assert name in vars(ResilientRouter), name
        assert _surface.standing(name) == "model-list change"
        theirs = getattr(litellm.Router, name, None)
        if theirs is not None:  # on this LiteLLM
            assert list(inspect.signature(getattr(router, name)).parameters) == [
                p for p in inspect.signature(theirs).parameters if p != "self"
            ], name


def test_refused_names_raise_a_config_error_naming_the_fix(sim, make_router) -> None:
    router = make_router({"g": ["a"]})
    for name in sorted(_surface.REFUSED):
        with pytest.raises(ConfigError, match="build a new ResilientRouter") as err:
            getattr(router, name)({"model_name": "x", "litellm_params": {"model": "openai/x"}})
        assert err.value.field == name
    assert [d["model_name"] for d in router.get_model_list()] == ["g"]  # nothing changed


def test_machinery_names_say_where_they_are(sim, make_router) -> None:
    router = make_router({"g": ["a"]})
    with pytest.raises(AttributeError, match=r"router\.litellm_router\.cooldown_cache"):
        router.cooldown_cache  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        router.no_such_name  # noqa: B018
    assert not hasattr(router, "fallbacks")  # the plugin's own: router.spec


async def test_batch_completion_is_resilient_not_a_pass_through(sim, make_router) -> None:
    """abatch_completion: each element one resilient call (retried; tests/integration/
    test_batch_completion.py has the rest)."""
    from llm_resilience_plugin.testing import Fault

    router = make_router({"g": ["a"]})
    sim.script("a", Fault.server_error(500))
    got = await router.abatch_completion(models=["g"], messages=[{"role": "user", "content": "hi"}])
    assert got[0].choices[0].message.content
    assert sim.count("a") == 2  # the 500 retried by the engine
