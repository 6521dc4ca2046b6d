"""Hybrid fan-out interleavings forced on real storage, each of which broke an invariant
before its fix."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

from tests.conftest import eventually, unique
from tests.delivery.test_delivery_guarantees import _follow, _unfollow
from timeline.delivery.outcomes import Continue, Defer, Outcome
from timeline.delivery.processor import FanoutProcessor
from timeline.delivery.settings import Hybrid, Timing
from timeline.model.entities import Post, User
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.messages import Followed, PostCreated, PostDeleted, Regrade, Unfollowed
from timeline.reads.home import HomeTimeline, Position
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.storage.writer import PartitionWriter
from timeline.tables.audience import COPIED, MERGED
from timeline.tables.repositories import Repositories

THRESHOLD = 4
HYBRID = Hybrid(threshold=THRESHOLD, max_merged=2, queue=None)
TIMING = Timing(write_deadline_s=1.0, sweep_delay_s=2.0, arrival_window_s=0.5)


async def _users(repos: Repositories, *prefixes: str) -> list[str]:
    users = [unique(prefix) for prefix in prefixes]
    for user in users:
        await repos.users.create(User(user, user, created_at=datetime.now(UTC)))
    return users


async def _run(processor: FanoutProcessor, message) -> None:  # type: ignore[no-untyped-def]
    """Handle a message and its continuations to the end, without the delays."""
    while True:
        outcome = await processor.handle(message)
        if isinstance(outcome, Continue):
            message = outcome.message
        elif isinstance(outcome, Defer):
            await asyncio.sleep(0.2)
        else:
            return


async def _post(repos: Repositories, author: str, ticks: int | None = None) -> Post:
    post = Post(new_post_id(ticks if ticks is not None else now_ticks()), author, "x")
    await repos.posts.add(post)
    return post


async def _home(storage: Storage, reader: str, limit: int = 250) -> list[list[str]]:
    home = HomeTimeline(storage, max_merged=HYBRID.max_merged)
    pages: list[list[str]] = []
    position: Position | None = Position()
    while position is not None:
        posts, position = await home.page(reader, limit, position)
        pages.append([post.post_id for post in posts])
    return pages


async def _sees_next_post(
    storage: Storage, processor: FanoutProcessor, author: str, fan: str
) -> None:
    """The author posts; the fan, who follows it, must see the post on its pages."""
    repos = Repositories.on(storage)
    post = await _post(repos, author)
    await _run(processor, PostCreated(author=author, post_id=post.post_id))
    assert await repos.follows.is_following(fan, author)
    merge_rows = await repos.audience.merged_authors(fan)
    overflow = await repos.audience.copy_etag(author, fan)
    shown = [p for page in await _home(storage, fan) for p in page]
    assert post.post_id in shown, (
        f"merged author's new post missing for a follower; merge rows={merge_rows} "
        f"overflow={overflow}"
    )


async def _finish_down_then_up(
    storage: Storage, processor: FanoutProcessor, down: Regrade, others: list[str], fan: str
) -> None:
    """The redelivered move down runs to the end; the others follow again and the author
    moves up: the fan has a merge row again."""
    repos, author = Repositories.on(storage), down.author
    await _run(processor, down)
    assert (await repos.audience.mode(author)).state == COPIED
    for user in others:
        await _follow(repos, user, author)
    await _regrade(processor, author, merge=True)
    assert (await repos.audience.mode(author)).state == MERGED
    assert author in await repos.audience.merged_authors(fan)


async def _move_down_then_check_gone(
    storage: Storage,
    processor: FanoutProcessor,
    author: str,
    others: list[str],
    fan: str,
    deleted: str,
) -> None:
    """The other followers leave, the author moves down: the deleted post must not show."""
    repos = Repositories.on(storage)
    for user in others:
        await _unfollow(repos, user, author)
    await _regrade(processor, author, merge=False)
    assert (await repos.audience.mode(author)).state == COPIED
    assert await repos.posts.get(author, deleted) is None
    shown = [p for page in await _home(storage, fan) for p in page]
    assert deleted not in shown, "a deleted post is back in the follower's timeline"


def _processor(storage: Storage, writer: PartitionWriter) -> FanoutProcessor:
    return FanoutProcessor.on(storage, writer, hybrid=HYBRID, timing=TIMING)


async def _regrade(processor: FanoutProcessor, author: str, merge: bool) -> Regrade:
    message = Regrade(author=author, merge=merge, token=uuid.uuid4().hex)
    await _run(processor, message)
    return message


async def test_stale_down_move_page_drops_merge_row_of_a_new_up_move(
    storage: Storage, repos: Repositories
) -> None:
    """Worker 1 runs page 1 of a move down and stalls inside ``_unmerge`` (copying the
    newest posts); its lease expires, worker 2 finishes the move down; the author grows
    again and worker 2 moves it up (``merged``, every follower has a merge row). Worker 1
    then resumes and removes the follower's merge row unconditionally: a follower of a
    merged author with neither merge row nor overflow row, so new posts never reach it."""
    author, fan, *others = await _users(repos, "large", "fan", "g", "g", "g")
    for user in [fan, *others]:
        await _follow(repos, user, author)
    await _post(repos, author)
    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as held,
        PartitionWriter(storage, TIMELINES, linger_s=0) as prompt,
    ):
        w1, w2 = _processor(storage, held), _processor(storage, prompt)
        await _regrade(w2, author, merge=True)
        assert (await repos.audience.mode(author)).state == MERGED
        for user in others:
            await _unfollow(repos, user, author)  # 1 follower: below half the threshold
        down = Regrade(author=author, merge=False, token=uuid.uuid4().hex, fenced=True)
        stale = asyncio.ensure_future(w1.handle(down))

        async def buffered() -> bool:
            return held.buffered > 0

        await eventually(buffered, timeout_s=10, what="worker 1's copies to be buffered")
        await _finish_down_then_up(storage, w2, down, others, fan)
        while not stale.done():  # worker 1 resumes
            await held.flush()
            await asyncio.sleep(0.01)
        await stale
        await _sees_next_post(storage, w2, author, fan)


async def test_backfill_that_read_copied_copies_merged_era_post_then_delete_skips_it(
    storage: Storage, repos: Repositories
) -> None:
    """A follow's backfill reads the author ``copied`` (outside any write deadline: the mode
    read in ``_merge_for`` comes before ``admission``) and is slow; meanwhile the author is
    moved up (``merged``, since S) and posts P well after S. The backfill then copies the
    newest posts, P among them, into the follower's partition (hidden while merged). P's
    delete takes the ``_never_copied`` shortcut and sweeps only overflow readers, so the
    copy stays; when the author is moved back down, the deleted post shows again."""
    author, fan, *others = await _users(repos, "large", "fan", "g", "g", "g")
    for user in others:
        await _follow(repos, user, author)
    await _follow(repos, fan, author)
    await _post(repos, author)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w1, w2 = _processor(storage, writer), _processor(storage, writer)
        read, resume = asyncio.Event(), asyncio.Event()
        audience = w1._context.repos.audience
        real_mode = audience.mode

        async def slow_mode(subject: str):  # type: ignore[no-untyped-def]
            mode = await real_mode(subject)
            if not read.is_set():
                read.set()
                await resume.wait()
            return mode

        audience.mode = slow_mode  # type: ignore[method-assign,assignment]
        backfill = asyncio.ensure_future(
            w1.backfill(Followed(follower=fan, subject=author, requested=now_ticks()))
        )
        await asyncio.wait_for(read.wait(), 10)
        await _regrade(w2, author, merge=True)
        mode = await repos.audience.mode(author)
        assert mode.state == MERGED
        margin = round(TIMING.sweep_delay_s * 10_000_000)
        post = await _post(repos, author, mode.since + margin + 10_000)  # made well after
        await _run(w2, PostCreated(author=author, post_id=post.post_id))
        resume.set()
        await backfill
        shown = [p for page in await _home(storage, fan) for p in page]
        assert post.post_id in shown
        await _run(w2, PostDeleted(author=author, post_id=post.post_id))
        shown = [p for page in await _home(storage, fan) for p in page]
        assert post.post_id not in shown  # hidden: the fan merges the author
        await _move_down_then_check_gone(storage, w2, author, others, fan, post.post_id)


async def test_unfollow_refollow_race_turns_overflow_reader_into_merged_with_stale_copies(
    storage: Storage, repos: Repositories
) -> None:
    """An overflow reader R (copies of a merged author L's posts) unfollows L and follows
    it again. The Unfollowed handler reads R's overflow-row etag and sees R not following;
    then R's re-follow is handled (R has room now, so it gets a merge row and no copies);
    then the Unfollowed handler removes the overflow row (its etag is unchanged) and its
    purge, seeing R follow again, only reconciles. R now merges L but keeps copies of L's
    merged-era posts, which no later delete of L sweeps (``_never_copied``): they come back
    when L moves down."""
    author, fan, full1, full2, *others = await _users(
        repos, "large", "fan", "m", "m", "g", "g", "g"
    )
    for user in [fan, *others]:
        await _follow(repos, user, author)
    for other_large in (full1, full2):
        await _follow(repos, fan, other_large)
        assert await repos.audience.add_merge(fan, other_large, HYBRID.max_merged)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w1, w2 = _processor(storage, writer), _processor(storage, writer)
        await _regrade(w2, author, merge=True)
        mode = await repos.audience.mode(author)
        assert mode.state == MERGED
        assert await repos.audience.copy_etag(author, fan) is not None  # overflow reader
        margin = round(TIMING.sweep_delay_s * 10_000_000)
        post = await _post(repos, author, mode.since + margin + 10_000)  # made well after
        await _run(w2, PostCreated(author=author, post_id=post.post_id))
        # the fan unfollows one other large author: room for a merge row now
        await _unfollow(repos, fan, full1)
        assert await repos.audience.remove_merge(fan, full1)
        await _unfollow(repos, fan, author)

        follows = w1._context.repos.follows
        real = follows.is_following
        calls = 0

        async def racing_is_following(follower: str, subject: str) -> bool:
            nonlocal calls
            result = await real(follower, subject)
            calls += 1
            if calls == 2:  # inside unmerge_if_unfollowed, after the etags were read
                await _follow(repos, fan, author)
                await _run(w2, Followed(follower=fan, subject=author, requested=now_ticks()))
            return result

        follows.is_following = racing_is_following  # type: ignore[method-assign]
        await _run(w1, Unfollowed(follower=fan, subject=author, requested=now_ticks()))
        assert await repos.follows.is_following(fan, author)
        assert author in await repos.audience.merged_authors(fan)
        await _run(w2, PostDeleted(author=author, post_id=post.post_id))
        await _move_down_then_check_gone(storage, w2, author, others, fan, post.post_id)


async def test_an_unfollowed_merged_authors_copies_never_show(
    storage: Storage, repos: Repositories
) -> None:
    """Right after an unfollow of a merged author (before the worker removes the merge row
    and purges), the reader's partition still holds the author's copies from before it was
    merged: every page hides them, at any limit (pages may be short, even empty, with a
    continuation meanwhile, as the README says)."""
    author, small, reader = await _users(repos, "large", "small", "reader")
    await _follow(repos, reader, author)
    await _follow(repos, reader, small)
    base = now_ticks()
    old = await _post(repos, small, base - 10_000_000)
    copies = [await _post(repos, author, base - i * 1000) for i in range(8)]
    await repos.timelines.put_many(reader, [old, *copies])  # copied while the author was small
    assert await repos.audience.add_merge(reader, author, HYBRID.max_merged)  # merged since
    await _unfollow(repos, reader, author)  # the API's part; the worker has not run yet
    for limit in (1, 2, 250):
        pages = await _home(storage, reader, limit=limit)
        assert [p for page in pages for p in page] == [old.post_id], limit


async def test_merge_counter_drifts_below_the_rows_on_unfollow_refollow(
    storage: Storage, repos: Repositories
) -> None:
    """``add_merge`` sees the row present and upserts it without counting; a concurrent
    unfollow handler removes it (and uncounts) in between: the row is back, uncounted. The
    reader can then hold more than ``max_merged`` merge rows."""
    author, reader, extra1, extra2 = await _users(repos, "large", "reader", "x", "x")
    await _follow(repos, reader, author)
    assert await repos.audience.add_merge(reader, author, HYBRID.max_merged)
    await repos.audience.change_mode(author, await repos.audience.mode(author), MERGED)
    await _unfollow(repos, reader, author)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w1, w2 = _processor(storage, writer), _processor(storage, writer)
        head_read, resume = asyncio.Event(), asyncio.Event()
        real_head = w2._context.repos.audience._head

        async def slow_head(owner: str):  # type: ignore[no-untyped-def]
            head = await real_head(owner)
            if not head_read.is_set():
                head_read.set()
                await resume.wait()
            return head

        w2._context.repos.audience._head = slow_head  # type: ignore[method-assign,assignment]
        follows = w1._context.repos.follows
        real = follows.is_following
        calls = 0
        backfill: asyncio.Future[Outcome] | None = None

        async def racing_is_following(follower: str, subject: str) -> bool:
            nonlocal calls, backfill
            result = await real(follower, subject)
            calls += 1
            if calls == 2:  # inside unmerge_if_unfollowed, after the etags were read
                await _follow(repos, reader, author)
                backfill = asyncio.ensure_future(
                    w2.backfill(Followed(follower=reader, subject=author, requested=now_ticks()))
                )
                await asyncio.wait_for(head_read.wait(), 10)
            return result

        follows.is_following = racing_is_following  # type: ignore[method-assign]
        await w1.unfollowed(Unfollowed(follower=reader, subject=author, requested=now_ticks()))
        resume.set()
        assert backfill is not None
        await backfill
    assert author in await repos.audience.merged_authors(reader)
    for other in (extra1, extra2):
        await _follow(repos, reader, other)
        await repos.audience.add_merge(reader, other, HYBRID.max_merged)
    rows = await repos.audience.merged_authors(reader)
    count = await repos.audience.merge_count(reader)
    assert len(rows) <= HYBRID.max_merged, f"{len(rows)} merge rows, counter says {count}"


async def test_a_pre_hybrid_continuation_still_pages(storage: Storage, repos: Repositories) -> None:
    """A home timeline continuation minted before this change (a storage continuation
    plus ``n``) is claimed to keep working; check it with the emulator's own format."""
    from timeline.service.timelines import _home_position
    from timeline.storage.calls import query_page

    reader, small = await _users(repos, "reader", "small")
    posts = [await _post(repos, small, now_ticks() - i * 1000) for i in range(3)]
    await repos.timelines.put_many(reader, posts)
    page = await query_page(
        storage.reader(TIMELINES, reader),
        "PartitionKey eq @pk and RowKey lt @meta",
        {"pk": reader, "meta": "~"},
        select=["RowKey"],
        limit=1,
        continuation=None,
    )
    assert page.continuation is not None
    old_token = {**page.continuation, "n": "1"}
    position, served = _home_position(old_token)
    assert served == 1
    home = HomeTimeline(storage, max_merged=HYBRID.max_merged)
    rest: list[str] = []
    following: Position | None = position
    while following is not None:
        items, following = await home.page(reader, 1, following)
        rest.extend(item.post_id for item in items)
    newest_first = sorted(posts, key=lambda post: post.row_key)
    assert rest == [post.post_id for post in newest_first[1:]]


async def test_stale_down_page_that_stalls_before_its_etag_reads_drops_a_new_merge_row(
    storage: Storage, repos: Repositories
) -> None:
    """Like the stale page above, but worker 1 stalls
    after the page's mode check and before ``_unmerge`` reads the etags (here: in the
    follower page query; in production: any pause of the process that also stops the lease
    renewal). It then reads the etag of the *new* move up's merge row, ``copy_newest``
    copies nothing (merged, no overflow row), and the removal "only if unchanged since
    before its copies" succeeds."""
    author, fan, *others = await _users(repos, "large", "fan", "g", "g", "g")
    for user in [fan, *others]:
        await _follow(repos, user, author)
    await _post(repos, author)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w1, w2 = _processor(storage, writer), _processor(storage, writer)
        await _regrade(w2, author, merge=True)
        assert (await repos.audience.mode(author)).state == MERGED
        for user in others:
            await _unfollow(repos, user, author)
        first = await w2.handle(Regrade(author=author, merge=False, token=uuid.uuid4().hex))
        assert isinstance(first, Continue)
        down = first.message
        assert isinstance(down, Regrade)
        assert down.fenced  # shrinking, waiting out the fence

        reached, resume = asyncio.Event(), asyncio.Event()
        follows = w1._context.repos.follows
        real_page = follows.follower_ids_page

        async def slow_page(subject, limit, continuation):  # type: ignore[no-untyped-def]
            page = await real_page(subject, limit, continuation)
            reached.set()
            await resume.wait()
            return page

        follows.follower_ids_page = slow_page  # type: ignore[method-assign]
        stale = asyncio.ensure_future(w1.handle(down))
        await asyncio.wait_for(reached.wait(), 10)  # past the mode check, before _unmerge
        await _run(w2, down)  # the redelivered page, to the end
        assert (await repos.audience.mode(author)).state == COPIED
        for user in others:
            await _follow(repos, user, author)
        await _regrade(w2, author, merge=True)
        assert (await repos.audience.mode(author)).state == MERGED
        assert author in await repos.audience.merged_authors(fan)
        resume.set()
        await stale
        await _sees_next_post(storage, w2, author, fan)


async def test_a_stale_page_of_a_move_up_takes_its_rows_back(
    storage: Storage, repos: Repositories
) -> None:
    """Worker 1 runs a page of a move up and stalls while
    writing merge rows; worker 2 finishes the move, the author falls back and worker 2
    moves it down to ``copied``. Worker 1 then writes its merge row: it must take it back,
    or the reader keeps a merge row of an author that is not merged (a query and a merge
    slot spent for nothing)."""
    author, fan, *others = await _users(repos, "large", "fan", "g", "g", "g")
    for user in [fan, *others]:
        await _follow(repos, user, author)
    async with (
        PartitionWriter(storage, TIMELINES, linger_s=0) as first,
        PartitionWriter(storage, TIMELINES, linger_s=0) as second,
    ):
        w1, w2 = _processor(storage, first), _processor(storage, second)
        reached, resume = asyncio.Event(), asyncio.Event()
        audience = w1._context.repos.audience
        real_add = audience.add_merge

        async def slow_add(reader: str, subject: str, max_merged: int) -> bool:
            if reader == fan:
                reached.set()
                await resume.wait()
            return await real_add(reader, subject, max_merged)

        audience.add_merge = slow_add  # type: ignore[method-assign,assignment]
        up = Regrade(author=author, merge=True, token=uuid.uuid4().hex)
        stale = asyncio.ensure_future(w1.handle(up))
        await asyncio.wait_for(reached.wait(), 10)
        await _run(w2, up)  # the redelivered page, to the end
        assert (await repos.audience.mode(author)).state == MERGED
        for user in others:
            await _unfollow(repos, user, author)
        await _regrade(w2, author, merge=False)
        assert (await repos.audience.mode(author)).state == COPIED
        resume.set()
        await stale
    assert await repos.audience.merged_authors(fan) == []
    assert await repos.audience.merge_count(fan) == 0
