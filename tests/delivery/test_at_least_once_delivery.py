"""Storage trouble delays work but never loses or poisons it: outages, message expiry,
lease renewals behind hung table calls."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from fanout_worker import worker as worker_module
from tests.conftest import eventually, make_settings, opened, running_worker
from tests.delivery.helpers import author_and_reader, messages_counted, timeline_ids
from tests.faults import FaultyStorage
from timeline.model.messages import PostCreated, PostDeleted
from timeline.storage.accounts import Storage, StorageOptions
from timeline.storage.queue import FanoutQueue
from timeline.tables.repositories import Repositories
from timeline.tools.azurite import Azurite


class _TablesDown(FaultyStorage):
    def __init__(self, connection_string: str, options: StorageOptions | None = None) -> None:
        super().__init__(connection_string, options)
        self.tables_down = True


async def test_storage_trouble_never_poisons(
    private_azurite: Azurite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(
        private_azurite.connection_string,
        tmp_path,
        worker_visibility_timeout_s=1,
        worker_max_deliveries=1,
        storage_timeout_s=1,
        storage_retries=0,
    )
    async with opened(settings) as storage:
        repos, queue = Repositories.on(storage), FanoutQueue(storage)
        author, reader, [post] = await author_and_reader(repos)
        await queue.send(PostCreated(author=author, post_id=post.post_id))
        deferred = messages_counted("post", "defer")

        async def deferred_often() -> bool:
            return messages_counted("post", "defer") >= deferred + 4

        with monkeypatch.context() as patched:
            patched.setattr(worker_module, "Storage", _TablesDown)
            async with running_worker(settings):  # every table call fails: an outage
                await eventually(deferred_often, timeout_s=60, what="four leases lost to storage")
        assert (await queue.depth())[1] == 0, "storage trouble poisoned a message"
        async with running_worker(settings):

            async def delivered() -> bool:
                return await timeline_ids(repos, reader) == [post.post_id]

            await eventually(delivered, timeout_s=30, what="delivery once storage is back")
        assert (await queue.depth())[1] == 0


async def test_work_messages_never_expire(private_azurite: Azurite, tmp_path: Path) -> None:
    settings = make_settings(private_azurite.connection_string, tmp_path)
    async with opened(settings) as storage:
        queue = FanoutQueue(storage)
        await queue.send(PostDeleted(author="a", post_id="0" * 26))
        [message] = await queue.peek_work()
        assert message.expires_on is not None
        assert message.expires_on.year == 9999


class _HangingProxy:
    """A TCP proxy in front of Azurite's table port that forwards until ``hang`` is set,
    then accepts connections and never answers (a slow account)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.hang = False
        self.hung: list[asyncio.StreamWriter] = []
        self._pipes: set[asyncio.Task[None]] = set()
        self._forwarded: list[asyncio.StreamWriter] = []

    def start_hanging(self) -> None:
        """Hang every new connection and drop the forwarded ones (so none is reused)."""
        self.hang = True
        for writer in self._forwarded:
            writer.close()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.hang:
            self.hung.append(writer)
            return
        upstream_reader, upstream_writer = await asyncio.open_connection(
            "127.0.0.1", self.target_port
        )
        self._forwarded += [writer, upstream_writer]
        for source, sink in ((reader, upstream_writer), (upstream_reader, writer)):
            task = asyncio.create_task(_pipe(source, sink))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    sink.close()


async def test_lease_renewals_do_not_wait_behind_table_calls(
    private_azurite: Azurite, tmp_path: Path
) -> None:
    """Table calls that hang (a slow account) hold every table connection; queue calls (lease
    renewals) have their own pool and still answer."""
    proxy = _HangingProxy(private_azurite.ports[2])
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = make_settings(private_azurite.connection_string, tmp_path, storage_timeout_s=5)
    mixed = ";".join(
        f"TableEndpoint=http://127.0.0.1:{port}/devstoreaccount1"
        if part.startswith("TableEndpoint=")
        else part
        for part in settings.connection_string().split(";")
    )
    async with server, Storage(mixed, settings.storage_options()) as storage:
        await storage.create_all()
        queue = FanoutQueue(storage)
        proxy.start_hanging()
        repos = Repositories.on(storage)
        table_calls = [asyncio.create_task(repos.users.exists(f"u{i}")) for i in range(300)]

        async def pool_full() -> bool:
            return len(proxy.hung) >= 100

        await eventually(pool_full, timeout_s=10, what="the table connections to hang")
        assert await queue.depth() == (0, 0)
        assert not any(task.done() for task in table_calls), "queue call waited for the tables"
        for task in table_calls:
            task.cancel()
        await asyncio.gather(*table_calls, return_exceptions=True)
        for writer in proxy.hung:
            writer.close()
