"""A provider may echo an API key without its prefix (``sk-``, ``sk-proj-``): the body is a secret
too, scrubbed wherever the whole key is; short parts after a dash are not (they are not secret)."""

from __future__ import annotations

from llm_resilience_plugin._redaction import MIN_SECRET_BODY, REDACTED, register_secret, scrub


def test_a_key_echoed_without_its_prefix_is_scrubbed() -> None:
    register_secret("sk-ECHOBODY1234567890abcdef")
    register_secret("sk-proj-ProjBody0123456789xyzw")
    text = scrub(
        "Incorrect key ECHOBODY1234567890abcdef; also proj-ProjBody0123456789xyzw, ProjBody0123456789xyzw"
    )
    assert "ECHOBODY" not in text and "ProjBody" not in text
    assert text.count(REDACTED) == 3


def test_short_parts_after_a_dash_are_left_alone() -> None:
    register_secret("ab-cd-short-body")
    assert len("body") < MIN_SECRET_BODY
    assert scrub("the body of the text") == "the body of the text"
    assert scrub("ab-cd-short-body") == REDACTED
