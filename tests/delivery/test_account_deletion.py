"""An account's deletion on storage of its own, every message handled by the test (second
passes at once): its posts, reposts, follows both ways, lists, list memberships and blocks
go; every other user's counts are right; and no row anywhere holds the account's id but its
tombstone. A follow that lands after the sweep ends by itself."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from azure.data.tables.aio import TableClient

from tests.delivery.helpers import Recorder, timeline_ids, unlimited_service
from tests.delivery.hybrid_helpers import TIMING, new_users
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.outcomes import Continue
from timeline.delivery.processor import FanoutProcessor
from timeline.model.keys import list_reader
from timeline.model.messages import AccountDeleted, FanoutMessage, Followed
from timeline.service.operations import TimelineService
from timeline.storage.accounts import Storage
from timeline.storage.names import EXPIRIES, TABLES, TIMELINES
from timeline.tables.credentials import IDENTITY_ROW_KEY
from timeline.tables.repositories import Repositories


@dataclass
class World:
    storage: Storage
    repos: Repositories
    service: TimelineService
    processor: FanoutProcessor
    recorder: Recorder

    async def drain(
        self, hold: Callable[[FanoutMessage], bool] = lambda _: False
    ) -> list[FanoutMessage]:
        """Run every message sent so far, and every one they lead to, to the end; those
        ``hold`` picks are put aside instead (they come later: a delay, a backlog, a loss)
        and returned."""
        work: list[FanoutMessage] = list(self.recorder.sent)
        self.recorder.sent.clear()
        held: list[FanoutMessage] = []
        while work:
            message = work.pop(0)
            if hold(message):
                held.append(message)
                continue
            outcome = await self.processor.handle(message)
            if isinstance(outcome, Continue):
                work.append(outcome.message)
            work.extend(self.recorder.sent)
            self.recorder.sent.clear()
        return held


@asynccontextmanager
async def world(storage: Storage) -> AsyncIterator[World]:
    recorder = Recorder(storage, forward=False)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        processor = FanoutProcessor.on(storage, writer, timing=TIMING, queue=recorder)
        yield World(
            storage, Repositories.on(storage), unlimited_service(storage, recorder), processor,
            recorder,
        )  # fmt: skip


async def rows_holding(storage: Storage, user: str) -> list[tuple[str, str, str]]:
    """Every row of every table (this storage is the test's own) with ``user`` in a key or a
    text field, as ``(table, PartitionKey, RowKey)``; the expiries index is left out (its
    rows name rows that end by themselves when due, and the sweep drops them then)."""
    found = []
    for table in TABLES:
        if table == EXPIRIES:
            continue
        client: TableClient = storage.reader(table, user)
        async for row in client.list_entities():
            texts = [str(value) for value in row.values() if isinstance(value, str)]
            if any(user in text for text in texts):
                found.append((table, str(row["PartitionKey"]), str(row["RowKey"])))
    return found


async def test_everything_of_a_deleted_account_goes_and_only_its_tombstone_stays(
    own: Storage,
) -> None:
    async with world(own) as w:
        gone, fan, reader, friend, reposter, owner, blocker, blocked, muter = await new_users(
            w.repos, "gone", "fan", "reader", "friend", "rep", "owner", "blocker", "blocked", "m"
        )
        s = w.service
        for follower in (fan, reader):
            await s.follows.follow(follower, follower, gone)
        await s.follows.follow(gone, gone, friend)
        await s.follows.follow(fan, fan, reposter)
        await s.follows.follow(reader, reader, friend)
        first = await s.posts.create(gone, gone, "first")
        second = await s.posts.create(gone, gone, "second")
        theirs = await s.posts.create(friend, friend, "theirs")
        await w.drain()
        await s.posts.create(gone, gone, "a reply", reply_to=(friend, theirs.post_id))
        await s.reposts.repost(gone, gone, friend, theirs.post_id)
        await s.reposts.repost(reposter, reposter, gone, first.post_id)
        mine = (await s.lists.create(gone, gone, "mine", False))["list_id"]
        await s.lists.add_member(gone, gone, mine, friend)
        theirs_list = (await s.lists.create(owner, owner, "theirs", False))["list_id"]
        await s.lists.add_member(owner, owner, theirs_list, gone)
        await s.relations.block(blocker, blocker, gone)
        await s.relations.block(gone, gone, blocked)
        await s.relations.mute(muter, muter, gone, None, True)
        await s.relations.mute(gone, gone, muter, datetime.now(UTC) + timedelta(hours=1), False)
        await w.drain()
        assert first.post_id in await timeline_ids(w.repos, fan)
        assert second.post_id in await timeline_ids(w.repos, list_reader(owner, theirs_list))
        friend_followers = await w.repos.follows.follower_count(friend)

        await s.accounts.delete(gone, gone)
        assert await w.repos.users.deletions() == [gone]
        await w.drain()

        for timeline in (fan, reader, friend, reposter, list_reader(owner, theirs_list)):
            posts = (await w.repos.timelines.page(timeline, 1000, None)).items
            assert [p.post_id for p in posts if gone in (p.author, p.reposted_by)] == []
        assert await timeline_ids(w.repos, friend) == [theirs.post_id]
        assert await w.repos.follows.follower_count(friend) == friend_followers - 1
        for follower in (fan, reader):  # the other one each follows is left
            assert await w.repos.follows.following_count(follower) == 1
        assert await w.repos.follows.following_count(list_reader(owner, theirs_list)) == 0
        assert not await w.repos.relations.blocks(blocker, gone)
        assert await w.repos.relations.mute_of(muter, gone) is None
        assert await w.repos.users.get(gone) is None
        assert await w.repos.users.deletions() == []
        assert await rows_holding(own, gone) == [("users", gone, IDENTITY_ROW_KEY)]


async def test_a_follow_that_lands_after_the_sweep_ends_by_itself(own: Storage) -> None:
    """A follow accepted just before the tombstone, whose message runs after the account's
    partitions are dropped: it ends the pair and recreates nothing."""
    async with world(own) as w:
        gone, late = await new_users(w.repos, "gone", "late")
        post = await w.service.posts.create(gone, gone, "hello")
        await w.drain()
        await w.service.accounts.delete(gone, gone)
        await w.drain()
        await w.repos.follows.add(late, gone, datetime.now(UTC))  # a late request's writes
        await w.repos.follows.sync_index(late, gone)
        await w.processor.handle(Followed(follower=late, subject=gone))
        w.recorder.sent.append(Followed(follower=late, subject=gone, confirm=True))
        await w.drain()
        assert post.post_id not in await timeline_ids(w.repos, late)
        assert await w.repos.follows.following_count(late) == 0
        leftovers = await rows_holding(own, gone)
        assert ("users", gone, IDENTITY_ROW_KEY) in leftovers
        assert await rows_holding(own, gone) == [("users", gone, IDENTITY_ROW_KEY)], leftovers


async def test_a_message_for_an_account_never_deleted_does_nothing(own: Storage) -> None:
    async with world(own) as w:
        (alive,) = await new_users(w.repos, "alive")
        post = await w.service.posts.create(alive, alive, "still here")
        await w.drain()
        await w.processor.handle(AccountDeleted(user=alive))
        assert await w.repos.posts.get(alive, post.post_id) is not None
        assert await w.repos.users.get(alive) is not None


async def test_follow_requests_either_way_leave_nothing(own: Storage) -> None:
    """A pending request by the account (in a locked user's partition) and one to it (the
    requester's index row naming it): both are found from the account's side and go."""
    async with world(own) as w:
        gone, locked, asker = await new_users(w.repos, "gone", "locked", "asker")
        s = w.service
        for user in (locked, gone):
            await s.accounts.edit(user, user, display_name=None, locked=True)
        assert not await s.follows.follow(gone, gone, locked)
        assert not await s.follows.follow(asker, asker, gone)
        await w.drain()
        await s.accounts.delete(gone, gone)
        await w.drain()
        assert await w.repos.follows.request_of(gone, locked) is None
        assert (await w.repos.follows.requests_page(locked, 10, None)).items == []
        assert await w.repos.follows.following_count(asker) == 0
        assert await rows_holding(own, gone) == [("users", gone, IDENTITY_ROW_KEY)]
