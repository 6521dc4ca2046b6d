"""Reposts and replies in ``posts``: metadata rows beside the posts they concern.

- A repost is its row ``~rp-{post_id}`` in the *reposter's* partition (``author``: the
  original's author, ``repost_id``: this repost, whose id orders its copies): the truth, one
  row per reposter and post, so a second repost of the same post is the same repost. An
  undo turns it ``void`` (a tombstone: a resent write of the undone repost cannot revive it).
- Its index row ``~rpof-{post_id}-{reposter}-{repost_id}`` in the *original author's*
  partition is written before the truth: a delete of the original reads them all to remove
  every repost's copies. A request that finds the truth changed meanwhile drops it.
- A reply's index row ``~re-{post_id}-{reply row key}`` in the *replied-to author's*
  partition (``author``, ``post``: the reply) lists a post's replies newest first; it is
  written before the reply, so the listing checks each reply is live.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from typing import Any

from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableEntity, UpdateMode

from timeline.errors import StorageUnavailableError
from timeline.model.entities import Page, Post
from timeline.model.keys import post_row_key
from timeline.storage import calls
from timeline.storage.accounts import Storage
from timeline.storage.calls import query_page, submit_batch
from timeline.storage.names import POSTS
from timeline.tables.rows import (
    PARTITION,
    create_entity,
    delete_entity,
    etag,
    get_entity,
    if_unchanged,
    merge_existing,
)

REPOST = "~rp-"
REPOSTS_OF = "~rpof-"
REPLIES_OF = "~re-"
DETACHING = "detaching"
_RANGE = f"{PARTITION} and RowKey gt @first and RowKey lt @end"


def index_row_key(post_id: str, reposter: str, repost_id: str) -> str:
    """A repost's row in its original's index: one per repost, not per reposter, so a
    repost request that loses a race never hides the winner from the delete's passes."""
    return f"{REPOSTS_OF}{post_id}-{reposter}-{repost_id}"


def _replied_post(reply_row_key: str) -> str:
    """The post a reply's index row files it under (``~re-{post_id}-{reply row key}``)."""
    return reply_row_key.removeprefix(REPLIES_OF).split("-", 1)[0]


def live_repost_id(row: TableEntity | None) -> str | None:
    """The repost id a reposter's row names while it is live (None: no row, or void)."""
    return None if row is None or row.get("void") else str(row["repost_id"])


def _keys(row: TableEntity) -> dict[str, str]:
    return {"PartitionKey": row["PartitionKey"], "RowKey": row["RowKey"]}


def _range_end(prefix: str) -> str:
    """The first key after every key that starts with ``prefix`` (keys here end in ``-``)."""
    return prefix[:-1] + "."


