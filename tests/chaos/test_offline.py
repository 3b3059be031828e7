"""Offline means offline: the chaos command, the pytest plugin and ``check`` reach nothing but
loopback, whatever Redis, cache, ledger or endpoint the config names (sockets patched: every
DNS lookup and connection to another host is recorded and refused)."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llm_resilience_plugin import cli
from llm_resilience_plugin.testing._harness import ChaosHarness
from llm_resilience_plugin.testing._simulator import ProviderSimulator
from llm_resilience_plugin.testing.chaos import run_chaos

CONFIG = Path(__file__).with_name("offline.yaml")
HI = [{"role": "user", "content": "hi"}]


def _local(host: Any) -> bool:
    if host is None or host in ("localhost", b"localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.decode() if isinstance(host, bytes) else str(host)).is_loopback
    except ValueError:
        return False


@pytest.fixture
def outbound(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every non-loopback DNS lookup or connection attempt (each refused), in order."""
    attempts: list[str] = []
    real_getaddrinfo = socket.getaddrinfo
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not _local(host):
            attempts.append(f"getaddrinfo {host}")
            raise socket.gaierror(socket.EAI_NONAME, "refused by the offline test")
        return real_getaddrinfo(host, *args, **kwargs)

    def check(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[0]):
            attempts.append(f"connect {address[0]}")
            raise ConnectionRefusedError("refused by the offline test")

    def connect(self: socket.socket, address: Any) -> None:
        check(self, address)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        check(self, address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    yield attempts


def test_the_guard_sees_an_outbound_attempt(outbound: list[str]) -> None:
    with pytest.raises(OSError):
        socket.create_connection(("redis.prod.example.invalid", 6379), timeout=1)
    assert outbound == ["getaddrinfo redis.prod.example.invalid"]


def test_chaos_reaches_only_loopback(outbound: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    lines: list[str] = []
    code = run_chaos(str(CONFIG), only=["revoked-key"], quick_run=True, out=lines.append)
    assert outbound == []
    assert code == 0, "\n".join(lines)
    assert "hunter2" not in "\n".join(lines) + capsys.readouterr().err


def test_the_pytest_plugins_harness_reaches_only_loopback(
    outbound: list[str], llm_simulator: ProviderSimulator
) -> None:
    harness = ChaosHarness.from_config(CONFIG, llm_simulator)
    try:
        harness.apply("deployment-down")
        reply = harness.router.completion(model="primary", messages=HI)
        assert reply.choices[0].message.content
        assert harness.count("fallback") == 1
    finally:
        harness.close()
    assert outbound == []


@pytest.mark.llm_resilience(config="offline.yaml", scenario="deployment-down")
async def test_the_llm_chaos_fixture_reaches_only_loopback(outbound: list[str], llm_chaos: Any) -> None:
    reply = await llm_chaos.router.acompletion(model="primary", messages=HI)
    assert reply.choices[0].message.content
    assert outbound == []


def test_check_reaches_nothing(outbound: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["check", str(CONFIG)])
    out = capsys.readouterr()
    assert outbound == []
    assert "hunter2" not in out.out + out.err
    assert code in (0, 2), out.err
