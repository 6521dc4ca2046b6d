"""The stack as subprocesses for the ``timeline run`` tests: start, stop, the CLI, requests."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.conftest import eventually, program_env


class StackProcess:
    def __init__(
        self, data_dir: Path, port: int, azurite_ports: tuple[int, ...], **settings: object
    ) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.env = program_env(
            data_dir=data_dir,
            port=port,
            azurite_ports=",".join(map(str, azurite_ports)),
            **settings,
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "timeline.tools.cli", "run"], env=self.env
        )

    def cli(self, *args: str) -> str:
        done = subprocess.run(  # noqa: S603
            [sys.executable, "-m", "timeline.tools.cli", *args],
            env=self.env, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        return done.stdout

    async def start_piped(self) -> asyncio.subprocess.Process:
        """``timeline run`` with its log (stderr) piped."""
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "timeline.tools.cli",
            "run",
            env=self.env,
            stderr=asyncio.subprocess.PIPE,
        )

    def stop(self) -> float:
        """SIGTERM; return how long the stack took to exit (it must exit 0)."""
        assert self.process is not None
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=30) == 0
        return time.monotonic() - started


async def request(
    session: aiohttp.ClientSession, method: str, url: str, **kwargs: Any
) -> tuple[int, Any]:
    async with session.request(method, url, **kwargs) as response:
        body = await response.json() if response.content_type == "application/json" else None
        return response.status, body


async def ready(session: aiohttp.ClientSession, base: str) -> bool:
    try:
        status, _ = await request(session, "GET", f"{base}/readyz")
    except aiohttp.ClientError:
        return False
    return status == 200


async def alice_posts_to_bob(
    session: aiohttp.ClientSession, base: str
) -> tuple[dict[str, str], dict[str, Any]]:
    """Register alice and bob, bob follows alice, alice posts, the post reaches bob's
    timeline; return bob's auth header and the post."""
    _, alice = await request(session, "POST", f"{base}/users", json={"user_id": "alice"})
    _, bob = await request(session, "POST", f"{base}/users", json={"user_id": "bob"})
    bob_auth = {"Authorization": f"Bearer {bob['token']}"}
    alice_auth = {"Authorization": f"Bearer {alice['token']}"}
    status, _ = await request(session, "PUT", f"{base}/users/bob/following/alice", headers=bob_auth)
    assert status == 204
    status, post = await request(
        session, "POST", f"{base}/users/alice/posts", json={"text": "hi"}, headers=alice_auth
    )
    assert status == 202

    async def delivered() -> bool:
        _, page = await request(session, "GET", f"{base}/users/bob/timeline", headers=bob_auth)
        return [item["post_id"] for item in page["items"]] == [post["post_id"]]

    await eventually(delivered, what="the post on bob's timeline")
    return bob_auth, post


async def line_with(stream: asyncio.StreamReader, marker: bytes) -> bytes:
    """Read ``stream`` up to the first line containing ``marker``; fail if it ends first."""
    seen: list[bytes] = []
    while line := await stream.readline():
        if marker in line:
            return line
        seen.append(line)
    raise AssertionError(
        f"no {marker!r} line before EOF:\n{b''.join(seen).decode(errors='replace')}"
    )


async def start_until_ready(
    stack: StackProcess,
) -> tuple[asyncio.subprocess.Process, str, asyncio.Task[bytes]]:
    """``timeline run`` with its log piped: the process, its ``stack running`` line, and the
    task that keeps reading the log after it (the children share the pipe)."""
    process = await stack.start_piped()
    assert process.stderr is not None
    try:
        line = await asyncio.wait_for(line_with(process.stderr, b"stack running"), 60)
    except BaseException:
        process.kill()
        await process.wait()
        raise
    return process, line.decode(), asyncio.create_task(process.stderr.read())


async def stop_stack(process: asyncio.subprocess.Process, log: asyncio.Task[bytes]) -> int:
    """SIGTERM; the stack's exit code."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    _, returncode = await asyncio.wait_for(asyncio.gather(log, process.wait()), 30)
    return returncode