class RepostsRepository:
    """Repost truth and index rows, and reply index rows, in ``posts``."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    async def truth(self, reposter: str, post_id: str) -> TableEntity | None:
        """The reposter's row for the post (live or void), or None."""
        return await get_entity(self._storage, POSTS, reposter, f"{REPOST}{post_id}")

    async def live_id(self, reposter: str, post_id: str) -> str | None:
        """The id of the reposter's live repost of the post, if any."""
        return live_repost_id(await self.truth(reposter, post_id))

    async def note_index(self, author: str, post_id: str, reposter: str, repost_id: str) -> None:
        """File the repost under the original (before the truth is written)."""
        row = {
            "PartitionKey": author,
            "RowKey": index_row_key(post_id, reposter, repost_id),
            "reposter": reposter,
            "repost_id": repost_id,
        }
        await submit_batch(self._storage, POSTS, author, [("upsert", row)])

    async def create(self, reposter: str, author: str, post_id: str, repost_id: str) -> None:
        """Write the truth row: a new one, or over a void one (an undone earlier repost, if
        unchanged since read). A lost race is a 503: try again. When nothing was sent, this
        repost can never be stored, so it has no entries: its index row goes. A write
        refused as it went out may be a retry's resend meeting its own first try, so the row
        is read again (this repost seen stored is success); its index row stays."""
        row: dict[str, Any] = {
            "PartitionKey": reposter,
            "RowKey": f"{REPOST}{post_id}",
            "author": author,
            "repost_id": repost_id,
        }
        current = await self.truth(reposter, post_id)
        if current is None:
            if await create_entity(self._storage, POSTS, row):
                return
        elif current.get("void") and current.get("repost_id") != repost_id:
            with suppress(ResourceModifiedError, ResourceNotFoundError):
                async with self._storage.guard(kind="write-1"):
                    await calls.update_entity(
                        self._storage.table(POSTS, reposter),
                        row,
                        UpdateMode.REPLACE,
                        **if_unchanged(current),
                    )
                return
        else:  # another repost live, or this one undone: nothing was sent
            await self.drop_index(author, post_id, reposter, repost_id)
            raise StorageUnavailableError("the repost changed meanwhile; try again", retry_after=1)
        if live_repost_id(await self.truth(reposter, post_id)) == repost_id:
            return  # a resend met the row its first try stored (that answer was lost)
        raise StorageUnavailableError("the repost changed meanwhile; try again", retry_after=1)

    async def remove(self, reposter: str, post_id: str, repost_id: str) -> None:
        """Undo the repost: its row turns ``void`` (if it is still this repost, unchanged
        since read), so a delivery of it, however late, finds it undone at once, and a resent
        API write of it fails."""
        row = await self.truth(reposter, post_id)
        if row is None or row.get("void") or row.get("repost_id") != repost_id:
            return
        void = {**_keys(row), "repost_id": repost_id, "void": True}
        async with self._storage.guard(kind="write-1"):
            with suppress(ResourceModifiedError, ResourceNotFoundError):
                await calls.update_entity(
                    self._storage.table(POSTS, reposter),
                    void,
                    UpdateMode.REPLACE,
                    **if_unchanged(row),
                )

    async def drop_void(self, reposter: str, post_id: str, repost_id: str) -> None:
        """Delete the repost's row once void (its undo's last pass: every delivery of it has
        seen it void or ended, and the API sends its write only within its write deadline)."""
        row = await self.truth(reposter, post_id)
        if row is None or not row.get("void") or row.get("repost_id") != repost_id:
            return
        await delete_entity(self._storage, POSTS, reposter, row["RowKey"], etag(row))

    async def live_reposts(
        self, reposter: str, first_ticks: int = 0, last_post: str | None = None
    ) -> list[tuple[str, str, str]]:
        """``(repost_id, author, post_id)`` of the reposter's live reposts of the posts made
        from ``first_ticks`` on (up to the post ``last_post``, if given), in the order of those
        posts: one query per 1,000 repost rows in that range (void ones too)."""
        first = f"{REPOST}{first_ticks:016x}"
        end = None if last_post is None else f"{REPOST}{last_post}."
        found: list[tuple[str, str, str]] = []
        continuation: dict[str, str] | None = None
        while True:
            page = await self._range(reposter, REPOST, 1000, continuation, first=first, end=end)
            found.extend(
                (str(row["repost_id"]), str(row["author"]), row["RowKey"][len(REPOST) :])
                for row in page.items
                if not row.get("void")
            )
            continuation = page.continuation
            if continuation is None:
                return found

    async def own_page(
        self, reposter: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[tuple[str, str, str]]:
        """One query's worth of the reposter's live ``(author, post_id, repost_id)`` (an
        account's deletion undoes each; a void one's own undo is under way, and its last
        pass drops the row)."""
        rows = await self._range(reposter, REPOST, limit, continuation)
        found = [
            (str(row["author"]), row["RowKey"][len(REPOST) :], str(row["repost_id"]))
            for row in rows.items
            if not row.get("void")
        ]
        return Page(found, rows.continuation)

    async def reposts_page(
        self,
        author: str,
        post_id: str,
        after: tuple[str, str] | None,
        limit: int,
        continuation: dict[str, str] | None = None,
    ) -> Page[tuple[str, str]]:
        """One query's worth of ``(reposter, repost_id)`` filed under the post, in key order,
        after the row of ``after`` (a reposter and repost; None: from the first);
        ``continuation`` None when none are left."""
        prefix = f"{REPOSTS_OF}{post_id}-"
        first = None if after is None else index_row_key(post_id, *after)
        rows = await self._range(author, prefix, limit, continuation, first=first)
        found = [(str(row["reposter"]), str(row["repost_id"])) for row in rows.items]
        return Page(found, rows.continuation)

    async def indexed(self, author: str, post_id: str, reposter: str, repost_id: str) -> bool:
        """Whether the repost's index row is still there (its purge's last step drops it)."""
        key = index_row_key(post_id, reposter, repost_id)
        return await get_entity(self._storage, POSTS, author, key, select=["RowKey"]) is not None

    async def drop_index(self, author: str, post_id: str, reposter: str, repost_id: str) -> None:
        """Remove the repost's index row (gone already is fine)."""
        await delete_entity(
            self._storage, POSTS, author, index_row_key(post_id, reposter, repost_id)
        )

    async def note_reply(self, target_author: str, target_post: str, reply: Post) -> None:
        """File a reply under the post it answers (before the reply itself is written)."""
        row = {
            "PartitionKey": target_author,
            "RowKey": f"{REPLIES_OF}{target_post}-{reply.row_key}",
            "author": reply.author,
            "post": reply.post_id,
        }
        await submit_batch(self._storage, POSTS, target_author, [("upsert", row)])

    async def drop_reply(self, target_author: str, target_post: str, reply_id: str) -> None:
        """Remove a deleted reply's index row (absent: nothing to do)."""
        key = f"{REPLIES_OF}{target_post}-{post_row_key(reply_id)}"
        await delete_entity(self._storage, POSTS, target_author, key)

    async def replies_page(
        self, author: str, post_id: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[tuple[str, str]]:
        """One query's worth of ``(reply author, reply id)`` filed under the post, newest
        first (the index may name a reply that was never stored or is deleted)."""
        rows = await self._range(author, f"{REPLIES_OF}{post_id}-", limit, continuation)
        return Page([(str(r["author"]), str(r["post"])) for r in rows.items], rows.continuation)

    async def replies_to_page(
        self, author: str, limit: int, continuation: dict[str, str] | None, since: int
    ) -> Page[tuple[str, str, str]]:
        """One query's worth of ``(reply author, reply id, post id)`` filed under any of the
        author's posts (a deleted account's: ``timeline.delivery.replies``), but those whose
        detaching was begun by a message of the deletion's sweep ``since`` or a later one
        (``DETACHING``)."""
        rows = await self._range(author, REPLIES_OF, limit, continuation)
        found = [
            (str(r["author"]), str(r["post"]), _replied_post(str(r["RowKey"])))
            for r in rows.items
            if r.get(DETACHING) is None or int(r[DETACHING]) < since
        ]
        return Page(found, rows.continuation)

    async def note_detaching(
        self, target_author: str, target_post: str, reply_id: str, sweep: int
    ) -> None:
        """Note on a reply's index row that a pass sent by the deletion's ``sweep`` has
        marked the reply (the row gone already is fine: it is never created)."""
        key = f"{REPLIES_OF}{target_post}-{post_row_key(reply_id)}"
        row = {"PartitionKey": target_author, "RowKey": key, DETACHING: sweep}
        await merge_existing(self._storage, POSTS, row)

    async def _range(
        self,
        partition: str,
        prefix: str,
        limit: int,
        continuation: dict[str, str] | None,
        *,
        first: str | None = None,
        end: str | None = None,
    ) -> Page[TableEntity]:
        """Rows whose key starts with ``prefix`` (and sorts after ``first``, before ``end``):
        one query."""
        bounds = {"pk": partition, "first": first or prefix, "end": end or _range_end(prefix)}
        async with self._storage.guard():
            return await query_page(
                self._storage.reader(POSTS, partition),
                _RANGE,
                bounds,
                select=None,
                limit=limit,
                continuation=continuation,
            )


async def live_replies(posts: Any, replies: list[tuple[str, str]]) -> list[Post]:
    """The replies among ``replies`` that exist now (a point read each, all at once)."""
    found = await asyncio.gather(*(posts.get(author, post_id) for author, post_id in replies))
    return [post for post in found if post is not None]
