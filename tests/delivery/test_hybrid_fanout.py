"""Hybrid fan-out: large authors' posts are merged into home timelines at read time.

Each test compares whole timelines, page by page, with the truth computed from the posts
table: every live post of every author the reader follows, and the reader's own, newest
first (ties by post id), with nothing twice and nothing missing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.conftest import api_client, eventually, make_settings, running_worker, unique
from tests.helpers import Api, bearer
from timeline.delivery.regrade import queue_due_regrades
from timeline.delivery.settings import Hybrid
from timeline.model.keys import post_row_key
from timeline.model.messages import Regrade
from timeline.storage.accounts import Storage
from timeline.storage.queue import FanoutQueues
from timeline.tables.audience import COPIED, GROWING, MERGED, AuthorMode
from timeline.tables.repositories import Repositories
from timeline.tools.azurite import Azurite

THRESHOLD = 4
"""An author with 4 followers is large here; back to copies below 2."""
MAX_MERGED = 2
CAP = 7


@dataclass
class Stack:
    api: Api
    repos: Repositories
    tokens: dict[str, str]
    queue: FanoutQueues

    async def user(self, prefix: str) -> str:
        user = unique(prefix)
        self.tokens[user] = await self.api.register(user)
        return user

    async def follow(self, follower: str, subject: str) -> None:
        await self.api.follow(follower, self.tokens[follower], subject)

    async def unfollow(self, follower: str, subject: str) -> None:
        await self.api.unfollow(follower, self.tokens[follower], subject)

    async def post(self, author: str, text: str = "hello") -> str:
        return str((await self.api.post(author, self.tokens[author], text))["post_id"])

    async def audience(self, author: str, count: int) -> list[str]:
        """``count`` new followers of ``author``."""
        followers = [await self.user("fan") for _ in range(count)]
        for follower in followers:
            await self.follow(follower, author)
        return followers

    async def pages(self, reader: str, limit: int) -> list[list[str]]:
        pages: list[list[str]] = []
        continuation: str | None = None
        while True:
            page = await self.api.timeline(
                reader, self.tokens[reader], limit=limit, continuation=continuation
            )
            pages.append([item["post_id"] for item in page["items"]])
            continuation = page["continuation"]
            if continuation is None:
                return pages

    async def truth(self, reader: str, authors: list[str]) -> list[str]:
        """Every live post of ``authors`` and the reader, newest first."""
        posts = []
        for author in {reader, *authors}:
            posts += await self.repos.posts.newest(author, 10_000)
        return [post.post_id for post in sorted(posts, key=lambda post: post.row_key)]

    async def copies(self, reader: str) -> set[str]:
        """The post ids stored in the reader's own timeline partition."""
        page = await self.repos.timelines.page(reader, 1000, None)
        return {post.post_id for post in page.items}

    async def state(self, author: str) -> str:
        return (await self.repos.audience.mode(author)).state

    async def settled(self, author: str, state: str) -> None:
        async def reached() -> bool:
            return await self.state(author) == state

        await eventually(reached, timeout_s=60, what=f"{author} {state}")


@pytest.fixture(params=[0], ids=["uncapped"])
async def stack(
    private_azurite: Azurite, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Stack]:
    settings = make_settings(
        private_azurite.connection_string,
        tmp_path,
        fanout_on_read_followers=THRESHOLD,
        max_merged_authors=MAX_MERGED,
        max_timeline_items=request.param,
    )
    async with Storage(settings.connection_string()) as storage:
        await storage.create_all()
        async with api_client(settings) as client, running_worker(settings):
            yield Stack(Api(client), Repositories.on(storage), {}, FanoutQueues(storage))


def _flat(pages: list[list[str]]) -> list[str]:
    return [post for page in pages for post in page]


