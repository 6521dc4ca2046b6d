"""Hybrid fan-out state: which authors are merged into timelines at read time, and for whom.

Three kinds of rows, each in the partition of the one who reads it:

- ``~mode`` in the author's ``subjectFollowers`` partition (beside the follower counter
  rows): the author's state. ``copied`` (no row) and ``shrinking`` authors' posts are copied
  to every follower; ``growing`` authors' too, while their followers are being given
  merge rows; ``merged`` authors' posts are copied only to the author and to overflow readers.
- ``!m-{author}`` merge rows at the head of a reader's ``timelines`` partition (they sort
  before every post row key, so the page query that reads the newest posts reads them
  first), counted by ``!n`` in the same transaction so a reader never merges more than
  ``max_merged`` authors per page.
- ``~copy-{reader}`` in a merged author's ``subjectFollowers`` partition: a reader whose
  merge rows were full when it met the author, so the author's posts are copied to it.

Merging is always correct for an author the reader follows: it shows exactly the author's
live posts, and the page ignores the reader's copies of that author. So a stale merge row
costs a query, never a wrong page; what must hold is that a follower of a ``merged`` author
has a merge row or an overflow row.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableEntity, TableTransactionError, UpdateMode

from timeline.errors import contention
from timeline.model.entities import Page
from timeline.retry import ETAG_ATTEMPTS
from timeline.storage import calls
from timeline.storage.accounts import Storage
from timeline.storage.calls import (
    TransactionOperation,
    failed_index,
    query_page,
    submit_batch,
    transact,
)
from timeline.storage.names import SUBJECT_FOLLOWERS, TIMELINES
from timeline.tables.counters import (
    COUNT_PREFIX,
    COUNT_RANGE,
    MEMBERSHIPS_PREFIX,
    REACH_BOUNDS,
    by_partition,
    total,
)
from timeline.tables.rows import (
    FIRST_POST_KEY,
    delete_entity,
    get_entity,
    if_unchanged,
    if_unchanged_etag,
)
from timeline.tables.traces import trace_of

COPIED, GROWING, MERGED, SHRINKING = "copied", "growing", "merged", "shrinking"
MODE_ROW = "~mode"
MERGE_PREFIX = "!m-"
MERGE_COUNT_ROW = "!n"
COPY_PREFIX = "~copy-"
_RANGE = "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high"


def merge_row_author(row_key: str) -> str | None:
    return row_key.removeprefix(MERGE_PREFIX) if row_key.startswith(MERGE_PREFIX) else None


@dataclass(frozen=True, slots=True)
class AuthorMode:
    """An author's hybrid fan-out state, with the etag it was read with (None: no row)."""

    state: str = COPIED
    token: str = ""
    """The regrade message that owns a ``growing`` or ``shrinking`` state."""
    since: int = 0
    """When the state last became ``merged`` (.NET ticks of the worker that made it so)."""
    etag: str | None = None

    @property
    def copies_to_followers(self) -> bool:
        return self.state != MERGED


