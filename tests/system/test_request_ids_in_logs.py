"""``TIMELINE_LOG_FORMAT`` and ``X-Request-Id``: every line a request logs carries its id."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import re
import secrets
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pydantic import ValidationError

from api.app import create_app
from tests.conftest import TEST_SECRET, eventually, program_env
from timeline.config import Settings
from timeline.logs import LogFormat, log_handler
from timeline.storage.accounts import Storage
from timeline.tools.azurite import Azurite, free_ports

Client = TestClient[Any, Any]
GENERATED = re.compile(r"[0-9a-f]{32}")
log = logging.getLogger("timeline.test_logs")


@contextlib.contextmanager
def captured(log_format: LogFormat) -> Iterator[io.StringIO]:
    """What the programs' handler writes in ``log_format``, at INFO, while this lasts."""
    stream = io.StringIO()
    handler = log_handler(log_format, stream)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


async def _chatty(_request: web.Request) -> web.Response:
    """Logs in the request's task and in a task it starts, as library code would."""

    async def in_a_task() -> None:
        log.info("in a task it started")

    log.info("in the handler")
    await asyncio.create_task(in_a_task())
    return web.Response(text="ok")


async def _broken(_request: web.Request) -> web.Response:
    raise RuntimeError("boom")


@contextlib.asynccontextmanager
async def _app_with_test_routes(settings: Settings) -> Any:
    app = create_app(settings, settings.connection_string())
    app.router.add_get("/test/chatty", _chatty)
    app.router.add_get("/test/broken", _broken)
    async with TestClient(TestServer(app)) as client:
        yield client


async def test_json_lines_of_a_request_carry_its_id(settings: Settings, storage: Storage) -> None:
    given = f"req-{secrets.token_hex(6)}"
    with captured("json") as stream:
        async with _app_with_test_routes(settings) as client:
            response = await client.get("/test/chatty", headers={"X-Request-Id": given})
            assert (response.status, response.headers["X-Request-Id"]) == (200, given)
            failed = await client.get("/test/broken")
            assert failed.status == 500
            generated = failed.headers["X-Request-Id"]
            assert GENERATED.fullmatch(generated)
    records = [json.loads(line) for line in stream.getvalue().splitlines()]  # each one object

    ours = [r for r in records if r["logger"] == "timeline.test_logs"]
    assert [(r["message"], r["request_id"]) for r in ours] == [
        ("in the handler", given), ("in a task it started", given),
    ]  # fmt: skip
    assert all(r["level"] == "INFO" and r["time"] for r in ours)
    access = {r["first_request_line"]: r for r in records if r["logger"] == "aiohttp.access"}
    assert access["GET /test/chatty HTTP/1.1"]["request_id"] == given
    assert access["GET /test/broken HTTP/1.1"]["request_id"] == generated
    assert access["GET /test/broken HTTP/1.1"]["response_status"] == 500
    [error] = [r for r in records if r["logger"] == "api.middleware"]
    assert (error["level"], error["request_id"]) == ("ERROR", generated)
    assert error["message"] == "unhandled error in GET '/test/broken'"
    assert "RuntimeError: boom" in error["exc_info"]
    assert not [r for r in records if r["logger"] == "aiohttp.access" and "request_id" not in r]


async def test_text_lines_of_a_request_end_with_its_id(
    settings: Settings, storage: Storage
) -> None:
    given = f"req-{secrets.token_hex(6)}"
    with captured("text") as stream:
        async with _app_with_test_routes(settings) as client:
            response = await client.get("/test/chatty", headers={"X-Request-Id": given})
            assert response.headers["X-Request-Id"] == given
        log.info("outside any request")
    lines = stream.getvalue().splitlines()
    assert [line for line in lines if " timeline.test_logs INFO in the handler " in line]
    ours = [line for line in lines if "timeline.test_logs" in line or "/test/chatty" in line]
    assert len(ours) == 4  # the handler's, its task's, the access line, and the one outside
    assert all(line.endswith(f" request_id={given}") for line in ours[:3]), ours
    assert ours[3].endswith(" INFO outside any request")


@pytest.mark.parametrize(
    "given",
    ["abc", "0f8fad5b-d9cb-469f-a165-70867728950e", "Root=1-5759e988:x/y+z.w_v", "a" * 128],
)
async def test_a_sane_incoming_request_id_is_kept(client: Client, given: str) -> None:
    response = await client.get("/healthz", headers={"X-Request-Id": given})
    assert response.headers["X-Request-Id"] == given


@pytest.mark.parametrize(
    "given", ["", "a" * 129, "two words", 'quo"te', "semi;colon", "<script>", "per%20cent"]
)
async def test_an_insane_incoming_request_id_is_replaced(client: Client, given: str) -> None:
    response = await client.get("/healthz", headers={"X-Request-Id": given})
    assert GENERATED.fullmatch(response.headers["X-Request-Id"])


async def test_every_response_has_its_own_id(client: Client) -> None:
    responses = [await client.get(path) for path in ("/healthz", "/healthz", "/no/such/route")]
    ids = [response.headers["X-Request-Id"] for response in responses]
    assert all(GENERATED.fullmatch(request_id) for request_id in ids)
    assert len(set(ids)) == 3
    assert responses[2].status == 404


def test_log_format_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().log_format == "text"
    monkeypatch.setenv("TIMELINE_LOG_FORMAT", "json")
    assert Settings().log_format == "json"
    monkeypatch.setenv("TIMELINE_LOG_FORMAT", "xml")
    with pytest.raises(ValidationError, match="log_format"):
        Settings()


async def test_the_api_program_logs_json_lines_with_request_ids(
    azurite: Azurite, storage: Storage, tmp_path: Path
) -> None:
    """``python -m api`` with ``TIMELINE_LOG_FORMAT=json``: ``main()`` takes the format from
    the settings, every line on standard error is one JSON object, and the access line of a
    request carries the id its response returned."""
    port = free_ports(1)[0]
    env = program_env(
        storage_connection_string=azurite.connection_string,
        data_dir=tmp_path,
        auth_secret=TEST_SECRET,
        port=port,
        log_format="json",
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "api", env=env, stderr=asyncio.subprocess.PIPE
    )
    assert process.stderr is not None
    base = f"http://127.0.0.1:{port}"
    given = f"req-{secrets.token_hex(6)}"
    try:
        async with aiohttp.ClientSession() as session:

            async def healthy() -> bool:
                try:
                    async with session.get(f"{base}/healthz") as response:
                        return response.status == 200
                except aiohttp.ClientConnectionError:
                    return False

            await eventually(healthy, what="the API")
            headers = {"X-Request-Id": given}
            async with session.get(f"{base}/users/nobody-{given}", headers=headers) as response:
                assert (response.status, response.headers["X-Request-Id"]) == (404, given)
    finally:
        process.send_signal(signal.SIGTERM)
        output, returncode = await asyncio.wait_for(
            asyncio.gather(process.stderr.read(), process.wait()), 30
        )
    assert returncode == 0
    records = [json.loads(line) for line in output.decode().splitlines()]
    [access] = [r for r in records if f"/users/nobody-{given}" in r["message"]]
    assert (access["logger"], access["request_id"]) == ("aiohttp.access", given)
