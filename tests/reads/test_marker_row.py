"""The read marker's row (``!r``) sits among a reader's head rows: no page shows it or is
shortened by it, and the cap's trim neither counts nor deletes it. What a marker read and
write cost in storage requests."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import TEST_SECRET, unique
from tests.reads.test_stream_cost import counted
from timeline.config import Settings
from timeline.errors import ConflictError
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks, post_row_key
from timeline.model.tokens import TokenSigner
from timeline.reads.home import HomeTimeline, Position
from timeline.service.markers import Marker, Markers
from timeline.storage.accounts import Storage
from timeline.storage.calls import submit_batch
from timeline.storage.names import TIMELINES
from timeline.tables.activity import CURSOR_ROW, STAMP_ROW
from timeline.tables.activity import MARKER_ROW as DORMANCY_ROW
from timeline.tables.audience import MERGE_COUNT_ROW
from timeline.tables.markers import MarkersRepository
from timeline.tables.timelines import TimelinesRepository

POSTS = 6


async def _reader_with_every_head_row(storage: Storage) -> tuple[str, list[Post]]:
    """A reader holding each kind of head row but merge rows, a read marker and posts."""
    owner, base = unique("reader"), now_ticks()
    posts = [Post(new_post_id(base + i), "author", f"post {i}") for i in range(POSTS)]
    heads: list[dict[str, Any]] = [
        {"PartitionKey": owner, "RowKey": STAMP_ROW, "stamp": 1.0},
        {"PartitionKey": owner, "RowKey": CURSOR_ROW, "gen": "g", "restored": ""},
        {"PartitionKey": owner, "RowKey": DORMANCY_ROW, "gen": "g", "state": "waking"},
        {"PartitionKey": owner, "RowKey": MERGE_COUNT_ROW, "n": 0},
    ]
    operations: list[Any] = [("upsert", row) for row in heads]
    operations += [("upsert", post.to_entity(owner)) for post in posts]
    await submit_batch(storage, TIMELINES, owner, operations)
    assert await MarkersRepository(storage).create(owner, posts[-1].row_key)
    return owner, sorted(posts, key=lambda post: post.row_key)


async def test_a_page_is_full_beside_every_head_row(storage: Storage) -> None:
    owner, posts = await _reader_with_every_head_row(storage)
    home = HomeTimeline(storage, max_merged=0)
    page, following = await home.page(owner, POSTS, Position())
    assert page == posts, "a head row took a post's place, or showed as one"
    assert following is None


async def test_trim_neither_counts_nor_drops_the_marker(storage: Storage) -> None:
    owner, posts = await _reader_with_every_head_row(storage)
    markers = MarkersRepository(storage)
    before = await markers.get(owner)
    assert await TimelinesRepository(storage).trim(owner, keep=2) == POSTS - 2
    assert await markers.get(owner) == before
    page, _ = await HomeTimeline(storage, max_merged=0).page(owner, POSTS, Position())
    assert page == posts[:2]


async def test_a_marker_costs_a_read_per_get_and_a_conditional_write_per_put(
    settings: Settings,
) -> None:
    signer = TokenSigner(TEST_SECRET.encode(), token_ttl_s=60)
    owner = unique("reader")
    at = [
        signer.encode_position(f"timeline:{owner}", post_row_key(new_post_id(now_ticks() + n)))
        for n in range(3)
    ]
    async with counted(settings) as (storage, requests):
        markers = Markers(MarkersRepository(storage), signer)

        async def cost(call: Any) -> int:
            before = len(requests.urls)
            await call
            return len(requests.urls) - before

        assert await cost(markers.get(owner, owner)) == 1
        assert await cost(markers.put(owner, owner, at[0], 0)) == 1, "insert if absent"
        assert await cost(markers.get(owner, owner)) == 1
        assert await cost(markers.put(owner, owner, at[1], 1)) == 2, "read, If-Match write"
        assert await cost(markers.put(owner, owner, at[1], 1)) == 1, "a retry: the read only"
        assert await cost(markers.put(owner, owner, at[2], 2)) == 2
        before = len(requests.urls)
        with pytest.raises(ConflictError):
            await markers.put(owner, owner, at[0], 0)
        assert len(requests.urls) - before == 2, "a stale first write: the insert, a read"


async def test_a_large_version_round_trips(storage: Storage) -> None:
    """Versions past Int32 (stored as doubles) read back as plain integers."""
    signer = TokenSigner(TEST_SECRET.encode(), token_ttl_s=60)
    owner = unique("reader")
    row_key = post_row_key(new_post_id(now_ticks()))
    big = 2**40
    row = {"PartitionKey": owner, "RowKey": "!r", "position": row_key, "version": float(big)}
    await submit_batch(storage, TIMELINES, owner, [("upsert", row)])
    markers = Markers(MarkersRepository(storage), signer)
    at = signer.encode_position(f"timeline:{owner}", row_key)
    assert (await markers.get(owner, owner)).version == big
    assert await markers.put(owner, owner, at, big) == Marker(at, big + 1)
    assert await markers.get(owner, owner) == Marker(at, big + 1)
