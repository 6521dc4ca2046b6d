"""Each way the delivery guarantees used to break, as a test on real storage.

Each test failed on the code before its fix.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from fanout_worker import worker as worker_module
from fanout_worker.metrics import MESSAGES
from tests.conftest import (
    api_client,
    eventually,
    make_settings,
    running_worker,
    unique,
)
from tests.faults import FaultyStorage
from tests.helpers import Api, bearer
from timeline.config import Settings
from timeline.delivery.outcomes import DONE, Continue
from timeline.delivery.processor import FanoutProcessor
from timeline.errors import StorageUnavailableError
from timeline.metrics import MESSAGES_SENT
from timeline.model.entities import Post, User
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.messages import FanoutMessage, Followed, PostCreated, PostDeleted, Unfollowed
from timeline.model.tokens import TokenSigner
from timeline.reads.home import HomeTimeline
from timeline.service.operations import TimelineService
from timeline.storage.accounts import Storage, StorageOptions
from timeline.storage.azurite import Azurite
from timeline.storage.names import SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING, TIMELINES
from timeline.storage.queue import FanoutQueue
from timeline.storage.writer import PartitionWriter
from timeline.tables.ratelimits import RateLimits
from timeline.tables.repositories import Repositories

Client = TestClient[Any, Any]


@contextlib.asynccontextmanager
async def opened(settings: Settings) -> AsyncIterator[Storage]:
    async with Storage(settings.connection_string(), settings.storage_options()) as storage:
        await storage.create_all()
        yield storage


def _count(kind: str, outcome: str) -> float:
    return float(MESSAGES.labels(kind, outcome)._value.get())


def _sent(kind: str) -> float:
    return float(MESSAGES_SENT.labels(kind)._value.get())


async def _users(repos: Repositories, *names: str) -> None:
    for name in names:
        await repos.users.create(User(name, name, created_at=datetime.now(UTC)))


async def _follow(repos: Repositories, follower: str, subject: str) -> None:
    await repos.follows.add(follower, subject, datetime.now(UTC))
    await repos.follows.sync_index(follower, subject)


async def _unfollow(repos: Repositories, follower: str, subject: str) -> None:
    await repos.follows.remove(follower, subject)
    await repos.follows.sync_index(follower, subject)


async def _posts(repos: Repositories, author: str, count: int) -> list[Post]:
    base = now_ticks()
    posts = [Post(new_post_id(base + i * 10), author, f"#{i}") for i in range(count)]
    for post in posts:
        await repos.posts.add(post)
    return posts


async def _pair(repos: Repositories, posts: int = 1) -> tuple[str, str, list[Post]]:
    """An author, a reader who follows them, and the author's first ``posts`` posts."""
    author, reader = unique("author"), unique("reader")
    await _users(repos, author, reader)
    await _follow(repos, reader, author)
    return author, reader, await _posts(repos, author, posts)


async def _ids(repos: Repositories, owner: str) -> list[str]:
    return [post.post_id for post in (await repos.timelines.page(owner, 1000, None)).items]


def _service(storage: Storage, queue: FanoutQueue | None = None) -> TimelineService:
    return TimelineService(
        Repositories.on(storage),
        queue or FanoutQueue(storage),
        TokenSigner(b"test", token_ttl_s=3600),
        page_size=250,
        max_post_chars=280,
        limits=RateLimits.per_minute(storage, posts=0, writes=0, registrations=0),
        home=HomeTimeline(storage, max_merged=20),
    )


# --- the tracker (tests/storage/test_partition_writer.py::test_tracker_waits_for_writes_...)


# --- a crash between a delivery's write and its re-check


async def _crash_after_write(storage: Storage, held: PartitionWriter, post: Post) -> None:
    """Run a delivery until its copies are buffered, then kill it before its re-check: the
    copies are still in flight (they land when ``held`` is flushed), nothing undoes them."""
    delivering = FanoutProcessor.on(storage, held)
    task = asyncio.create_task(
        delivering.deliver(PostCreated(author=post.author, post_id=post.post_id))
    )

    async def buffered() -> bool:
        return held.buffered > 0

    await eventually(buffered, timeout_s=10, what="the delivery's copies to be buffered")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _quick_sweeps(settings: Settings) -> Settings:
    """A worker whose second passes come soon (its own writes are small and quick)."""
    return settings.model_copy(update={"worker_write_deadline_s": 1.5, "worker_sweep_delay_s": 7.0})


async def _first_pass_done(kind: str, before: float) -> None:
    async def rewritten() -> bool:
        return _count(kind, "continue") > before

    await eventually(rewritten, timeout_s=20, what=f"the {kind}'s first pass")


