"""The embedded Azurite binds its own free ports: nothing can take them between a pick and
the bind, as another test's Azurite or any client's outgoing connection could. Given ports
of which one is taken end the start at once, with Azurite's own exit."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

import timeline.tools.azurite as azurite_module
from timeline.errors import ConfigurationError
from timeline.tools.azurite import HOST, Azurite


@pytest.fixture
def ports_taken_as_soon_as_picked(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any port ``free_ports`` reports is listened on by another program at once."""
    listeners: list[socket.socket] = []
    pick = azurite_module.free_ports

    def picked_then_taken(count: int) -> tuple[int, ...]:
        ports = pick(count)
        for port in ports:
            listener = socket.socket()
            listener.bind((HOST, port))
            listener.listen()
            listeners.append(listener)
        return ports

    monkeypatch.setattr(azurite_module, "free_ports", picked_then_taken)
    yield
    for listener in listeners:
        listener.close()


@pytest.mark.usefixtures("ports_taken_as_soon_as_picked")
def test_an_azurite_without_ports_starts_whatever_takes_free_ports_meanwhile() -> None:
    server = Azurite(location=None)
    try:
        server.start()
        assert server.running
        assert all(_accepts(port) for port in server.ports)
    finally:
        server.stop()


def test_a_restart_serves_on_the_ports_of_the_first_start() -> None:
    server = Azurite(location=None)
    try:
        server.start()
        first = server.ports
        server.stop()
        server.start()
        assert server.ports == first
    finally:
        server.stop()


def test_the_ports_are_unknown_until_the_first_start() -> None:
    with pytest.raises(RuntimeError, match="first starts"):
        _ = Azurite(location=None).ports


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((HOST, port)) == 0


def test_a_taken_port_ends_the_start_with_azurites_exit() -> None:
    """Azurite itself exits when one of its given ports is taken: the start says so at once
    (no wait for a server that will never listen) and leaves nothing running."""
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        blob, queue = azurite_module.free_ports(2)
        server = Azurite(location=None, ports=(blob, queue, taken.getsockname()[1]))
        with pytest.raises(ConfigurationError, match=r"exited at start \(code 1\)"):
            server.start()
        assert not server.running
