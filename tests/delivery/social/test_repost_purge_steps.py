"""A widely reposted post's delete: its reposts go a bounded step per lease, each step
redo-safe, and nothing of the post is left anywhere when every step has run."""

from __future__ import annotations

import pytest

from tests.conftest import unique
from tests.delivery.helpers import add_follow, add_posts, add_users, run_every_pass
from tests.delivery.helpers import unlimited_service as _service
from tests.delivery.social.helpers import posts_keys
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.outcomes import Continue, Outcome
from timeline.delivery.processor import FanoutProcessor
from timeline.delivery.repost_purge import QUERIES_PER_STEP, REPOSTS_PER_STEP
from timeline.errors import MalformedMessageError
from timeline.metrics import STORAGE_REQUESTS
from timeline.model.messages import PostDeleted, Reposted, RepostsPosition, decode, encode
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.repositories import Repositories
from timeline.tables.reposts import REPOST, REPOSTS_OF

REPOSTERS = 30
PAGE = 3


async def _people(repos: Repositories, prefix: str, count: int) -> list[str]:
    names = [unique(prefix) for _ in range(count)]
    await add_users(repos, *names)
    return names


async def _holding(repos: Repositories, readers: list[str], post_id: str) -> list[str]:
    """The readers whose timeline shows the post (its copy or a repost's entry)."""
    found = []
    for reader in readers:
        page = await repos.timelines.page(reader, 1000, None)
        if any(post_id in (p.post_id, p.original) for p in page.items):
            found.append(reader)
    return found


async def test_a_widely_reposted_posts_delete_ends_with_no_copy_step_by_step(
    storage: Storage, repos: Repositories
) -> None:
    """30 reposters, some with several followers (more than a follower page), one reader
    following many of them: every step of the delete runs twice (a redelivery after it did
    its work but before its message was rewritten), and no entry, repost row or index row
    of the post is left; each step's storage requests stay bounded."""
    [author] = await _people(repos, "author", 1)
    [post] = await add_posts(repos, author, 1)
    reposters = await _people(repos, "rp", REPOSTERS)
    shared = unique("shared")  # follows every third reposter: several entries to remove
    await add_users(repos, shared)
    readers = [shared]
    service = _service(storage)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        delivering = FanoutProcessor.on(storage, writer)
        for index, reposter in enumerate(reposters):
            followers = await _people(repos, "f", index % 5)  # 0 to 4: up to two pages
            if index % 3 == 0:
                followers.append(shared)
            for follower in followers:
                await add_follow(repos, follower, reposter)
            readers.extend(f for f in followers if f != shared)
            item = await service.reposts.repost(reposter, reposter, author, post.post_id)
            repost_id = item["repost_id"]
            reposted = Reposted(
                reposter=reposter, author=author, post_id=post.post_id, repost_id=repost_id
            )
            await run_every_pass(delivering, reposted)
        holders_before = await _holding(repos, readers, post.post_id)
        assert len(holders_before) == len(readers)

        await service.posts.delete(author, author, post.post_id)
        deleting = FanoutProcessor.on(storage, writer, follower_page_size=PAGE)
        steps, inside, costs = 0, 0, list[float]()
        outcome: Outcome = Continue(PostDeleted(author=author, post_id=post.post_id))
        while isinstance(outcome, Continue):
            message = outcome.message
            assert isinstance(message, PostDeleted)
            assert decode(encode(message)) == message
            if message.reposts is not None and message.reposts.followers is not None:
                inside += 1
            for _ in range(2):  # the first did its work, but its rewrite was lost
                before = STORAGE_REQUESTS._value.get()
                outcome = await deleting.handle(message)
                costs.append(STORAGE_REQUESTS._value.get() - before)
            steps += 1

    assert await _holding(repos, readers, post.post_id) == []
    assert await posts_keys(storage, author, REPOSTS_OF) == []
    for reposter in reposters:
        assert await posts_keys(storage, reposter, REPOST) == [], reposter
    assert steps >= 2 * REPOSTERS // REPOSTS_PER_STEP  # paged, in both passes
    assert inside > 0  # some steps stopped inside a reposter's followers
    # the readers' page (source, mode, page, unpush, traces), a resumed index row, the
    # index and follower queries, each repost's void and (second pass) rows, one page of
    # unpushes: none grows with the reposts
    bound = 3 * (PAGE + 1) + 4 + 1 + QUERIES_PER_STEP + 6 * REPOSTS_PER_STEP + PAGE
    assert max(costs) <= bound, costs


def test_a_deletes_message_walks_one_cursor_and_stays_small() -> None:
    """A delete in its reposts' purge keeps within the queue's 64 KiB however long its ids
    and cursor; a message holding both cursors is refused."""
    cursor = {f"NextKey{i}": "x" * 2048 for i in range(4)}
    position = RepostsPosition(reposter="r" * 64, repost_id="0" * 26, followers=cursor)
    longest = PostDeleted(
        author="a" * 64,
        post_id="0" * 26,
        confirm=True,
        merged=True,
        reply_author="b" * 64,
        reply_post="1" * 26,
        reposts=position,
        released=10**9,
        failures=10**9,
        attempt=10**9,
        level=10**9,
        solo=10**9,
    )
    assert decode(encode(longest)) == longest
    assert len(encode(longest).encode()) < 48 * 1024  # room to spare, even base64-encoded
    both = encode(longest).replace('"reposts"', '"cursor":{"k":"v"},"reposts"')
    with pytest.raises(MalformedMessageError):
        decode(both)
