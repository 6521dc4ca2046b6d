"""Clients that never finish: a real ``python -m api`` process, raw sockets (asyncio streams).

Slow headers, a half-sent body and an idle keep-alive connection are each closed after their
timeout; connection ``TIMELINE_MAX_CONNECTIONS`` + 1 is refused with a 503; and a process
with every kind of stuck client (streams included) exits within its grace period.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.conftest import TEST_SECRET, eventually, program_env, unique
from timeline.tools.azurite import Azurite, free_ports

HEADER_S, BODY_S, IDLE_S = 1.0, 1.0, 2.0
SLACK_S = 1.5
"""How late a close may come after its timeout on a busy machine."""


@dataclass
class Api:
    port: int
    process: subprocess.Popen[bytes]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)


@contextmanager
def _api_process(azurite: Azurite, data_dir: Path, **settings: object) -> Iterator[Api]:
    port = free_ports(1)[0]
    env = program_env(
        storage_connection_string=azurite.connection_string,
        data_dir=data_dir,
        auth_secret=TEST_SECRET,
        port=port,
        registrations_per_minute=0,
        **settings,
    )
    command = [sys.executable, "-m"]
    subprocess.run([*command, "timeline.tools.cli", "init"], env=env, check=True, timeout=60)  # noqa: S603
    process = subprocess.Popen([*command, "api"], env=env, stderr=subprocess.DEVNULL)  # noqa: S603
    try:
        yield Api(port, process)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


async def _ready(api: Api) -> None:
    async def answers() -> bool:
        try:
            async with aiohttp.ClientSession() as session, session.get(f"{api.base}/readyz") as r:
                return r.status == 200
        except aiohttp.ClientError:
            return False

    await eventually(answers, what="the API to be ready")


@asynccontextmanager
async def _running(azurite: Azurite, data_dir: Path, **settings: object) -> AsyncIterator[Api]:
    with _api_process(azurite, data_dir, **settings) as api:
        await _ready(api)
        yield api


@pytest.fixture(scope="module")
async def api(azurite: Azurite, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Api]:
    async with _running(
        azurite,
        tmp_path_factory.mktemp("connections"),
        header_timeout_s=HEADER_S,
        body_timeout_s=BODY_S,
        keepalive_timeout_s=IDLE_S,
    ) as running:
        yield running


async def _until_closed(reader: asyncio.StreamReader, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes (or resets) the connection, and how long
    that took; fails after ``limit_s``: the connection was held."""
    started = time.monotonic()
    received = b""
    async with asyncio.timeout(limit_s):
        try:
            while chunk := await reader.read(65536):
                received += chunk
        except ConnectionResetError:
            pass
    return received, time.monotonic() - started


def _status_and_code(response: bytes) -> tuple[int, str]:
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), orjson.loads(body)["error"]["code"]


async def test_unfinished_headers_get_a_408_and_are_closed(api: Api) -> None:
    reader, writer = await api.connect()
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    try:
        response, took = await _until_closed(reader, HEADER_S + IDLE_S + SLACK_S)
    finally:
        writer.close()
    assert _status_and_code(response) == (408, "header_timeout")
    assert HEADER_S - 0.1 <= took <= HEADER_S + SLACK_S


async def test_headers_trickled_forever_are_cut_off(api: Api) -> None:
    """Slowloris: a header line every 0.2 s, never the blank line. The connection is closed
    at the header deadline (the 408 may be lost to the reset the client's next line causes,
    which is the client's problem)."""
    reader, writer = await api.connect()
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: slowloris\r\n")

    async def trickle() -> None:
        for number in range(100):  # a header line every 0.2 s, never the blank line
            await asyncio.sleep(0.2)
            writer.write(f"X-Slow-{number}: a\r\n".encode())

    trickling = asyncio.create_task(trickle())
    try:
        response, took = await _until_closed(reader, HEADER_S + IDLE_S + SLACK_S)
    finally:
        trickling.cancel()
        writer.close()
    if response:
        assert _status_and_code(response) == (408, "header_timeout")
    assert HEADER_S - 0.1 <= took <= HEADER_S + SLACK_S


async def test_a_half_sent_body_gets_a_408_and_is_closed(api: Api) -> None:
    reader, writer = await api.connect()
    writer.write(
        b"POST /users HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n{}"
    )
    try:
        response, took = await _until_closed(reader, BODY_S + IDLE_S + SLACK_S)
    finally:
        writer.close()
    assert _status_and_code(response) == (408, "body_timeout")
    assert BODY_S - 0.1 <= took <= BODY_S + SLACK_S


async def test_an_idle_keep_alive_connection_is_closed(api: Api) -> None:
    reader, writer = await api.connect()
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        await reader.readuntil(b'{"status":"ok"}')
        rest, took = await _until_closed(reader, IDLE_S + SLACK_S + 1)
    finally:
        writer.close()
    assert rest == b""
    assert IDLE_S - 0.1 <= took <= IDLE_S + SLACK_S


async def test_head_healthz_is_200_without_a_body(api: Api) -> None:
    """Load balancers' health checks send HEAD."""
    async with aiohttp.ClientSession() as session:
        for path in ("/healthz", "/readyz"):
            async with session.head(f"{api.base}{path}") as response:
                assert response.status == 200, path
                assert await response.read() == b""


async def test_the_connection_over_the_cap_is_refused_with_a_503(
    azurite: Azurite, tmp_path: Path
) -> None:
    """Refused, not queued: the client learns at once and can go to another process."""
    cap = 3
    async with _running(azurite, tmp_path, max_connections=cap, keepalive_timeout_s=60) as api:
        held = [await api.connect() for _ in range(cap)]
        try:
            for reader, writer in held:  # each served, and kept open
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert (await reader.readline()).startswith(b"HTTP/1.1 200")
            reader, writer = await api.connect()
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            response, _ = await _until_closed(reader, 5)
            writer.close()
            assert _status_and_code(response) == (503, "overloaded")
            assert b"\r\nRetry-After: 1\r\n" in response
        finally:
            held.pop()[1].close()
        await _ready(api)  # one closed: a new connection is served again
        for _, writer in held:
            writer.close()


async def _open_stream(api: Api) -> asyncio.StreamWriter:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{api.base}/users", json={"user_id": unique("stuck")}) as registered,
    ):
        user = await registered.json()
    reader, writer = await api.connect()
    writer.write(
        f"GET /users/{user['user_id']}/timeline/stream HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {user['token']}\r\n\r\n".encode()
    )
    assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    return writer


async def test_shutdown_ends_within_its_grace_whatever_clients_do(
    azurite: Azurite, tmp_path: Path
) -> None:
    grace = 3.0
    stuck = {"header_timeout_s": 120, "body_timeout_s": 120, "keepalive_timeout_s": 120}
    async with _running(azurite, tmp_path, api_shutdown_grace_s=grace, **stuck) as api:
        clients = [await _open_stream(api), await _open_stream(api)]
        _, slow_head = await api.connect()
        slow_head.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        _, half_body = await api.connect()
        half_body.write(
            b"POST /users HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{}"
        )
        idle_reader, idle = await api.connect()
        idle.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await idle_reader.readline()).startswith(b"HTTP/1.1 200")
        _, silent = await api.connect()
        clients += [slow_head, half_body, idle, silent]
        await asyncio.sleep(0.2)  # let the server see the partial request and body
        started = time.monotonic()
        api.process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(api.process.wait, grace + 10)
        took = time.monotonic() - started
        for writer in clients:
            writer.close()
    print(f"shutdown with {len(clients)} stuck clients took {took:.2f} s")
    assert code == 0
    assert took <= grace + 0.5
