"""The timeline cap: trimmed by the worker, never read past, respected by backfill."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    TEST_SECRET,
    api_client,
    eventually,
    make_settings,
    running_worker,
    unique,
)
from tests.helpers import Api, bearer, error_of, put_copies
from timeline.delivery.feed import TRIM_SLACK_SHARE, Feed
from timeline.metrics import TRIM_REQUESTS
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.tokens import TokenSigner
from timeline.storage.accounts import Storage
from timeline.tools.azurite import Azurite

CAP = 10


SAMPLED_CAP = 48
"""A cap where one delivery in 3 trims (48 // TRIM_SLACK_SHARE)."""


@pytest.fixture(params=[CAP])
async def capped(
    private_azurite: Azurite, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Api, Storage]]:
    settings = make_settings(
        private_azurite.connection_string, tmp_path, max_timeline_items=request.param
    )
    async with Storage(settings.connection_string()) as storage:
        await storage.create_all()
        async with api_client(settings) as client, running_worker(settings):
            yield Api(client), storage


async def _stored_rows(storage: Storage, owner: str) -> int:
    from timeline.tables.repositories import Repositories

    rows = 0
    continuation = None
    while True:
        page = await Repositories.on(storage).timelines.page(owner, 1000, continuation)
        rows += len(page.items)
        continuation = page.continuation
        if continuation is None:
            return rows


async def _pages(api: Api, user: str, token: str, limit: int) -> list[list[str]]:
    pages: list[list[str]] = []
    continuation: str | None = None
    while True:
        page = await api.timeline(user, token, limit=limit, continuation=continuation)
        pages.append([item["post_id"] for item in page["items"]])
        continuation = page["continuation"]
        if continuation is None:
            return pages


async def test_a_stream_of_posts_keeps_the_newest_cap_entries(capped: Any) -> None:
    api, storage = capped
    author, reader = unique("author"), unique("reader")
    author_token, reader_token = await api.register(author), await api.register(reader)
    await api.follow(reader, reader_token, author)
    posted = [(await api.post(author, author_token, f"p{n}"))["post_id"] for n in range(3 * CAP)]

    async def trimmed() -> bool:
        newest = (await api.timeline(reader, reader_token, limit=1))["items"]
        return [item["post_id"] for item in newest] == posted[-1:] and (
            await _stored_rows(storage, reader) == CAP
        )

    await eventually(trimmed, what="every post delivered and the timeline trimmed to the cap")
    assert await _pages(api, reader, reader_token, 250) == [posted[::-1][:CAP]]
    assert await _pages(api, reader, reader_token, 3) == [
        posted[::-1][0:3], posted[::-1][3:6], posted[::-1][6:9], posted[::-1][9:10],
    ]  # fmt: skip
    own_posts = await api.client.get(f"/users/{author}/posts?limit=250")
    assert len((await own_posts.json())["items"]) == 3 * CAP, "an author keeps every post"


async def test_a_page_never_crosses_the_cap_before_the_trim(capped: Any) -> None:
    """More entries stored than the cap (a trim is due later): reads still stop at it."""
    api, storage = capped
    from timeline.model.entities import Post

    reader = unique("reader")
    token = await api.register(reader)
    base = now_ticks()
    posts = [Post(new_post_id(base + i * 10), unique("a"), "x") for i in range(CAP + 5)]
    await put_copies(storage, reader, posts)
    pages = await _pages(api, reader, token, 4)
    assert [len(page) for page in pages] == [4, 4, 2]
    assert await _stored_rows(storage, reader) == CAP + 5


async def test_a_backfill_respects_the_cap(capped: Any) -> None:
    api, storage = capped
    author, reader = unique("author"), unique("reader")
    author_token, reader_token = await api.register(author), await api.register(reader)
    for n in range(2 * CAP):
        await api.post(author, author_token, f"p{n}")
    await api.follow(reader, reader_token, author)

    async def backfilled_and_trimmed() -> bool:
        return (
            await _stored_rows(storage, reader) == CAP
            and len((await api.timeline(reader, reader_token))["items"]) == CAP
        )

    await eventually(backfilled_and_trimmed, what="a backfill of 20 posts capped at 10")


@pytest.mark.parametrize("capped", [SAMPLED_CAP], indirect=True)
async def test_sampled_trims_keep_a_stream_near_the_cap(capped: Any) -> None:
    """With a cap where only some deliveries trim, the stored timeline still stays near the
    cap, reads stop exactly at it, and trimming costs far less than a query per delivery."""
    api, storage = capped
    author, reader = unique("author"), unique("reader")
    author_token, reader_token = await api.register(author), await api.register(reader)
    await api.follow(reader, reader_token, author)
    trims_before = TRIM_REQUESTS._value.get()
    posted = [(await api.post(author, author_token, f"p{n}"))["post_id"] for n in range(120)]

    async def delivered() -> bool:
        # every post is its own message, so the newest may land before an older one
        return await _pages(api, reader, reader_token, 250) == [posted[::-1][:SAMPLED_CAP]]

    await eventually(delivered, what="the newest posts delivered, and no more read")
    stored = await _stored_rows(storage, reader)
    assert SAMPLED_CAP <= stored < SAMPLED_CAP + 30, stored
    deliveries = 2 * len(posted)  # the reader's timeline and the author's own
    assert TRIM_REQUESTS._value.get() - trims_before < deliveries  # about 0.55 each


def test_trimming_costs_a_small_fraction_of_a_query_per_delivery() -> None:
    feed = Feed.__new__(Feed)
    feed._cap, feed._trim_every = 800, 800 // TRIM_SLACK_SHARE
    due = sum(feed.trim_due(f"u{n}", "p") for n in range(100_000))
    assert 0.015 < due / 100_000 < 0.025


async def test_a_signed_continuation_with_a_bad_count_is_a_400(capped: Any) -> None:
    """Only the server signs continuations, but a bad count must not become a 500."""
    api, _ = capped
    reader = unique("reader")
    token = await api.register(reader)
    signer = TokenSigner(TEST_SECRET.encode(), token_ttl_s=60)
    forged = signer.encode_continuation(f"timeline:{reader}", {"a": "0", "m": "", "n": "abc"})
    response = await api.client.get(
        f"/users/{reader}/timeline", params={"continuation": forged}, headers=bearer(token)
    )
    assert await error_of(response, 400) == "invalid_continuation"