class AudienceRepository:
    """Who reads an author's posts: the follower rows, the hybrid mode, the merge rows.

    About 200 lines: the mode, the merge rows and the counters change together under one
    ETag discipline."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    async def mode(self, author: str) -> AuthorMode:
        entity = await get_entity(self._storage, SUBJECT_FOLLOWERS, author, MODE_ROW)
        if entity is None:
            return AuthorMode()
        return AuthorMode(
            state=str(entity["state"]),
            token=str(entity.get("token", "")),
            since=int(entity.get("since", 0)),
            etag=str(entity.metadata["etag"]),
        )

    async def change_mode(
        self, author: str, seen: AuthorMode, state: str, *, token: str = "", since: int = 0
    ) -> bool:
        """Move the author from ``seen`` to ``state``; False if it changed since it was read."""
        row = {
            "PartitionKey": author,
            "RowKey": MODE_ROW,
            "state": state,
            "token": token,
            "since": str(since),
        }
        async with self._storage.guard():
            client = self._storage.table(SUBJECT_FOLLOWERS, author)
            try:
                if seen.etag is None:
                    await calls.create_entity(client, row)
                else:
                    await calls.update_entity(
                        client, row, mode=UpdateMode.REPLACE, **if_unchanged_etag(seen.etag)
                    )
            except (ResourceExistsError, ResourceModifiedError, ResourceNotFoundError):
                return False
        return True

    async def authors_to_check(self, threshold: int) -> AsyncIterator[str]:
        """Every author whose reach (followers and list memberships) is at least
        ``threshold``, or with a mode row (a full scan of each account's ``subjectFollowers``
        counter and mode rows: for the admin command)."""
        for account in range(len(self._storage.account_ids)):
            async for author, rows in by_partition(self._metadata_rows(account)):
                keys = {row["RowKey"] for row in rows}
                if MODE_ROW in keys or (threshold and _reach(rows) >= threshold):
                    yield author

    async def _metadata_rows(self, account: int) -> AsyncIterator[TableEntity]:
        """One account's counter rows (followers' and memberships', which sort together:
        nothing else of a ``subjectFollowers`` partition lies between them) and mode rows,
        in key order."""
        client = self._storage.account_table(account, SUBJECT_FOLLOWERS)
        continuation: dict[str, str] | None = None
        while True:
            async with self._storage.guard():  # one storage call per page
                page = await query_page(
                    client,
                    f"( {COUNT_RANGE} ) or RowKey eq @mode",  # a parameter ends at a space
                    {**REACH_BOUNDS, "mode": MODE_ROW},
                    select=["PartitionKey", "RowKey", "n"],
                    limit=1000,
                    continuation=continuation,
                )
            for row in page.items:
                yield row
            continuation = page.continuation
            if continuation is None:
                return

    async def merged_authors(self, reader: str) -> list[str]:
        """Every author with a merge row in the reader's timeline."""
        authors: list[str] = []
        continuation: dict[str, str] | None = None
        while True:
            page = await self._range_page(TIMELINES, reader, MERGE_PREFIX, 1000, continuation)
            authors.extend(page.items)
            continuation = page.continuation
            if continuation is None:
                return authors

    async def add_merge(self, reader: str, author: str, max_merged: int) -> bool:
        """Give the reader a merge row for the author (rewriting an existing one, so a pending
        conditional removal fails); False when the reader already merges ``max_merged``."""
        row = {"PartitionKey": reader, "RowKey": MERGE_PREFIX + author}
        for _ in range(ETAG_ATTEMPTS):
            head = await self._head(reader)
            existing = head.get(row["RowKey"])
            counter = head.get(MERGE_COUNT_ROW)
            count = _count(counter)
            if existing is None and count >= max_merged:
                return False
            write: list[TransactionOperation] = (
                [("create", row), _counter_operation(reader, counter, count + 1)]
                if existing is None
                else [("update", row, {"mode": UpdateMode.REPLACE, **if_unchanged(existing)})]
            )  # a counted row is rewritten only while it still exists (else: count it again)
            try:
                await transact(self._storage, TIMELINES, reader, write)
                return True
            except TableTransactionError as error:
                if failed_index(error, 404, 409, 412) is None:
                    raise
        raise contention()

    async def _head(self, reader: str) -> dict[str, TableEntity]:
        """The rows before the reader's posts (merge rows and their count): one query."""
        async with self._storage.guard():
            page = await query_page(
                self._storage.reader(TIMELINES, reader),
                _RANGE,
                {"pk": reader, "low": "!", "high": FIRST_POST_KEY},
                select=["RowKey", "n"],
                limit=1000,
                continuation=None,
            )
        return {entity["RowKey"]: entity for entity in page.items}

    async def merge_etag(self, reader: str, author: str) -> str | None:
        entity = await get_entity(self._storage, TIMELINES, reader, MERGE_PREFIX + author)
        return None if entity is None else str(entity.metadata["etag"])

    async def remove_merge(self, reader: str, author: str, etag: str | None = None) -> bool:
        """Remove the merge row (only if it still has ``etag``, when given), leaving its removal
        trace, and uncount it."""
        for _ in range(ETAG_ATTEMPTS):
            entity = await get_entity(self._storage, TIMELINES, reader, MERGE_PREFIX + author)
            if entity is None or (etag is not None and entity.metadata["etag"] != etag):
                return False
            counter = await get_entity(self._storage, TIMELINES, reader, MERGE_COUNT_ROW)
            count = _count(counter)
            keys = {"PartitionKey": reader, "RowKey": MERGE_PREFIX + author}
            condition = if_unchanged(entity)
            try:
                await transact(
                    self._storage,
                    TIMELINES,
                    reader,
                    [
                        ("delete", keys, condition),
                        trace_of(keys),  # a live stream sees the author stop being merged
                        _counter_operation(reader, counter, count - 1),
                    ],
                )
                return True
            except TableTransactionError as error:
                if failed_index(error, 404, 409, 412) is None:
                    raise
        raise contention()

    async def add_copy(self, author: str, reader: str) -> None:
        """Record an overflow reader: the merged author's posts are copied to it."""
        row = {"PartitionKey": author, "RowKey": COPY_PREFIX + reader}
        await submit_batch(self._storage, SUBJECT_FOLLOWERS, author, [("upsert", row)])

    async def copy_etag(self, author: str, reader: str) -> str | None:
        entity = await get_entity(self._storage, SUBJECT_FOLLOWERS, author, COPY_PREFIX + reader)
        return None if entity is None else str(entity.metadata["etag"])

    async def remove_copy(self, author: str, reader: str, etag: str | None = None) -> None:
        await delete_entity(self._storage, SUBJECT_FOLLOWERS, author, COPY_PREFIX + reader, etag)

    async def copy_readers_page(
        self, author: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[str]:
        """One page of the author's overflow readers (sorted, like followers)."""
        return await self._range_page(SUBJECT_FOLLOWERS, author, COPY_PREFIX, limit, continuation)

    async def _range_page(
        self,
        table: str,
        partition: str,
        prefix: str,
        limit: int,
        continuation: dict[str, str] | None,
    ) -> Page[str]:
        """One page of the partition's row keys that start with ``prefix``, without it."""
        async with self._storage.guard():
            page = await query_page(
                self._storage.reader(table, partition),
                _RANGE,
                _prefix_range(partition, prefix),
                select=["RowKey"],
                limit=limit,
                continuation=continuation,
            )
        keys = [entity["RowKey"].removeprefix(prefix) for entity in page.items]
        return Page(keys, page.continuation)


def _prefix_range(partition: str, prefix: str) -> dict[str, str]:
    """Row keys starting with ``prefix``: from it up to the next possible prefix."""
    return {"pk": partition, "low": prefix, "high": prefix[:-1] + chr(ord(prefix[-1]) + 1)}


def _count(counter: TableEntity | None) -> int:
    return 0 if counter is None else int(counter["n"])


def _counter_operation(
    reader: str, counter: TableEntity | None, count: int
) -> TransactionOperation:
    row = {"PartitionKey": reader, "RowKey": MERGE_COUNT_ROW, "n": max(0, count)}
    if counter is None:
        return ("create", row)
    return ("update", row, {"mode": UpdateMode.REPLACE, **if_unchanged(counter)})


def _reach(rows: list[TableEntity]) -> int:
    """An author's followers and list memberships, from its counter rows."""
    return sum(
        total(row for row in rows if str(row["RowKey"]).startswith(prefix))
        for prefix in (COUNT_PREFIX, MEMBERSHIPS_PREFIX)
    )