async def _late_copy(
    storage: Storage, held: PartitionWriter, post: Post, kind: str, interfere: Awaitable[None]
) -> None:
    """A delivery dies after buffering its copy; ``interfere`` (a delete or an unfollow) runs
    its first pass; only then does the dead delivery's copy land."""
    await _crash_after_write(storage, held, post)
    before = _count(kind, "continue")
    await interfere
    await _first_pass_done(kind, before)
    await held.flush()


async def test_copy_landing_after_delete_and_crash_is_swept(
    settings: Settings, storage: Storage, repos: Repositories, queue: FanoutQueue
) -> None:
    author, reader, [post] = await _pair(repos)
    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as held,
        running_worker(_quick_sweeps(settings)),
    ):
        deleting = queue.send(PostDeleted(author=author, post_id=post.post_id))
        await _late_copy(storage, held, post, "delete", deleting)
        assert await _ids(repos, reader) == [post.post_id]

        async def swept() -> bool:
            return await _ids(repos, reader) == [] and await _ids(repos, author) == []

        await eventually(swept, timeout_s=30, what="the delete's second pass")
    assert await repos.posts.get(author, post.post_id) is None


async def test_copy_landing_after_unfollow_and_crash_is_swept(
    settings: Settings, storage: Storage, repos: Repositories, queue: FanoutQueue
) -> None:
    author, reader, [post] = await _pair(repos)

    async def unfollowing() -> None:
        await queue.send(Unfollowed(follower=reader, subject=author, requested=now_ticks()))
        await _unfollow(repos, reader, author)

    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as held,
        running_worker(_quick_sweeps(settings)),
    ):
        await _late_copy(storage, held, post, "unfollow", unfollowing())
        assert await _ids(repos, reader) == [post.post_id]

        async def swept() -> bool:
            return await _ids(repos, reader) == []

        await eventually(swept, timeout_s=30, what="the unfollow's second pass")
    assert await _ids(repos, author) == [post.post_id]


# --- continuations (tests/worker/test_worker_loop.py::test_huge_fan_out_is_split_...)


# --- storage trouble is not a failure


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
        author, reader, [post] = await _pair(repos)
        await queue.send(PostCreated(author=author, post_id=post.post_id))
        deferred = _count("post", "defer")

        async def deferred_often() -> bool:
            return _count("post", "defer") >= deferred + 4

        with monkeypatch.context() as patched:
            patched.setattr(worker_module, "Storage", _TablesDown)
            async with running_worker(settings):  # every table call fails: an outage
                await eventually(deferred_often, timeout_s=60, what="four leases lost to storage")
        assert (await queue.depth())[1] == 0, "storage trouble poisoned a message"
        async with running_worker(settings):

            async def delivered() -> bool:
                return await _ids(repos, reader) == [post.post_id]

            await eventually(delivered, timeout_s=30, what="delivery once storage is back")
        assert (await queue.depth())[1] == 0


# --- ghosts


class _SendThenFail(FanoutQueue):
    """A send that reached the queue (and was even processed) but whose answer was lost."""

    def __init__(self, storage: Storage, processor: FanoutProcessor) -> None:
        super().__init__(storage)
        self._processor = processor

    async def send(self, message: FanoutMessage) -> None:
        await super().send(message)
        await self._processor.handle(message)
        raise StorageUnavailableError("injected: the answer to the send was lost", retry_after=1)


class _CrashOnSend(FanoutQueue):
    async def send(self, message: FanoutMessage) -> None:
        raise RuntimeError("injected: the API process died here")


async def _no_ghost(repos: Repositories, author: str, reader: str) -> None:
    """A post either exists and is delivered, or is nowhere; counted exactly."""
    posts = [post.post_id for post in (await repos.posts.page(author, 100, None)).items]
    assert await _ids(repos, reader) == posts
    user = await repos.users.get(author)
    assert user is not None
    assert user.posts == len(posts)


async def test_lost_send_answer_leaves_no_ghost(private_azurite: Azurite, tmp_path: Path) -> None:
    settings = make_settings(private_azurite.connection_string, tmp_path)
    async with opened(settings) as storage, PartitionWriter(storage, TIMELINES) as writer:
        repos = Repositories.on(storage)
        author, reader = unique("author"), unique("reader")
        await _users(repos, author, reader)
        await _follow(repos, reader, author)
        processor = FanoutProcessor.on(storage, writer, timing=settings.fanout_timing())
        service = _service(storage, _SendThenFail(storage, processor))
        with pytest.raises(StorageUnavailableError):
            await service.posts.create(author, author, "lost")
        async with running_worker(settings):
            await eventually(lambda: _queue_drained(storage), timeout_s=30, what="the queue")
        await _no_ghost(repos, author, reader)


