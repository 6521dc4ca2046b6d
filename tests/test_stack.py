"""``make run`` for real: the stack as subprocesses, stopped by SIGTERM, restarted with its data."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import eventually, program_env
from timeline.azurite import free_ports
from timeline.config import CONNECTION_FILE


class StackProcess:
    def __init__(self, data_dir: Path, port: int, azurite_ports: tuple[int, ...]) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.env = program_env(
            data_dir=data_dir, port=port, azurite_ports=",".join(map(str, azurite_ports))
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "timeline.cli", "run"], env=self.env)

    def cli(self, *args: str) -> str:
        done = subprocess.run(  # noqa: S603
            [sys.executable, "-m", "timeline.cli", *args],
            env=self.env, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        return done.stdout

    def stop(self) -> float:
        """SIGTERM; return how long the stack took to exit (it must exit 0)."""
        assert self.process is not None
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=30) == 0
        return time.monotonic() - started


async def _request(
    session: aiohttp.ClientSession, method: str, url: str, **kwargs: Any
) -> tuple[int, Any]:
    async with session.request(method, url, **kwargs) as response:
        body = await response.json() if response.content_type == "application/json" else None
        return response.status, body


async def _ready(session: aiohttp.ClientSession, base: str) -> bool:
    try:
        status, _ = await _request(session, "GET", f"{base}/readyz")
    except aiohttp.ClientError:
        return False
    return status == 200


@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_stack_runs_stops_and_keeps_data(tmp_path: Path) -> None:
    port, *azurite_ports = free_ports(4)
    stack = StackProcess(tmp_path / "data", port, tuple(azurite_ports))
    base = stack.base
    stack.start()
    try:
        async with aiohttp.ClientSession() as session:
            await eventually(lambda: _ready(session, base), timeout_s=60, what="the stack")
            _, alice = await _request(session, "POST", f"{base}/users", json={"user_id": "alice"})
            _, bob = await _request(session, "POST", f"{base}/users", json={"user_id": "bob"})
            bob_auth = {"Authorization": f"Bearer {bob['token']}"}
            alice_auth = {"Authorization": f"Bearer {alice['token']}"}
            status, _ = await _request(
                session, "PUT", f"{base}/users/bob/following/alice", headers=bob_auth
            )
            assert status == 204
            status, post = await _request(
                session,
                "POST",
                f"{base}/users/alice/posts",
                json={"text": "hi"},
                headers=alice_auth,
            )
            assert status == 202

            async def delivered() -> bool:
                _, page = await _request(
                    session, "GET", f"{base}/users/bob/timeline", headers=bob_auth
                )
                return [item["post_id"] for item in page["items"]] == [post["post_id"]]

            await eventually(delivered, what="the post on bob's timeline")

        assert "ready" in await asyncio.to_thread(stack.cli, "init")  # idempotent
        assert await asyncio.to_thread(stack.cli, "poison", "list") == ""
        minted = (await asyncio.to_thread(stack.cli, "token", "alice")).strip()
        stats = await asyncio.to_thread(stack.cli, "stats")
        assert "table users: 2" in stats
        assert "queue fanout-0-poison (account 0): 0" in stats
    finally:
        stop_seconds = stack.stop()
    assert stop_seconds < 20
    assert not (tmp_path / "data" / CONNECTION_FILE).exists()

    stack.start()
    try:
        async with aiohttp.ClientSession() as session:
            await eventually(lambda: _ready(session, base), timeout_s=60, what="the restart")
            status, page = await _request(
                session, "GET", f"{base}/users/bob/timeline", headers=bob_auth
            )
            assert status == 200
            assert [item["post_id"] for item in page["items"]] == [post["post_id"]]
            status, profile = await _request(session, "GET", f"{base}/users/alice")
            assert (status, profile["posts"], profile["followers"]) == (200, 1, 1)
            status, _ = await _request(
                session, "GET", f"{base}/users/alice/timeline",
                headers={"Authorization": f"Bearer {minted}"},
            )  # fmt: skip
            assert status == 200
    finally:
        stack.stop()


async def _line_with(stream: asyncio.StreamReader, marker: bytes) -> bytes:
    """Read ``stream`` up to the first line containing ``marker``; fail if it ends first."""
    seen: list[bytes] = []
    while line := await stream.readline():
        if marker in line:
            return line
        seen.append(line)
    raise AssertionError(
        f"no {marker!r} line before EOF:\n{b''.join(seen).decode(errors='replace')}"
    )


@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_stack_running_means_the_api_answers(tmp_path: Path) -> None:
    port, *azurite_ports = free_ports(4)
    stack = StackProcess(tmp_path / "data", port, tuple(azurite_ports))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "timeline.cli", "run", env=stack.env, stderr=asyncio.subprocess.PIPE
    )
    assert process.stderr is not None
    try:
        line = await asyncio.wait_for(_line_with(process.stderr, b"stack running"), 90)
        async with aiohttp.ClientSession() as session:  # one GET, no retry: it must answer now
            status, body = await _request(session, "GET", f"{stack.base}/healthz")
        assert (status, body) == (200, {"status": "ok"})
        assert f"stack running: API {stack.base}/" in line.decode()
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        _, returncode = await asyncio.wait_for(  # the children share the pipe: keep draining it
            asyncio.gather(process.stderr.read(), process.wait()), 30
        )
    assert returncode == 0
