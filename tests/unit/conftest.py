"""Unit tests run without the network, loopback included: any socket connect fails the test."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _no_sockets(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(self: socket.socket, address: object) -> None:
        raise AssertionError(
            f"unit tests open no connections (tried {address!r}); move it to tests/integration"
        )

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    yield
