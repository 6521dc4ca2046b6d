"""``timeline run`` scaled out: several storage accounts, API processes and workers, each
role with its own metrics, one rate limit across the API processes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import eventually
from tests.tools.stack_helpers import (
    StackProcess,
    alice_posts_to_bob,
    request,
    start_until_ready,
    stop_stack,
)
from timeline.config import CONNECTION_FILE
from timeline.tools.azurite import PORTS_FILE, free_ports
from timeline.tools.stack import port_taken


def _stack_children(pid: int) -> dict[str, list[psutil.Process]]:
    """The stack's descendants by kind: Azurites, API processes, fan-out workers."""
    kinds: dict[str, list[psutil.Process]] = {"azurite": [], "api": [], "worker": []}
    for child in psutil.Process(pid).children(recursive=True):
        try:
            command = child.cmdline()
        except psutil.Error:  # exited meanwhile
            continue
        if any(part.endswith("azurite.js") for part in command):
            kinds["azurite"].append(child)
        elif command[-2:] == ["-m", "api"]:
            kinds["api"].append(child)
        elif command[-2:] == ["-m", "fanout_worker"]:
            kinds["worker"].append(child)
    return kinds


def _local_ports(process: psutil.Process, status: str) -> set[int]:
    return {c.laddr.port for c in process.net_connections(kind="tcp") if c.status == status}


async def _apis_holding_connections(port: int, apis: list[psutil.Process]) -> set[int]:
    """Open 32 fresh connections, one request on each, and keep them open: the pids of the
    API processes that hold one (each has a 2**-32 chance to hold none)."""
    connections = [await asyncio.open_connection("127.0.0.1", port) for _ in range(32)]
    try:
        for _, writer in connections:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: stack\r\n\r\n")
        for reader, _ in connections:
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        return {api.pid for api in apis if port in _local_ports(api, psutil.CONN_ESTABLISHED)}
    finally:
        for _, writer in connections:
            writer.close()


async def _a_rate_limit_holds_across_both_apis(
    session: aiohttp.ClientSession, base: str, port: int, apis: list[psutil.Process]
) -> None:
    """Carol posts over connections held by each API process in turn: with 4 posts a
    minute allowed, the fifth is refused, whichever process counts it."""
    _, carol = await request(session, "POST", f"{base}/users", json={"user_id": "carol"})
    by_pid: dict[int, list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}
    opened = [await asyncio.open_connection("127.0.0.1", port) for _ in range(32)]
    try:
        for reader, writer in opened:
            assert await _raw_request(reader, writer, "GET", "/healthz") == 200
        for api in apis:
            clients = {
                c.raddr.port
                for c in api.net_connections(kind="tcp")
                if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port and c.raddr
            }
            by_pid[api.pid] = [
                (r, w) for r, w in opened if w.get_extra_info("sockname")[1] in clients
            ]
        first, second = (by_pid[api.pid][0] for api in apis)
        statuses = [
            await _raw_request(*connection, "POST", "/users/carol/posts", carol["token"])
            for connection in (first, second, first, second, first, second)
        ]
        assert statuses == [202, 202, 202, 202, 429, 429], statuses
    finally:
        for _, writer in opened:
            writer.close()


