"""Inactive readers: no copies while dormant, a complete first page on return, and a wake
that fills the partition and ends the dormancy, whatever happens around and inside it.

Every step runs on real storage; the sweep's judgement is driven with a ``now`` past the
reader's due time instead of waiting for it."""

from __future__ import annotations

from dataclasses import dataclass

from tests.conftest import unique
from tests.delivery.helpers import add_follow, add_posts, add_users, remove_follow, run_every_pass
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.dormancy import Dormancy
from timeline.delivery.outcomes import Continue
from timeline.delivery.processor import FanoutProcessor
from timeline.metrics import INACTIVE_SKIPPED
from timeline.model.entities import Post
from timeline.model.messages import PostCreated, PostDeleted, Unfollowed, Wake
from timeline.reads.activity import Attendance
from timeline.reads.home import HomeTimeline, Position
from timeline.storage.accounts import Storage
from timeline.storage.names import SUBJECT_FOLLOWERS, TIMELINES
from timeline.storage.queue import FanoutQueue
from timeline.tables.activity import MARKER_ROW, STAMP_ROW, STATE, WAKING, Inactivity
from timeline.tables.follows import INACTIVE
from timeline.tables.repositories import Repositories
from timeline.tables.rows import get_entity

INACTIVITY = Inactivity.days(0.0005)
"""43.2 s: the sweep is driven with ``LATER`` instead of waiting."""
LATER = 10**10


@dataclass
class World:
    storage: Storage
    repos: Repositories
    processor: FanoutProcessor
    home: HomeTimeline
    dormancy: Dormancy
    reader: str
    authors: list[str]

    async def post(self, author: str, count: int = 1) -> list[Post]:
        posts = await add_posts(self.repos, author, count)
        for post in posts:
            await run_every_pass(self.processor, PostCreated(author=author, post_id=post.post_id))
        return posts

    async def pages(self, limit: int = 250) -> list[str]:
        """Every page of the reader's home timeline, from the first."""
        ids: list[str] = []
        position: Position | None = Position()
        while position is not None:
            posts, position = await self.home.page(self.reader, limit, position)
            ids += [post.post_id for post in posts]
        return ids

    async def truth(self) -> list[str]:
        """Every live post of every author the reader follows now, and its own, newest first."""
        following = await self.repos.follows.following_page(self.reader, 1000, None)
        assert following.continuation is None
        posts = [
            post
            for author in {self.reader, *(edge.user_id for edge in following.items)}
            for post in await self.repos.posts.newest(author, 1000)
        ]
        return [post.post_id for post in sorted(posts, key=lambda post: post.row_key)]

    async def partition(self) -> list[str]:
        return [p.post_id for p in (await self.repos.timelines.page(self.reader, 1000, None)).items]

    async def marker_state(self) -> str | None:
        row = await get_entity(self.storage, TIMELINES, self.reader, MARKER_ROW)
        return None if row is None else str(row[STATE])

    async def flagged(self) -> list[str]:
        flagged = []
        for author in self.authors:
            row = await get_entity(self.storage, SUBJECT_FOLLOWERS, author, self.reader)
            if row is not None and row.get(INACTIVE):
                flagged.append(author)
        return flagged

    async def wake_message(self) -> Wake:
        head = await self.repos.activity.head(self.reader)
        return Wake(reader=self.reader, generation=head.generation)


async def world(
    storage: Storage, writer: PartitionWriter, authors: int = 3, inactivity: Inactivity = INACTIVITY
) -> World:
    repos = Repositories.on(storage)
    reader, names = unique("reader"), [unique("author") for _ in range(authors)]
    await add_users(repos, reader, *names)
    for author in names:
        await add_follow(repos, reader, author)
    attendance = Attendance(repos.activity, FanoutQueue(storage), inactivity, resend_after_s=600)
    home = HomeTimeline(storage, max_merged=20, attendance=attendance)
    processor = FanoutProcessor(repos, writer, inactivity=inactivity)
    dormancy = Dormancy(storage, inactivity, flag_window_s=60)
    return World(storage, repos, processor, home, dormancy, reader, names)


