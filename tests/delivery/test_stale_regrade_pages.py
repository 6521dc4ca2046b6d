"""A page of a move up or down that stalls while another worker finishes the move and
the author moves back: the stale page must not leave a merge row wrong.

Each interleaving is forced on real storage.
"""

from __future__ import annotations

import asyncio
import uuid

from tests.conftest import eventually
from tests.delivery.helpers import add_follow, remove_follow
from tests.delivery.hybrid_helpers import (
    add_post,
    finish_down_then_up,
    hybrid_processor,
    merge_count,
    new_users,
    regrade,
    run_to_end,
    sees_next_post,
)
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.outcomes import Continue
from timeline.model.messages import Regrade
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.audience import COPIED, MERGED
from timeline.tables.repositories import Repositories


async def test_stale_down_move_page_drops_merge_row_of_a_new_up_move(
    storage: Storage, repos: Repositories
) -> None:
    """Worker 1 runs page 1 of a move down and stalls inside ``_unmerge`` (copying the
    newest posts); its lease expires, worker 2 finishes the move down; the author grows
    again and worker 2 moves it up (``merged``, every follower has a merge row). Worker 1
    then resumes and removes the follower's merge row unconditionally: a follower of a
    merged author with neither merge row nor overflow row, so new posts never reach it."""
    author, fan, *others = await new_users(repos, "large", "fan", "g", "g", "g")
    for user in [fan, *others]:
        await add_follow(repos, user, author)
    await add_post(repos, author)
    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as held,
        PartitionWriter(storage, TIMELINES, linger_s=0) as prompt,
    ):
        w1, w2 = hybrid_processor(storage, held), hybrid_processor(storage, prompt)
        await regrade(w2, author, merge=True)
        assert (await repos.audience.mode(author)).state == MERGED
        for user in others:
            await remove_follow(repos, user, author)  # 1 follower: below half the threshold
        down = Regrade(author=author, merge=False, token=uuid.uuid4().hex, fenced=True)
        stale = asyncio.ensure_future(w1.handle(down))

        async def buffered() -> bool:
            return held.buffered > 0

        await eventually(buffered, timeout_s=10, what="worker 1's copies to be buffered")
        await finish_down_then_up(storage, w2, down, others, fan)
        while not stale.done():  # worker 1 resumes
            await held.flush()
            await asyncio.sleep(0.01)
        await stale
        await sees_next_post(storage, w2, author, fan)


async def test_stale_down_page_that_stalls_before_its_etag_reads_drops_a_new_merge_row(
    storage: Storage, repos: Repositories
) -> None:
    """Like the stale page above, but worker 1 stalls
    after the page's mode check and before ``_unmerge`` reads the etags (here: in the
    follower page query; in production: any pause of the process that also stops the lease
    renewal). It then reads the etag of the *new* move up's merge row, ``copy_newest``
    copies nothing (merged, no overflow row), and the removal "only if unchanged since
    before its copies" succeeds."""
    author, fan, *others = await new_users(repos, "large", "fan", "g", "g", "g")
    for user in [fan, *others]:
        await add_follow(repos, user, author)
    await add_post(repos, author)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w1, w2 = hybrid_processor(storage, writer), hybrid_processor(storage, writer)
        await regrade(w2, author, merge=True)
        assert (await repos.audience.mode(author)).state == MERGED
        for user in others:
            await remove_follow(repos, user, author)
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
        await finish_down_then_up(storage, w2, down, others, fan)  # the redelivered page
        resume.set()
        await stale
        await sees_next_post(storage, w2, author, fan)


async def test_a_stale_page_of_a_move_up_takes_its_rows_back(
    storage: Storage, repos: Repositories
) -> None:
    """Worker 1 runs a page of a move up and stalls while
    writing merge rows; worker 2 finishes the move, the author falls back and worker 2
    moves it down to ``copied``. Worker 1 then writes its merge row: it must take it back,
    or the reader keeps a merge row of an author that is not merged (a query and a merge
    slot spent for nothing)."""
    author, fan, *others = await new_users(repos, "large", "fan", "g", "g", "g")
    for user in [fan, *others]:
        await add_follow(repos, user, author)
    async with (
        PartitionWriter(storage, TIMELINES, linger_s=0) as first,
        PartitionWriter(storage, TIMELINES, linger_s=0) as second,
    ):
        w1, w2 = hybrid_processor(storage, first), hybrid_processor(storage, second)
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
        await run_to_end(w2, up)  # the redelivered page, to the end
        assert (await repos.audience.mode(author)).state == MERGED
        for user in others:
            await remove_follow(repos, user, author)
        await regrade(w2, author, merge=False)
        assert (await repos.audience.mode(author)).state == COPIED
        resume.set()
        await stale
    assert await repos.audience.merged_authors(fan) == []
    assert await merge_count(storage, fan) == 0
