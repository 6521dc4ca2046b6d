"""Rows written before the upgrade (never filed in ``expiries``) end too, once
``file_existing`` (``timeline file-expiries``) has filed them; live rows stay."""

from __future__ import annotations

import time
from typing import Any

from fanout_worker.sweeper import Sweeper
from tests.conftest import unique
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks, post_row_key
from timeline.storage.accounts import Storage
from timeline.storage.names import POSTS, RATE_LIMITS, SUBJECT_FOLLOWERS
from timeline.tables.expiries_filing import file_existing
from timeline.tables.follows import claim_row_key, request_id
from timeline.tables.ratelimits import partition_of
from timeline.tables.repositories import Repositories
from timeline.tables.rows import create_entity, get_entity

LIFETIME_S = 3600.0
MONTH_S = 30 * 86400.0


async def test_rows_written_before_the_upgrade_end_once_filed(own: Storage) -> None:
    subject, author = unique("s"), unique("a")
    old_rows: list[tuple[str, dict[str, Any]]] = [
        (
            SUBJECT_FOLLOWERS,
            {"PartitionKey": subject, "RowKey": claim_row_key(request_id("f", now_ticks()))},
        ),
        (
            POSTS,
            {
                "PartitionKey": author,
                "RowKey": post_row_key(new_post_id(now_ticks())),
                "void": True,
            },
        ),
        (
            RATE_LIMITS,
            {
                "PartitionKey": partition_of(unique("k")),
                "RowKey": "window",
                "count": 1,
                "expires_at": time.time() - 7 * 86400,
            },
        ),
    ]
    for table, row in old_rows:
        assert await create_entity(own, table, row)  # as before the upgrade: no filing
    live = await Repositories.on(own).posts.add(
        Post(post_id=new_post_id(now_ticks()), author=author, text="stays")
    )
    live_window: dict[str, Any] = {
        "PartitionKey": partition_of(unique("k")),
        "RowKey": "window",
        "count": 1,
        "expires_at": time.time() + 2 * MONTH_S,
    }
    assert await create_entity(own, RATE_LIMITS, live_window)
    filed = await file_existing(own)
    assert filed["claim"] >= 1
    assert filed["void"] >= 1
    assert filed["rate"] >= 2
    assert await file_existing(own) == filed  # running it again files the same rows
    await Sweeper(own, claim_lifetime_s=LIFETIME_S).sweep(now=time.time() + MONTH_S)
    left = [
        table
        for table, row in old_rows
        if await get_entity(own, table, row["PartitionKey"], row["RowKey"]) is not None
    ]
    assert not left, f"pre-upgrade rows never end: {left}"
    assert await get_entity(own, POSTS, author, post_row_key(live.post_id)) is not None
    assert await get_entity(own, RATE_LIMITS, live_window["PartitionKey"], "window") is not None