async def gone_dormant(w: World) -> None:
    """The reader read once (stamped), then the sweep found it inactive."""
    await w.pages()
    assert await w.dormancy.check(w.reader, LATER)
    assert await w.marker_state() == "dormant"
    assert await w.flagged() == w.authors


async def test_a_dormant_reader_gets_no_copies_and_its_first_page_is_complete(
    storage: Storage,
) -> None:
    """Posts made while the reader is dormant skip it (counted); its first read on return
    serves every followed author's newest posts at once, and queues the wake, which fills
    the partition, unmarks the follows and removes the marker."""
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w = await world(storage, writer)
        for author in w.authors:
            await w.post(author, 2)
        await gone_dormant(w)
        skipped = INACTIVE_SKIPPED._value.get()
        made = [post for author in w.authors for post in await w.post(author, 3)]
        assert INACTIVE_SKIPPED._value.get() - skipped == len(made)
        assert not {post.post_id for post in made} & set(await w.partition())

        first, _ = await w.home.page(w.reader, 250, Position())
        assert [post.post_id for post in first] == await w.truth(), "first page incomplete"
        assert await w.marker_state() == WAKING, "the first read queues the wake"
        for limit in (1, 4):
            assert await w.pages(limit) == await w.truth(), limit

        await run_every_pass(w.processor, await w.wake_message())
        assert await w.marker_state() is None
        assert await w.flagged() == []
        assert await w.partition() == await w.truth()
        skipped = INACTIVE_SKIPPED._value.get()
        await w.post(w.authors[0])
        assert INACTIVE_SKIPPED._value.get() == skipped
        assert await w.pages() == await w.partition() == await w.truth()


async def test_deletes_and_unfollows_show_at_once_while_dormant_and_after_the_wake(
    storage: Storage,
) -> None:
    """A delete and an unfollow during dormancy show on the dormant pages at once; after the
    wake the partition holds neither."""
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w = await world(storage, writer)
        kept = await w.post(w.authors[0], 2)
        dropped_author_posts = await w.post(w.authors[1], 2)
        await gone_dormant(w)
        await w.post(w.authors[0], 2)

        await w.repos.posts.delete(w.authors[0], kept[0].post_id)
        await remove_follow(w.repos, w.reader, w.authors[1])
        assert kept[0].post_id not in await w.pages()
        assert not {p.post_id for p in dropped_author_posts} & set(await w.pages())
        assert await w.pages() == await w.truth()

        delete = PostDeleted(author=w.authors[0], post_id=kept[0].post_id)
        await run_every_pass(w.processor, delete)
        await w.processor.handle(Unfollowed(follower=w.reader, subject=w.authors[1]))  # purges
        await run_every_pass(w.processor, await w.wake_message())
        assert await w.partition() == await w.truth() == await w.pages()


async def test_a_wake_cut_short_and_a_late_sweep_mark_end_right(storage: Storage) -> None:
    """The wake's first pass alone leaves the marker (pages stay complete); a sweep that
    read the marker before the wake and marks a follow late is undone by the second pass;
    a sweep that reads ``waking`` marks nothing; a replayed wake changes nothing."""
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w = await world(storage, writer)
        for author in w.authors:
            await w.post(author)
        await gone_dormant(w)
        generation = (await w.wake_message()).generation
        await w.pages()  # the read that queues the wake (marker: waking)
        stale = await w.repos.activity.follow_row(w.authors[2], w.reader)  # a sweep's read
        assert stale is not None

        outcome = await w.processor.handle(await w.wake_message())
        assert isinstance(outcome, Continue)
        assert outcome.delay_s > 0
        assert await w.marker_state() == WAKING
        assert await w.pages() == await w.truth()

        assert await w.dormancy.check(w.reader, LATER)  # reads "waking": marks nothing
        assert await w.flagged() == []
        late_mark = w.repos.activity.flag(  # a late mark on a read from before the wake
            w.authors[2], w.reader, stale, generation, 0.0, not_after=float("inf")
        )
        assert not await late_mark, "a mark landed after the wake's unmark"
        late = await w.post(w.authors[2])
        assert late[0].post_id in await w.partition()
        assert late[0].post_id in await w.pages()

        await run_every_pass(w.processor, outcome.message)  # the delayed second pass
        assert await w.flagged() == []
        assert await w.marker_state() is None
        assert await w.partition() == await w.truth()
        await run_every_pass(w.processor, outcome.message)  # replayed: nothing to do
        assert await w.partition() == await w.truth()