async def test_crash_at_send_leaves_no_ghost(private_azurite: Azurite, tmp_path: Path) -> None:
    settings = make_settings(private_azurite.connection_string, tmp_path)
    async with opened(settings) as storage:
        repos = Repositories.on(storage)
        author, reader = unique("author"), unique("reader")
        await _users(repos, author, reader)
        await _follow(repos, reader, author)
        with pytest.raises(RuntimeError):
            await _service(storage, _CrashOnSend(storage)).posts.create(author, author, "x")
        async with running_worker(settings):
            await eventually(lambda: _queue_drained(storage), timeout_s=30, what="the queue")
        await _no_ghost(repos, author, reader)


async def _queue_drained(storage: Storage) -> bool:
    return (await FanoutQueue(storage).depth()) == (0, 0)


async def test_retried_post_with_idempotency_key_publishes_once(client: Client) -> None:
    api = Api(client)
    author = unique("author")
    token = await api.register(author)
    headers = {**bearer(token), "Idempotency-Key": unique("key")}
    ids = []
    for _ in range(2):
        response = await client.post(
            f"/users/{author}/posts", json={"text": "once"}, headers=headers
        )
        assert response.status == 202, await response.text()
        ids.append((await response.json())["post_id"])
    assert ids[0] == ids[1]
    listed = await client.get(f"/users/{author}/posts")
    assert [item["post_id"] for item in (await listed.json())["items"]] == ids[:1]
    assert (await api.profile(author))["posts"] == 1


async def test_register_retried_with_its_key_gets_a_token(client: Client) -> None:
    user, key = unique(), unique("key")
    for _ in range(2):
        response = await client.post(
            "/users", json={"user_id": user}, headers={"Idempotency-Key": key}
        )
        assert response.status == 201, await response.text()
    other = await client.post("/users", json={"user_id": user}, headers={"Idempotency-Key": "x"})
    assert other.status == 409


# --- a purge never wipes a re-follow's backfill


async def test_purge_keeps_a_refollows_backfill(
    settings: Settings, storage: Storage, repos: Repositories
) -> None:
    author, reader, posts = await _pair(repos, 3)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        prompt = FanoutProcessor.on(storage, writer)
        await prompt.backfill(Followed(follower=reader, subject=author))
        await _unfollow(repos, reader, author)
        async with (
            FaultyStorage(settings.connection_string()) as faulty,
            PartitionWriter(faulty, TIMELINES, linger_s=0) as held_writer,
        ):
            faulty.held_tables.add(TIMELINES)
            purging = asyncio.create_task(FanoutProcessor.on(faulty, held_writer).purge(
                reader, author
            ))  # fmt: skip
            await asyncio.wait_for(faulty.held.wait(), 10)  # read the rows, about to delete
            await _follow(repos, reader, author)
            backfilled = await prompt.backfill(Followed(follower=reader, subject=author))
            faulty.gate.set()
            await purging
        if isinstance(backfilled, Continue):  # damped (a re-follow): its second pass
            await prompt.handle(backfilled.message)
    assert sorted(await _ids(repos, reader)) == sorted(post.post_id for post in posts)


# --- one truth for a follow, exact counters


@pytest.mark.parametrize("failing", [SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING])
async def test_follow_half_written_then_retried_is_whole_and_counted(
    settings: Settings, repos: Repositories, failing: str
) -> None:
    follower, subject = unique("f"), unique("s")
    await _users(repos, follower, subject)
    async with FaultyStorage(settings.connection_string()) as faulty:
        service = _service(faulty)
        faulty.fail_writes[failing] = 1
        with pytest.raises(StorageUnavailableError):
            await service.follows.follow(follower, follower, subject)
        await service.follows.follow(follower, follower, subject)
        await _assert_follow(repos, follower, subject, following=True)
        faulty.fail_writes[failing] = 1
        with pytest.raises(StorageUnavailableError):
            await service.follows.unfollow(follower, follower, subject)
        await service.follows.unfollow(follower, follower, subject)
        await _assert_follow(repos, follower, subject, following=False)


async def _assert_follow(
    repos: Repositories, follower: str, subject: str, *, following: bool
) -> None:
    followers = [
        edge.user_id for edge in (await repos.follows.followers_page(subject, 10, None)).items
    ]
    followed = [
        edge.user_id for edge in (await repos.follows.following_page(follower, 10, None)).items
    ]
    assert followers == ([follower] if following else [])
    assert followed == ([subject] if following else [])
    assert await repos.follows.is_following(follower, subject) is following
    follower_user, subject_user = await repos.users.get(follower), await repos.users.get(subject)
    assert follower_user is not None
    assert subject_user is not None
    assert (follower_user.following, subject_user.followers) == (int(following), int(following))


# --- no message without a change; every write is rate limited


