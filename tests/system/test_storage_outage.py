"""The API and the worker as real processes while their storage goes away and comes back.

Each test gets its own durable Azurite, an API process and a worker process. Every line
they log is captured and, when the test ends, searched for secrets: the HMAC key, the
storage account key and every token issued.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import eventually, program_env, unique
from tests.helpers import Api, bearer, error_of
from timeline.tools.azurite import Azurite, free_ports

STORAGE_TIMEOUT_S = 2.0
"""Every storage call gives up after this long, so no request may hang much longer."""


@dataclass
class Stack:
    azurite: Azurite
    api: asyncio.subprocess.Process
    worker: asyncio.subprocess.Process
    session: aiohttp.ClientSession
    logs: list[Path]
    secret: str
    worker_metrics: str
    """The worker's ``/metrics`` URL."""
    issued_tokens: list[str] = field(default_factory=list)
    idempotency_keys: list[str] = field(default_factory=list)

    @property
    def client(self) -> Api:
        return Api(self.session)

    async def register(self, user_id: str) -> str:
        """Register with an Idempotency-Key: clients treat keys as loggable, the service
        does not (they are searched for like the secrets)."""
        key = unique("idempotency-key")
        self.idempotency_keys.append(key)
        headers = {"Idempotency-Key": key}
        async with self.session.post(
            "/users", json={"user_id": user_id}, headers=headers
        ) as answer:
            assert answer.status == 201, await answer.text()
            token = str((await answer.json())["token"])
        self.issued_tokens.append(token)
        return token

    def secrets(self) -> list[str]:
        """What must never be logged or sent back: keys, tokens (whole or signature) and
        idempotency keys."""
        account_key = self.azurite.connection_string.split("AccountKey=")[1].split(";")[0]
        signatures = [token.rsplit(".", 1)[1] for token in self.issued_tokens]
        return [self.secret, account_key, *self.issued_tokens, *signatures, *self.idempotency_keys]

    def assert_no_secret_in(self, text: str, where: str) -> None:
        for secret in self.secrets():
            assert secret not in text, f"a secret appears in {where}"

    async def worker_counter(self, name: str) -> float:
        """The worker's counter ``name`` (its ``_total`` sample), read from its ``/metrics``."""
        async with self.session.get(self.worker_metrics) as response:
            text = await response.text()
        samples = [
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == f"{name}_total"
        ]
        return sum(samples)

    def assert_running(self) -> None:
        assert self.api.returncode is None, "the API process died"
        assert self.worker.returncode is None, "the worker process died"


async def _spawn(
    module: str, env: dict[str, str], log: Path, *args: str
) -> asyncio.subprocess.Process:
    """Run ``python -m module`` with its output (both streams) in ``log``."""
    with log.open("wb") as sink:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, *args, env=env, stdout=sink, stderr=sink
        )