async def test_activity_costs_one_stamp_write_per_period(storage: Storage) -> None:
    """Many reads in one period leave the stamp row unwritten after the first; a sweep that
    finds the stamp recent re-files the check instead of starting dormancy.

    The period is a day here (this module's is 5.4 s, which a busy machine's twenty reads can
    straddle); a run that still straddles a boundary is run again."""
    daily = Inactivity.days(8)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        for _ in range(2):
            w = await world(storage, writer, authors=1, inactivity=daily)
            period = daily.stamp()
            await w.pages()
            stamp = await get_entity(storage, TIMELINES, w.reader, STAMP_ROW)
            assert stamp is not None
            for _ in range(20):
                await w.pages()
                await w.home.touch(w.reader)
            again = await get_entity(storage, TIMELINES, w.reader, STAMP_ROW)
            assert again is not None
            etags = stamp.metadata["etag"], again.metadata["etag"]
            if daily.stamp() == period:
                break
        assert etags[1] == etags[0]
        assert await w.dormancy.check(w.reader, now=0.0)
        assert await w.marker_state() is None


async def test_a_stamp_written_after_the_sweep_read_it_wins(storage: Storage) -> None:
    """The marker is written on the condition that the stamp is unchanged since the sweep
    read it: a read that stamped in between keeps the reader active."""
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w = await world(storage, writer, authors=1)
        await w.pages()
        head = await w.repos.activity.head(w.reader)
        assert head.stamp is not None
        await w.repos.activity.stamp(w.reader, head.stamp + 1, INACTIVITY, first=False)
        assert not await w.repos.activity.start_dormancy(w.reader, head)
        assert await w.marker_state() is None


async def test_zero_turns_it_off(storage: Storage) -> None:
    """``TIMELINE_INACTIVE_DAYS=0``: reads write no stamp and the sweep starts nothing."""
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w = await world(storage, writer, authors=1)
        off = Inactivity(0)
        w.home = HomeTimeline(
            storage,
            max_merged=20,
            attendance=Attendance(w.repos.activity, FanoutQueue(storage), off, resend_after_s=1),
        )
        await w.pages()
        assert await get_entity(storage, TIMELINES, w.reader, STAMP_ROW) is None
        assert await Dormancy(storage, off, flag_window_s=60).check(w.reader, LATER)
        assert await w.marker_state() is None


async def test_a_post_made_before_dormancy_but_fanned_out_after_reaches_the_reader(
    storage: Storage,
) -> None:
    """A post's fan-out delayed past the start of dormancy (a backlog, a redelivery after a
    crash) is not skipped: marks skip only posts made from the dormancy's start, the posts
    the wake copies back, so an older post would be lost for good."""
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w = await world(storage, writer, authors=1)
        author = w.authors[0]
        (early,) = await add_posts(w.repos, author, 1)  # made now, its message still queued
        await gone_dormant(w)
        skipped = INACTIVE_SKIPPED._value.get()
        await run_every_pass(w.processor, PostCreated(author=author, post_id=early.post_id))
        assert INACTIVE_SKIPPED._value.get() == skipped
        assert early.post_id in await w.partition()
        (late,) = await w.post(author)
        assert INACTIVE_SKIPPED._value.get() == skipped + 1
        assert late.post_id not in await w.partition()
        await w.pages()  # the reader is back
        await run_every_pass(w.processor, await w.wake_message())
        assert await w.pages() == await w.partition() == await w.truth()
