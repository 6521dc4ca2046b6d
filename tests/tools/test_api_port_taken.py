"""``make run`` when another program holds the API's port: one clear line, nothing started."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import program_env
from timeline.storage.azurite import free_ports


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
