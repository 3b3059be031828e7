"""The simulator's replies to an assistant prefill, socket-free: a model continues the text it
was given - the rest of its own answer, or its answer after as many words as it was handed."""

from __future__ import annotations

from llm_resilience_plugin.testing._replies import build_reply

ASK = {"role": "user", "content": "tell me a story"}


def _prefilled(text: str) -> dict[str, object]:
    return {"messages": [ASK, {"role": "assistant", "content": text, "prefix": True}]}


def test_a_prefill_of_its_own_words_is_continued_where_it_stops() -> None:
    whole = build_reply({"messages": [ASK]}, "a", None).content
    assert whole == "Hello from a. You said: tell me a story."
    reply = build_reply(_prefilled("Hello from a. You"), "a", None)
    assert reply.content == " said: tell me a story." and reply.completion_tokens == len(reply.words)


def test_a_prefill_of_another_models_words_is_continued_after_as_many_words() -> None:
    reply = build_reply(_prefilled("Hello from b. "), "a", None)
    assert reply.content == "You said: tell me a story." and reply.finish_reason == "stop"


def test_a_fixed_text_is_continued_too() -> None:
    reply = build_reply(_prefilled("Once upon a "), "a", "Once upon a time.")
    assert reply.content == "time."


def test_an_assistant_message_without_prefix_is_history_not_a_prefill() -> None:
    body = {"messages": [ASK, {"role": "assistant", "content": "Hi"}, {"role": "user", "content": "go on"}]}
    assert build_reply(body, "a", None).content == "Hello from a. You said: go on."
