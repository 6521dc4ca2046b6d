"""A live stream under storage faults and removals: a failed request in a poll loses
nothing, a post removed and copied again is sent again, idle polls stay one request per
source, and a page cut short by the server (empty, with a continuation) is followed."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.conftest import unique
from tests.reads.test_stream_cost import (
    add_posts,
    counted,
    made_ago,
    merge,
    poll_cost,
    storage_put,
    watch_of,
)
from timeline.config import Settings
from timeline.errors import StorageUnavailableError
from timeline.model.entities import Page
from timeline.reads import landed as landed_module
from timeline.reads.landed import OVERLAP_S, Landed
from timeline.reads.live import Removal, TimelineWatch
from timeline.storage.accounts import Storage
from timeline.storage.calls import query_page, submit_batch
from timeline.storage.names import TIMELINES
from timeline.tables.follows import FollowsRepository
from timeline.tables.timelines import TimelinesRepository


async def _fresh_despite(watch: TimelineWatch) -> list[Any]:
    """One poll that may fail (as ``updates`` skips it), then two that succeed."""
    with contextlib.suppress(StorageUnavailableError):
        await watch.fresh()
    return [*await watch.fresh(), *await watch.fresh()]


async def test_a_failed_source_loses_nothing_the_other_sources_read(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with counted(settings) as (storage, _):
        reader, large = unique("reader"), unique("large")
        await merge(storage, reader, large)
        watch = watch_of(storage, reader)
        await watch.open(None)
        copy = made_ago(0, "friend", "copy")
        await storage_put(storage, reader, [copy])
        real = Landed.new_rows
        failed: list[bool] = []

        async def flaky(self: Landed, st: Any) -> Any:
            if self.partition == large and not failed:
                failed.append(True)
                raise StorageUnavailableError("blip", retry_after=1)
            return await real(self, st)

        monkeypatch.setattr(Landed, "new_rows", flaky)
        assert copy in await _fresh_despite(watch)


async def test_a_failed_follow_check_loses_nothing(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with counted(settings) as (storage, _):
        reader, large = unique("reader"), unique("large")
        await merge(storage, reader, large)
        watch = watch_of(storage, reader)
        await watch.open(None)
        copy, merged = made_ago(0, "friend", "copy"), made_ago(0, large, "merged")
        await storage_put(storage, reader, [copy])
        await add_posts(storage, large, [merged])
        real = FollowsRepository.following_among

        async def flaky(self: FollowsRepository, follower: str, subjects: Any) -> Any:
            monkeypatch.setattr(FollowsRepository, "following_among", real)
            raise StorageUnavailableError("blip", retry_after=1)

        monkeypatch.setattr(FollowsRepository, "following_among", flaky)
        sent = await _fresh_despite(watch)
        assert copy in sent
        assert merged in sent


async def test_a_resumed_streams_catch_up_survives_a_failed_poll(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with counted(settings) as (storage, _):
        reader = unique("reader")
        old = [made_ago(200 - i, "friend", f"e{i}") for i in range(5)]
        await storage_put(storage, reader, old)
        watch = watch_of(storage, reader)
        await watch.open(old[0].row_key)  # Last-Event-ID: the first of them
        real = Landed.new_rows
        failed: list[bool] = []

        async def flaky(self: Landed, st: Any) -> Any:
            if not failed:
                failed.append(True)
                raise StorageUnavailableError("blip", retry_after=1)
            return await real(self, st)

        monkeypatch.setattr(Landed, "new_rows", flaky)
        with pytest.raises(StorageUnavailableError):
            await watch.fresh()
        assert set(old[1:]) <= set(await watch.fresh())


async def test_a_post_removed_then_copied_again_is_sent_again(settings: Settings) -> None:
    """An unfollow's purge, then a re-follow's backfill, within the look-back."""
    async with counted(settings) as (storage, _):
        reader = unique("reader")
        repo = TimelinesRepository(storage)
        watch = watch_of(storage, reader)
        await watch.open(None)
        post = made_ago(1, "friend", "p")
        await storage_put(storage, reader, [post])
        assert await watch.fresh() == [post]
        tag = await repo.etag_of(reader, post.row_key)
        assert tag is not None
        assert await repo.remove_unchanged(reader, [(post.row_key, tag)]) == 1
        assert await watch.fresh() == [Removal(post.post_id)]
        await storage_put(storage, reader, [post])  # the re-follow's backfill
        assert await watch.fresh() == [post]
        assert await watch.fresh() == []


async def test_idle_polls_after_a_burst_of_over_1000_rows_stay_one_request(
    settings: Settings,
) -> None:
    async with counted(settings) as (storage, requests):
        reader = unique("reader")
        watch = watch_of(storage, reader)
        await watch.open(None)
        await storage_put(storage, reader, [made_ago(2, "friend", nth=i) for i in range(1100)])
        _, updates = await poll_cost(watch, requests)
        assert len(updates) == 1100
        idle = [await poll_cost(watch, requests) for _ in range(3)]
        assert idle == [(1, [])] * 3


async def test_an_empty_page_with_a_continuation_is_followed(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Azure ends a query page early (even empty) when a scan runs 5 s: the token leads on."""
    async with counted(settings) as (storage, _):
        reader = unique("reader")
        watch = watch_of(storage, reader)
        await watch.open(None)
        posts = [made_ago(1, "friend", nth=i) for i in range(3)]
        await storage_put(storage, reader, posts)
        probe = {"PartitionKey": reader, "RowKey": "!probe"}  # first in key order; no post
        await submit_batch(storage, TIMELINES, reader, [("upsert", probe)])
        real = query_page
        cut: list[bool] = []

        async def cut_short(*args: Any, **kwargs: Any) -> Any:
            if cut:
                return await real(*args, **kwargs)
            cut.append(True)  # the server stopped after the probe: an empty page, a token
            return Page([], (await real(*args, **{**kwargs, "limit": 1})).continuation)

        monkeypatch.setattr(landed_module, "query_page", cut_short)
        assert set(await watch.fresh()) == set(posts)


async def test_an_idle_read_moves_the_cursor_to_the_servers_clock(storage: Storage) -> None:
    """A read that finds nothing still moves the cursor up to the server's ``Date`` less the
    overlap, so a burst read before is not read again and again."""
    source = Landed(TIMELINES, unique("reader"), datetime.now(UTC) - timedelta(hours=1), [])
    reading = await source.new_rows(storage)
    assert reading.rows == []
    assert reading.served is not None
    assert abs(reading.served - datetime.now(UTC)) < timedelta(seconds=60)
    source.commit(reading)
    assert source.since == reading.served - timedelta(seconds=OVERLAP_S + 1)
