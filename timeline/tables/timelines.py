"""The ``timelines`` table: delivered copies of posts, one partition per timeline owner."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import NamedTuple

from azure.data.tables import TableTransactionError

from timeline.metrics import TRIM_REQUESTS
from timeline.model.entities import DETACHED, POST_SELECT, Page, Post, shown_post_id
from timeline.storage.accounts import Storage
from timeline.storage.calls import (
    MAX_BATCH_OPERATIONS,
    chunked,
    failed_index,
    query_page,
    transact,
)
from timeline.storage.names import TIMELINES
from timeline.tables.rows import (
    META,
    PARTITION,
    delete_entity,
    drop_partition,
    etag,
    get_entity,
    merge_existing,
    partition_page,
)
from timeline.tables.traces import (
    TRACES_END,
    delete_unchanged,
    expired_traces,
    sweep_traces,
    trace_key,
    traced_deletes,
    unchanged_deletes,
)


class CopyRow(NamedTuple):
    """A copy's key and etag, its post's author, for a repost's copy its original's id
    (else ""), and for a reply's the user it answers (else "")."""

    key: str
    etag: str
    author: str
    original: str
    answers: str


class TimelinesRepository:
    """Delivered copies of posts in ``timelines``, one partition per timeline owner."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    async def detach_reply(self, owners: list[str], row_key: str) -> None:
        """Mark each owner's copy (where there is one) as answering a deleted account: a
        merge that never creates the row, one request per owner."""
        await asyncio.gather(
            *(
                merge_existing(
                    self._storage,
                    TIMELINES,
                    {"PartitionKey": owner, "RowKey": row_key, "reply_author": DETACHED},
                )
                for owner in owners
            )
        )

    async def drop(self, owner: str) -> None:
        """Delete the whole timeline (a deleted list's)."""
        await drop_partition(self._storage, TIMELINES, owner)

    async def drop_trace(self, owner: str, row_key: str) -> None:
        """Delete the removal trace of ``row_key`` now (gone already is fine)."""
        await delete_entity(self._storage, TIMELINES, owner, trace_key(row_key))

    async def rows_by_author(
        self, owner: str, author: str, *, reposts: bool = False
    ) -> AsyncIterator[list[CopyRow]]:
        """Pages of the rows of every copy in ``owner``'s timeline of ``author``'s
        posts; ``reposts``: with the copies of ``author``'s reposts. A repost's copy belongs
        to its reposter, never to its original's author (``reposted_by``)."""
        condition = "author eq @author" + (" or reposted_by eq @author" if reposts else "")
        continuation: dict[str, str] | None = None
        while True:
            async with self._storage.guard():
                page = await query_page(
                    self._storage.reader(TIMELINES, owner),
                    f"{PARTITION} and ( {condition} )",
                    {"pk": owner, "author": author},
                    select=["RowKey", "author", "reposted_by", "original", "reply_author"],
                    limit=1000,
                    continuation=continuation,
                )
            yield [
                CopyRow(
                    entity["RowKey"],
                    etag(entity),
                    entity["author"],
                    entity.get("original") or "",
                    entity.get("reply_author") or "",
                )
                for entity in page.items
                if not entity.get("reposted_by") or (reposts and entity["reposted_by"] == author)
            ]
            continuation = page.continuation
            if continuation is None:
                return

    async def newest_shown(self, owner: str, count: int, besides: str | None = None) -> set[str]:
        """The post ids the newest ``count`` entries show (a repost's copy shows its
        original), leaving out the copies of reposts by ``besides``: one query."""
        page = await partition_page(
            self._storage,
            TIMELINES,
            owner,
            select=["RowKey", "original", "reposted_by"],
            limit=count,
            continuation=None,
            posts_only=True,
        )
        return {
            shown_post_id(entity)
            for entity in page.items
            if besides is None or entity.get("reposted_by") != besides
        }

    async def etag_of(self, owner: str, row_key: str) -> str | None:
        entity = await get_entity(self._storage, TIMELINES, owner, row_key, select=["RowKey"])
        return None if entity is None else etag(entity)

    async def remove_unchanged(self, owner: str, rows: list[tuple[str, str]]) -> int:
        """Delete each row only if it still has the etag it was read with; a row rewritten
        since (a re-follow's backfill) stays. Each delete leaves its trace in the same
        transaction (``timeline.tables.traces``); then at least as many expired traces go as
        were written (when there are), so a timeline never trimmed keeps only young traces.
        Returns how many were deleted."""
        deleted = 0
        for chunk in chunked(rows, MAX_BATCH_OPERATIONS // 2):
            batch = traced_deletes(owner, chunk)
            while batch:
                try:
                    await transact(self._storage, TIMELINES, owner, batch)
                    deleted += len(batch) // 2
                    break
                except TableTransactionError as error:
                    index = failed_index(error, 404, 412)
                    if index is None:
                        raise
                    del batch[index : index + 2]  # the delete and its trace
        if deleted:
            await sweep_traces(self._storage, TIMELINES, owner, at_least=deleted)
        return deleted

    async def sweep_traces(self, owner: str) -> int:
        """Remove up to ``SWEEP_TRACES`` expired removal traces of the timeline."""
        return await sweep_traces(self._storage, TIMELINES, owner)

    async def page(self, owner: str, limit: int, continuation: dict[str, str] | None) -> Page[Post]:
        page = await partition_page(
            self._storage,
            TIMELINES,
            owner,
            select=POST_SELECT,
            limit=limit,
            continuation=continuation,
            posts_only=True,
        )
        return Page([Post.from_entity(entity) for entity in page.items], page.continuation)

    async def trim(self, owner: str, keep: int) -> int:
        """Delete the entries older than the newest ``keep`` among the partition's first
        1,000: one key-only query, then EGT deletes, so one trim's work is bounded (a longer
        timeline shrinks by up to ``1000 - keep`` per trim). A newer entry landing meanwhile
        only pushes the doomed ones further back; an older one (a late backfill) may stay
        past ``keep`` until the next trim. The same query reads the removal traces after
        the entries, and the expired ones go with the doomed entries (no request more), each
        only if unchanged since the query (a trace rewritten meanwhile is young again).
        Returns how many entries were deleted."""
        page = await partition_page(
            self._storage,
            TIMELINES,
            owner,
            select=["RowKey", "Timestamp"],
            limit=1000,
            continuation=None,
            posts_only=True,
            until=TRACES_END,
        )
        TRIM_REQUESTS.inc()
        doomed = [entity["RowKey"] for entity in page.items if entity["RowKey"] < META][keep:]
        deletes = [
            *(("delete", {"PartitionKey": owner, "RowKey": key}) for key in doomed),
            *unchanged_deletes(owner, expired_traces(page.items)),
        ]
        for batch in chunked(deletes):
            TRIM_REQUESTS.inc()
            await delete_unchanged(self._storage, TIMELINES, owner, batch)
        return len(doomed)
