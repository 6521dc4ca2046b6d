"""The API's port held by another program: `make run` and `timeline-api` alone say so in one
line, and nothing starts."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import program_env
from timeline.config import Settings
from timeline.storage.accounts import Storage
from timeline.tools.azurite import free_ports


def test_a_taken_api_port_stops_the_stack_before_anything_starts(tmp_path: Path) -> None:
    port, *azurite_ports = free_ports(4)
    with socket.socket() as holder:  # another program, listening without SO_REUSEPORT
        holder.bind(("127.0.0.1", port))
        holder.listen()
        env = program_env(
            data_dir=tmp_path / "data",
            port=port,
            azurite_ports=",".join(map(str, azurite_ports)),
        )
        done = subprocess.run(
            [sys.executable, "-m", "timeline.tools.cli", "run"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode != 0
    assert f"127.0.0.1:{port} is already in use" in done.stderr, done.stderr
    assert "TIMELINE_PORT" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "data" / "azurite").exists(), "Azurite started before the check"


def test_the_api_alone_on_a_taken_port_says_so_in_one_line(
    settings: Settings, storage: Storage, tmp_path: Path
) -> None:
    [port] = free_ports(1)
    with socket.socket() as holder:  # another program, listening without SO_REUSEPORT
        holder.bind(("127.0.0.1", port))
        holder.listen()
        env = program_env(
            data_dir=tmp_path, port=port, storage_connection_string=settings.connection_string()
        )
        done = subprocess.run(  # as the container runs ``timeline-api``
            [sys.executable, "-m", "api"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode != 0
    assert done.stderr.splitlines() == [
        f"timeline-api: the API's port 127.0.0.1:{port} is already in use by another program: "
        "stop it, or pick another port with TIMELINE_PORT"
    ]
