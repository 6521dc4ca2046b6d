"""``make run`` for real: the stack as subprocesses, stopped by SIGTERM, restarted with its data."""

from __future__ import annotations

import asyncio
import signal
import socket
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import eventually
from tests.tools.stack_helpers import StackProcess, alice_posts_to_bob, line_with, ready, request
from timeline.config import CONNECTION_FILE
from timeline.tools.azurite import free_ports
from timeline.tools.stack import port_taken


@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_stack_runs_stops_and_keeps_data(tmp_path: Path) -> None:
    port, *azurite_ports = free_ports(4)
    stack = StackProcess(tmp_path / "data", port, tuple(azurite_ports))
    base = stack.base
    stack.start()
    try:
        async with aiohttp.ClientSession() as session:
            await eventually(lambda: ready(session, base), timeout_s=60, what="the stack")
            bob_auth, post = await alice_posts_to_bob(session, base)

        assert "ready" in await asyncio.to_thread(stack.cli, "init")  # idempotent
        assert await asyncio.to_thread(stack.cli, "poison", "list") == "no poison messages\n"
        minted = (await asyncio.to_thread(stack.cli, "token", "alice")).strip()
        stats = await asyncio.to_thread(stack.cli, "stats")
        assert "table users: 2 users, 2 internal row(s)" in stats
        assert "queue fanout-0-poison (account 0): 0" in stats
    finally:
        stop_seconds = stack.stop()
    assert stop_seconds < 20
    assert not (tmp_path / "data" / CONNECTION_FILE).exists()

    stack.start()
    try:
        async with aiohttp.ClientSession() as session:
            await eventually(lambda: ready(session, base), timeout_s=60, what="the restart")
            status, page = await request(
                session, "GET", f"{base}/users/bob/timeline", headers=bob_auth
            )
            assert status == 200
            assert [item["post_id"] for item in page["items"]] == [post["post_id"]]
            status, profile = await request(session, "GET", f"{base}/users/alice")
            assert (status, profile["posts"], profile["followers"]) == (200, 1, 1)
            status, _ = await request(
                session, "GET", f"{base}/users/alice/timeline",
                headers={"Authorization": f"Bearer {minted}"},
            )  # fmt: skip
            assert status == 200
    finally:
        stack.stop()


@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_stack_running_means_the_api_answers(tmp_path: Path) -> None:
    port, *azurite_ports = free_ports(4)
    stack = StackProcess(tmp_path / "data", port, tuple(azurite_ports))
    process = await stack.start_piped()
    assert process.stderr is not None
    try:
        line = await asyncio.wait_for(line_with(process.stderr, b"stack running"), 90)
        async with aiohttp.ClientSession() as session:  # one GET, no retry: it must answer now
            status, body = await request(session, "GET", f"{stack.base}/healthz")
        assert (status, body) == (200, {"status": "ok"})
        async with aiohttp.ClientSession() as session, session.get(f"{stack.base}/docs") as docs:
            assert (docs.status, docs.content_type) == (200, "text/html")  # the line's docs URL
        assert f"stack running: API {stack.base}/  docs {stack.base}/docs  " in line.decode()
        assert f"  web client {stack.base}/ (1 API process, 1 worker, " in line.decode()
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        _, returncode = await asyncio.wait_for(  # the children share the pipe: keep draining it
            asyncio.gather(process.stderr.read(), process.wait()), 30
        )
    assert returncode == 0


def test_port_taken_sees_a_listener() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        assert port_taken("127.0.0.1", port)
    assert not port_taken("127.0.0.1", port)