async def _stop(process: asyncio.subprocess.Process) -> int:
    """SIGTERM, and the exit code; each program must stop on its own within a bound."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    return await asyncio.wait_for(process.wait(), 30)


async def _answers(session: aiohttp.ClientSession, path: str, status: int) -> bool:
    try:
        async with session.get(path) as response:
            return response.status == status
    except aiohttp.ClientError:
        return False


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    azurite = Azurite(location=tmp_path / "azurite")
    await asyncio.to_thread(azurite.start)
    port, metrics_port = free_ports(2)
    secret = secrets.token_urlsafe(32)
    env = program_env(
        storage_connection_string=azurite.connection_string,
        data_dir=tmp_path,
        auth_secret=secret,
        port=port,
        worker_metrics_port=metrics_port,
        posts_per_minute=0,
        storage_timeout_s=STORAGE_TIMEOUT_S,
        worker_idle_sleep_s=0.05,
        worker_idle_max_sleep_s=0.05,
        worker_visibility_timeout_s=5,
        worker_shutdown_grace_s=3,
    )
    logs = [tmp_path / "init.log", tmp_path / "api.log", tmp_path / "worker.log"]
    init = await _spawn("timeline.tools.cli", env, logs[0], "init")
    assert await init.wait() == 0, logs[0].read_text()
    api = await _spawn("api", env, logs[1])
    worker = await _spawn("fanout_worker", env, logs[2])
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:
        try:
            await eventually(lambda: _answers(session, "/readyz", 200), what="the API ready")
            metrics = f"http://127.0.0.1:{metrics_port}/metrics"
            running = Stack(azurite, api, worker, session, logs, secret, metrics)
            yield running
        finally:
            with contextlib.suppress(ProcessLookupError):
                worker.send_signal(signal.SIGCONT)
            codes = [await _stop(api), await _stop(worker)]
            await asyncio.to_thread(azurite.stop)
    assert codes == [0, 0], "both programs exit 0 on SIGTERM"
    for log in logs:
        text = log.read_text(errors="replace")
        assert text.strip() or log.name == "init.log", f"{log.name} captured nothing"
        running.assert_no_secret_in(text, log.name)


async def test_storage_outage_under_running_api_and_worker(stack: Stack) -> None:
    """Stop Azurite under both programs: the API answers 503 quickly, the worker keeps its
    messages; start it again and both recover without a restart, losing nothing."""
    api = stack.client
    author, readers = unique("author"), [unique("reader") for _ in range(2)]
    author_token = await stack.register(author)
    reader_tokens = [await stack.register(reader) for reader in readers]
    for reader, token in zip(readers, reader_tokens, strict=True):
        await api.follow(reader, token, author)
    warm_up = await api.post(author, author_token, "before the pause")

    async def reader_has(expected: list[str]) -> bool:
        return await api.timeline_ids(readers[0], reader_tokens[0]) == expected

    await eventually(lambda: reader_has([warm_up["post_id"]]), what="the pipeline working")

    unavailable = await stack.worker_counter("timeline_storage_unavailable")
    # Accepted while the worker is paused, so still queued when storage goes away.
    stack.worker.send_signal(signal.SIGSTOP)
    accepted = [(await api.post(author, author_token, f"queued {i}"))["post_id"] for i in range(3)]
    assert await reader_has([warm_up["post_id"]])
    await asyncio.to_thread(stack.azurite.stop)
    stack.worker.send_signal(signal.SIGCONT)

    session, author_headers, reader_headers = (
        stack.session,
        bearer(author_token),
        bearer(reader_tokens[1]),
    )
    during_outage: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", f"/users/{author}/posts", {"json": {"text": "x"}, "headers": author_headers}),
        ("GET", f"/users/{readers[1]}/timeline", {"headers": reader_headers}),
        ("GET", f"/users/{author}", {}),
        ("POST", "/users", {"json": {"user_id": unique("late")}}),
        ("PUT", f"/users/{readers[1]}/following/{unique('x')}", {"headers": reader_headers}),
        ("GET", "/readyz", {}),
    ]  # fmt: skip
    for method, path, options in during_outage:
        started = time.monotonic()
        async with session.request(method, path, **options) as response:
            assert await error_of(response, 503) == "storage_unavailable", (method, path)
            stack.assert_no_secret_in(await response.text(), f"the body of {method} {path}")
            assert 1 <= int(response.headers["Retry-After"]) <= 60
        elapsed = time.monotonic() - started
        assert elapsed < STORAGE_TIMEOUT_S + 1.5, f"{method} {path} hung for {elapsed:.1f}s"
    assert await _answers(session, "/healthz", 200), "liveness does not depend on storage"

    async def worker_met_the_outage() -> bool:
        """Its storage calls failed more than once: it backed off and tried again."""
        stack.assert_running()
        return await stack.worker_counter("timeline_storage_unavailable") > unavailable + 2

    await eventually(worker_met_the_outage, what="the worker to meet the outage")
    stack.assert_running()
    await asyncio.to_thread(stack.azurite.start)

    await eventually(lambda: _answers(session, "/readyz", 200), what="the API recovering")
    after = (await api.post(author, author_token, "after the outage"))["post_id"]
    everything = [after, *reversed(accepted), warm_up["post_id"]]
    for reader, token in zip(readers, reader_tokens, strict=True):

        async def delivered(reader: str = reader, token: str = token) -> bool:
            return await api.timeline_ids(reader, token) == everything

        await eventually(delivered, timeout_s=60, what=f"every post on {reader}'s timeline")

    async def on_own_timeline() -> bool:
        """The author's own copies are fan-out too: one that failed during the outage comes
        back with its message's retry, which may end after the readers' copies landed."""
        return await api.timeline_ids(author, author_token) == everything

    await eventually(on_own_timeline, timeout_s=60, what="every post on the author's timeline")
    posts = await session.get(f"/users/{author}/posts")
    assert [item["post_id"] for item in (await posts.json())["items"]] == everything, (
        "the post refused with 503 was not half-written"
    )
    assert (await api.profile(author))["posts"] == len(everything)
    stack.assert_running()


async def test_credentials_are_never_echoed(stack: Stack) -> None:
    """Broken, forged and borrowed credentials get a plain 401/403 that repeats none of them;
    the fixture then searches both programs' logs for every secret."""
    user, other = unique("user"), unique("other")
    token = await stack.register(user)
    other_token = await stack.register(other)
    await stack.client.post(user, token, "a post, so the worker logs something too")
    user_id, expires, rest = token.split(".", 2)
    signature = token.rsplit(".", 1)[1]
    presented = [
        other_token,
        f"{token[:-2]}AA",
        f"{user_id}.{int(expires) + 3600}.{rest}",
        f"{user_id}.1.{rest}",
        f"{user_id}.{expires}.{signature}",  # the old form, with this signature
        f"{token}x",
        token.swapcase(),
        "a" * 5000,
    ]
    requests = [("POST", f"/users/{user}/posts"), ("GET", f"/users/{user}/timeline")]
    for credential in presented:
        for scheme in ("Bearer ", "Basic ", ""):
            for method, path in requests:
                headers = {"Authorization": f"{scheme}{credential}"}
                async with stack.session.request(
                    method, path, json={"text": "x"}, headers=headers
                ) as response:
                    body = await response.text()
                    assert response.status in (401, 403), body
                assert credential not in body
                assert signature not in body
                stack.assert_no_secret_in(body, f"the {response.status} body of {method} {path}")
