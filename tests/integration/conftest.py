"""Fixtures of the integration suites beyond tests/conftest.py's."""

from tests.integration._operations import build  # noqa: F401  (the non-chat operations' router factory)