async def test_repeated_follow_and_unfollow_queue_one_message_each(client: Client) -> None:
    api = Api(client)
    follower, subject = unique("f"), unique("s")
    token = await api.register(follower)
    await api.register(subject)
    follows, unfollows = _sent("follow"), _sent("unfollow")
    for _ in range(3):
        await api.follow(follower, token, subject)
    for _ in range(3):
        await api.unfollow(follower, token, subject)
    never = await client.delete(
        f"/users/{follower}/following/{unique('never-registered')}", headers=bearer(token)
    )
    assert never.status == 404
    assert (_sent("follow") - follows, _sent("unfollow") - unfollows) == (1, 1)


async def test_every_write_is_rate_limited(settings: Settings) -> None:
    limited = make_settings(
        settings.connection_string(), settings.data_dir, writes_per_minute=2,
        registrations_per_minute=3,
    )  # fmt: skip
    async with api_client(limited) as client:
        api = Api(client)
        user, other, third = unique(), unique(), unique()
        token = await api.register(user)
        await api.register(other)
        await api.register(third)
        refused = await client.post("/users", json={"user_id": unique()})
        assert refused.status == 429
        assert "Retry-After" in refused.headers
        await api.follow(user, token, other)
        await api.unfollow(user, token, other)
        for response in (
            await client.put(f"/users/{user}/following/{third}", headers=bearer(token)),
            await client.delete(f"/users/{user}/following/{third}", headers=bearer(token)),
        ):
            assert response.status == 429
            assert (await response.json())["error"]["code"] == "rate_limited"


# --- the smaller ones


async def test_work_messages_never_expire(private_azurite: Azurite, tmp_path: Path) -> None:
    settings = make_settings(private_azurite.connection_string, tmp_path)
    async with opened(settings) as storage:
        queue = FanoutQueue(storage)
        await queue.send(PostDeleted(author="a", post_id="0" * 26))
        [message] = await queue.peek_work()
        assert message.expires_on is not None
        assert message.expires_on.year == 9999


async def test_backfill_reads_through_short_pages(
    settings: Settings, storage: Storage, repos: Repositories
) -> None:
    author, reader, posts = await _pair(repos, 20)
    async with (
        FaultyStorage(settings.connection_string()) as faulty,
        PartitionWriter(faulty, TIMELINES, linger_s=0) as writer,
    ):
        faulty.page_limit = 7  # as real Azure may: short pages with a continuation
        await FanoutProcessor.on(faulty, writer).backfill(Followed(follower=reader, subject=author))
    assert sorted(await _ids(repos, reader)) == sorted(post.post_id for post in posts)


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


async def test_idempotency_key_of_a_deleted_post_is_409(client: Client) -> None:
    api = Api(client)
    author = unique("author")
    token = await api.register(author)
    headers = {**bearer(token), "Idempotency-Key": unique("key")}
    url = f"/users/{author}/posts"
    first = await (await client.post(url, json={"text": "gone"}, headers=headers)).json()
    deleted = await client.delete(f"{url}/{first['post_id']}", headers=bearer(token))
    assert deleted.status == 204
    again = await client.post(url, json={"text": "gone"}, headers=headers)
    assert again.status == 409
    assert (await again.json())["error"]["code"] == "idempotency_key_reused"


async def test_a_voided_post_id_is_not_a_surviving_post(repos: Repositories) -> None:
    """A late message for a deleted post may claim its id as void; the claim is no post."""
    author = unique("author")
    [post] = await _posts(repos, author, 1)
    assert await repos.posts.delete(author, post.post_id)
    assert await repos.posts.void(author, post.post_id)
    assert await repos.posts.surviving(author, [post]) == set()
    assert await repos.posts.get(author, post.post_id) is None
    assert (await repos.posts.page(author, 10, None)).items == []


# --- a backfill that waited for the writer reads the follow again


async def test_a_backfill_held_by_admission_reads_the_follow_again(storage: Storage) -> None:
    """The follow that justifies a backfill's copies is read inside their write deadline:
    one read before a long wait for the writer's backlog must not send copies of an author
    unfollowed meanwhile (a crash after such writes would leave them to unfollow passes that
    may already have run)."""
    repos = Repositories.on(storage)
    author, reader, _ = await _pair(repos, posts=3)
    async with PartitionWriter(storage, TIMELINES) as writer:
        processor = FanoutProcessor(repos, writer)
        backlog = writer.admission(0.001, 10**9)  # hold the writer's admission closed
        await backlog.__aenter__()
        requests_before = writer.requests
        backfill = asyncio.create_task(
            processor.backfill(Followed(follower=reader, subject=author))
        )

        async def waiting() -> bool:
            return writer.admission_waiters > 0

        await eventually(waiting, what="the backfill to wait for admission")
        await _unfollow(repos, reader, author)
        await backlog.__aexit__(None, None, None)
        assert await backfill == DONE
        assert writer.requests == requests_before, "copies sent on a follow read before the wait"
    assert await _ids(repos, reader) == []