async def _pages_match(stack: Stack, reader: str, authors: list[str], *limits: int) -> None:
    """Every limit pages through exactly the truth: newest first, no duplicates, no gaps."""
    truth = await stack.truth(reader, authors)

    async def delivered() -> bool:
        return _flat(await stack.pages(reader, 250)) == truth

    await eventually(delivered, what=f"{reader}'s timeline to equal its truth")
    for limit in limits:
        pages = await stack.pages(reader, limit)
        assert _flat(pages) == truth, f"limit {limit}"
        assert all(1 <= len(page) <= limit for page in pages[:-1]), f"limit {limit}"


async def test_readers_following_none_one_and_many_large_authors(stack: Stack) -> None:
    larges = [await stack.user("large") for _ in range(3)]
    small = await stack.user("small")
    for large in larges:
        await stack.audience(large, THRESHOLD)
        await stack.settled(large, MERGED)
    none, one, many = await stack.user("none"), await stack.user("one"), await stack.user("many")
    follows = {none: [small], one: [small, larges[0]], many: [small, *larges]}
    for reader, authors in follows.items():
        for author in authors:
            await stack.follow(reader, author)
    posted: dict[str, list[str]] = {author: [] for author in [small, *larges]}
    for round_ in range(6):
        for author in posted:
            posted[author].append(await stack.post(author, f"{author} {round_}"))
    for reader, authors in follows.items():
        await stack.post(reader, "my own")
        await _pages_match(stack, reader, authors, 1, 2, 3, 7, 250)
    # the large authors' posts were never copied, except to the overflow reader ("many" has
    # room for MAX_MERGED merge rows, so the third large author's posts are copied to it)
    copied_large = {large for large in larges if set(posted[large]) & await stack.copies(many)}
    assert len(copied_large) == len(larges) - MAX_MERGED
    assert not set(posted[larges[0]]) & await stack.copies(one)
    assert set(posted[small]) <= await stack.copies(one)


async def test_a_post_delete_and_unfollow_of_a_large_author_show_at_once(stack: Stack) -> None:
    large, reader = await stack.user("large"), await stack.user("reader")
    await stack.audience(large, THRESHOLD - 1)
    await stack.follow(reader, large)
    await stack.settled(large, MERGED)
    older = await stack.post(large, "older")
    token = stack.tokens[reader]
    await _pages_match(stack, reader, [large], 250)

    post = await stack.post(large, "new")  # no waiting for the worker from here on
    assert (await stack.api.timeline(reader, token))["items"][0]["post_id"] == post
    response = await stack.api.client.delete(
        f"/users/{large}/posts/{post}", headers=bearer(stack.tokens[large])
    )
    assert response.status == 204
    assert [item["post_id"] for item in (await stack.api.timeline(reader, token))["items"]] == [
        older
    ]
    await stack.unfollow(reader, large)
    assert (await stack.api.timeline(reader, token))["items"] == []


async def test_crossing_the_threshold_up_and_down_mid_stream(stack: Stack) -> None:
    author, reader = await stack.user("author"), await stack.user("reader")
    other = await stack.user("other")
    await stack.follow(reader, author)
    await stack.follow(reader, other)
    for n in range(3):
        await stack.post(author, f"small {n}")
        await stack.post(other, f"other {n}")
    await _pages_match(stack, reader, [author, other], 2, 250)

    fans = await stack.audience(author, THRESHOLD)  # up, while the author keeps posting
    for n in range(3):
        await stack.post(author, f"growing {n}")
    await stack.settled(author, MERGED)
    merged_post = await stack.post(author, "merged")
    await _pages_match(stack, reader, [author, other], 1, 3, 250)
    assert merged_post not in await stack.copies(reader)

    for fan in fans:  # down, below half the threshold, while the author keeps posting
        await stack.unfollow(fan, author)
        await stack.post(author, f"shrinking {fan}")
    await stack.settled(author, COPIED)
    await stack.post(author, "copied again")
    await _pages_match(stack, reader, [author, other], 1, 4, 250)
    truth = await stack.truth(reader, [author, other])
    assert set(truth) <= await stack.copies(reader)  # everything is a copy again
    assert await stack.repos.audience.merged_authors(reader) == []