async def _raw_request(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    method: str,
    path: str,
    token: str | None = None,
) -> int:
    """One HTTP/1.1 request on a kept-alive connection; its status (the body is read)."""
    body = b'{"text": "hi"}' if method == "POST" else b""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    writer.write(
        f"{method} {path} HTTP/1.1\r\nHost: stack\r\n{auth}Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    status = int((await reader.readline()).split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    await reader.readexactly(length)
    return status


async def _metric_families(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Each family of a scrape with the sum of its samples."""
    async with session.get(url) as response:
        assert response.status == 200
        text = await response.text()
    return {
        family.name: sum(sample.value for sample in family.samples)
        for family in text_string_to_metric_families(text)
    }


async def _each_role_serves_its_own_metrics(
    session: aiohttp.ClientSession, base: str, worker_port: int
) -> None:
    """The API's /metrics has no fan-out series; the workers' have them, and the storage
    calls every process makes."""
    api = await _metric_families(session, f"{base}/metrics")
    assert api["timeline_http_requests"] > 0
    assert api["timeline_storage_requests"] > 0
    assert not [name for name in api if name.startswith("fanout_")]
    workers = [
        await _metric_families(session, f"http://127.0.0.1:{worker_port + index}/metrics")
        for index in range(2)
    ]
    assert sum(worker["fanout_deliveries"] for worker in workers) >= 1  # bob got the post
    for worker in workers:
        assert worker["timeline_storage_requests"] > 0
        assert "fanout_messages" in worker
        assert "timeline_http_requests" not in worker


def _two_free_ports_in_a_row() -> int:
    for port in free_ports(16):
        if port < 65535 and not port_taken("127.0.0.1", port + 1):
            return port
    raise AssertionError("no two free ports in a row")


@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_stack_runs_several_accounts_api_processes_and_workers(tmp_path: Path) -> None:
    port, *azurite_ports = free_ports(4)
    metrics = _two_free_ports_in_a_row()
    data = tmp_path / "data"
    stack = StackProcess(
        data, port, tuple(azurite_ports),
        embedded_accounts=2, api_processes=2, workers=2, worker_metrics_port=metrics,
        posts_per_minute=4,
    )  # fmt: skip
    process, line, log = await start_until_ready(stack)
    children: dict[str, list[psutil.Process]] = {}
    try:
        assert f"stack running: API {stack.base}/  docs {stack.base}/docs  " in line
        assert f"  web client {stack.base}/ (2 API processes, 2 workers, " in line
        assert "2 storage accounts, embedded Azurite)" in line
        children = _stack_children(process.pid)
        assert {kind: len(found) for kind, found in children.items()} == {
            "azurite": 2, "api": 2, "worker": 2,
        }  # fmt: skip
        apis = children["api"]

        async def both_listen() -> bool:  # on the one port (SO_REUSEPORT); the ready line
            # waits for one answer only, enough for the first request to be served
            return all(port in _local_ports(api, psutil.CONN_LISTEN) for api in apis)

        await eventually(both_listen, what="both API processes listening")
        assert await _apis_holding_connections(port, apis) == {api.pid for api in apis}
        assert f"metrics http://127.0.0.1:{metrics + 1}/metrics" in line

        async def worker_i_serves_metrics_on_port_plus_i() -> bool:
            listening = {
                frozenset(_local_ports(worker, psutil.CONN_LISTEN)) for worker in children["worker"]
            }
            return listening == {frozenset({metrics}), frozenset({metrics + 1})}

        await eventually(worker_i_serves_metrics_on_port_plus_i, what="worker metrics ports")

        assert len((data / CONNECTION_FILE).read_text().split()) == 2
        assert (data / CONNECTION_FILE).stat().st_mode & 0o777 == 0o600
        assert (data / "azurite" / PORTS_FILE).read_text() == ",".join(map(str, azurite_ports))
        assert (data / "azurite-1" / PORTS_FILE).is_file()
        async with aiohttp.ClientSession() as session:
            bob_auth, post = await alice_posts_to_bob(session, stack.base)
            await _each_role_serves_its_own_metrics(session, stack.base, metrics)
            await _a_rate_limit_holds_across_both_apis(session, stack.base, port, apis)
        stats = await asyncio.to_thread(stack.cli, "stats")
        assert "table users: 3 users, " in stats
        assert "(account 1)" in stats
    finally:
        returncode = await stop_stack(process, log)
    assert returncode == 0
    _, alive = psutil.wait_procs([p for found in children.values() for p in found], timeout=5)
    assert not alive, f"still running after the stack exited: {alive}"
    assert not (data / CONNECTION_FILE).exists()

    # The second Azurite's ports were picked free; it keeps them, or else the stored
    # placement, which names each account by its endpoint, would refuse it at restart.
    process, line, log = await start_until_ready(stack)
    try:
        async with aiohttp.ClientSession() as session:
            status, page = await request(
                session, "GET", f"{stack.base}/users/bob/timeline", headers=bob_auth
            )
        assert status == 200
        assert [item["post_id"] for item in page["items"]] == [post["post_id"]]
    finally:
        returncode = await stop_stack(process, log)
    assert returncode == 0