async def test_a_follow_of_a_merged_author_shows_its_older_posts(stack: Stack) -> None:
    large = await stack.user("large")
    await stack.audience(large, THRESHOLD)
    await stack.settled(large, MERGED)
    posts = [await stack.post(large, f"p{n}") for n in range(5)]
    reader = await stack.user("reader")
    await stack.follow(reader, large)
    await _pages_match(stack, reader, [large], 2, 250)
    assert not set(posts) & await stack.copies(reader)
    assert post_row_key(posts[0]) > post_row_key(posts[-1])  # newest first in key order


async def test_a_dense_large_author_shortens_pages_but_loses_nothing(stack: Stack) -> None:
    larges = [await stack.user("large") for _ in range(3)]
    for large in larges:
        await stack.audience(large, THRESHOLD)
        await stack.settled(large, MERGED)
    reader = await stack.user("reader")
    for large in larges[:MAX_MERGED]:
        await stack.follow(reader, large)
    for n in range(100):  # one source far denser than its share of a page
        await stack.post(larges[0], f"dense {n}")
    await stack.post(larges[1], "sparse")
    await _pages_match(stack, reader, larges[:MAX_MERGED], 250, 60)
    pages = await stack.pages(reader, 250)
    assert len(pages) > 1  # the dense author's share bounded the first page


@pytest.mark.parametrize("stack", [CAP], ids=["capped"], indirect=True)
async def test_a_merged_timeline_stops_at_the_cap(stack: Stack) -> None:
    large, small = await stack.user("large"), await stack.user("small")
    await stack.audience(large, THRESHOLD)
    await stack.settled(large, MERGED)
    reader = await stack.user("reader")
    await stack.follow(reader, large)
    await stack.follow(reader, small)
    for n in range(CAP):
        await stack.post(large, f"large {n}")
        await stack.post(small, f"small {n}")
    newest = (await stack.truth(reader, [large, small]))[:CAP]

    async def capped() -> bool:
        return _flat(await stack.pages(reader, 250)) == newest

    await eventually(capped, what="the merged timeline to show the newest entries up to the cap")
    for limit in (1, 4, 250):
        pages = await stack.pages(reader, limit)
        assert _flat(pages) == newest, f"limit {limit}"


async def test_an_author_who_crossed_back_during_a_move_moves_back(stack: Stack) -> None:
    """The unfollows that took an author back below half the threshold came while it was
    still growing (no move down can start then): finishing the move up starts it."""
    author = await stack.user("author")
    await stack.audience(author, 1)

    async def idle() -> bool:
        return (await stack.queue.depth())[0] == 0

    await eventually(idle, what="the follow handled while the author was copied")
    token = "1" * 32
    audience = stack.repos.audience
    assert await audience.change_mode(author, AuthorMode(), GROWING, token=token)
    await stack.queue.send(Regrade(author=author, merge=True, token=token))
    await stack.settled(author, COPIED)


async def test_timeline_regrade_moves_authors_already_past_the_threshold(stack: Stack) -> None:
    """Followers gained while hybrid fan-out was off (no follow handled since): the admin
    command finds the author and queues its move."""
    author, reader = await stack.user("author"), await stack.user("reader")
    since = datetime.now(UTC)
    for follower in [reader, *[unique("old") for _ in range(THRESHOLD - 1)]]:
        assert await stack.repos.follows.add(follower, author, since)
        await stack.repos.follows.sync_index(follower, author)
    hybrid = Hybrid(threshold=THRESHOLD, max_merged=MAX_MERGED, queue=stack.queue)
    assert author in await queue_due_regrades(stack.repos, hybrid, None)
    await stack.settled(author, MERGED)
    post = await stack.post(author, "merged at once")
    assert (await stack.api.timeline(reader, stack.tokens[reader]))["items"][0]["post_id"] == post
    assert await queue_due_regrades(stack.repos, hybrid, [author]) == []
