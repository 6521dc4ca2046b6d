"""The two follow tables, one module because every follow change writes both sides of one edge.

- ``subjectFollowers`` (the subject's partition, the one fan-out reads) holds the follow with
  the subject's follower count: this row is the truth about who follows whom.
- ``subjectFollowing`` is an index derived from it (the follower's partition, with the
  follower's count), kept in step by ``FollowsRepository.sync_index``.

A request to follow a locked user is a ``~request-{follower}`` row beside the follows it may
become (a metadata key: listings and fan-out never read it). An approval deletes it, on the
condition that it is unchanged since read, and creates the follow in the same transaction:
a follow of a locked user exists only through a request that was still there, whatever
withdrawal or refusal raced it and wherever a process died.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableEntity, TableTransactionError, UpdateMode

from timeline.errors import contention
from timeline.model.entities import Edge, Page
from timeline.model.keys import LIST_PREFIX, list_owner
from timeline.retry import ETAG_ATTEMPTS
from timeline.storage import calls
from timeline.storage.accounts import Storage
from timeline.storage.calls import (
    TransactionOperation,
    failed_index,
    query_page,
    transact,
    update_entity,
)
from timeline.storage.names import SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING
from timeline.tables.counters import (
    COUNT_PREFIX,
    MEMBERSHIPS_PREFIX,
    count_of,
    counts_of,
    transact_counted,
)
from timeline.tables.rows import (
    LISTING,
    META,
    PARTITION,
    create_entity,
    delete_entity,
    drop_partition,
    edge_page,
    get_entity,
    if_unchanged,
    partition_page,
    row_keys_between,
)

INACTIVE = "inactive"
"""On a follow row: the follower is dormant (``timeline.tables.activity``); posts skip it."""
INACTIVE_FROM = "inactive_from"
"""On a follow row marked ``inactive``: the posts it skips are those made from then on
(epoch seconds: the dormancy's ``since``); older posts always reach the reader."""
REPOSTS = "reposts"
"""On a follow row: ``False`` when the follower hides the subject's reposts."""
LEFT_PREFIX = f"{META}unfollowed-"
"""``~unfollowed-{reader}`` in the subject's partition: the reader's index row naming the
subject is (or may be) inactive (``FollowsRepository.sync_index``). It sorts after the
counters, so a count's range query never reads it."""
REQUEST_PREFIX = f"{META}request-"
"""A follow request's row key, ``~request-{follower}``, in the subject's partition."""
_REQUESTS = "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high"
_KEYS_PER_FILTER = 14
"""Azure Table Storage allows at most 15 comparisons in one filter (one is the partition)."""


def _now() -> datetime:
    return datetime.now(UTC)


class FollowsRepository:
    """Follows: ``subjectFollowers`` is the truth, ``subjectFollowing`` its derived index."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    async def add(
        self, follower: str, subject: str, since: datetime, *, reposts: bool = True
    ) -> bool:
        """Record the follow and count it, atomically; False if it already existed.
        ``reposts=False`` (stored on the row as ``reposts``) hides the subject's reposts."""
        edge: dict[str, Any] = {"PartitionKey": subject, "RowKey": follower, "since": since}
        if not reposts:
            edge[REPOSTS] = False
        try:
            await transact_counted(
                self._storage, SUBJECT_FOLLOWERS, subject, [("create", edge)], 1, _counter(follower)
            )
        except TableTransactionError as error:
            if failed_index(error, 409) == 0:
                return False
            raise
        return True

    async def request(self, follower: str, subject: str, *, reposts: bool = True) -> None:
        """Ask to follow (a repeated request keeps the first row, etag and all, so an
        approval that read it still finds it unchanged); ``reposts=False`` is kept on the
        row for the follow it becomes. The follower's index row for the pair is made first
        (inactive, unless one is there): so the request is found from the follower's side,
        as a follow is, whatever interleaving or crash."""
        if await get_entity(self._storage, SUBJECT_FOLLOWING, follower, subject) is None:
            await self.sync_index(follower, subject)
        row: dict[str, Any] = {
            "PartitionKey": subject,
            "RowKey": REQUEST_PREFIX + follower,
            "since": _now(),
        }
        if not reposts:
            row[REPOSTS] = False
        await create_entity(self._storage, SUBJECT_FOLLOWERS, row)

    async def request_of(self, follower: str, subject: str) -> TableEntity | None:
        return await get_entity(
            self._storage, SUBJECT_FOLLOWERS, subject, REQUEST_PREFIX + follower
        )

    async def drop_request(self, follower: str, subject: str) -> None:
        """Withdraw or refuse the request, if there is one."""
        await delete_entity(self._storage, SUBJECT_FOLLOWERS, subject, REQUEST_PREFIX + follower)

    async def approve(self, follower: str, subject: str, request: TableEntity) -> bool:
        """Consume the request (unchanged since read) and record the follow, counted, in one
        transaction; False when the request went meanwhile. A follow that exists already
        (made while the subject was unlocked) consumes the request alone."""
        keys = {"PartitionKey": subject, "RowKey": REQUEST_PREFIX + follower}
        edge: dict[str, Any] = {"PartitionKey": subject, "RowKey": follower, "since": _now()}
        if request.get(REPOSTS) is False:
            edge[REPOSTS] = False
        rows: list[TransactionOperation] = [
            ("delete", keys, if_unchanged(request)),
            ("create", edge),
        ]
        try:
            await transact_counted(self._storage, SUBJECT_FOLLOWERS, subject, rows, +1)
        except TableTransactionError as error:
            if failed_index(error, 404, 412) == 0:
                return False
            if failed_index(error, 409) != 1:
                raise
            try:  # following already: the request only goes (unless it went meanwhile)
                await transact(self._storage, SUBJECT_FOLLOWERS, subject, rows[:1])
            except TableTransactionError as error:
                if failed_index(error, 404, 412) != 0:
                    raise
        return True

    async def requests_page(
        self, subject: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[Edge]:
        """Requests waiting for the subject's answer, by follower id."""
        high = REQUEST_PREFIX[:-1] + chr(ord(REQUEST_PREFIX[-1]) + 1)
        async with self._storage.guard():
            page = await query_page(
                self._storage.reader(SUBJECT_FOLLOWERS, subject),
                _REQUESTS,
                {"pk": subject, "low": REQUEST_PREFIX, "high": high},
                select=["RowKey", "since"],
                limit=limit,
                continuation=continuation,
            )
        edges = [
            Edge(str(row["RowKey"])[len(REQUEST_PREFIX) :], row["since"]) for row in page.items
        ]
        return Page(edges, page.continuation)

    async def remove(self, follower: str, subject: str) -> bool:
        """Remove the follow and uncount it, atomically; False if there was none."""
        for _ in range(ETAG_ATTEMPTS):
            edge = await get_entity(self._storage, SUBJECT_FOLLOWERS, subject, follower)
            if edge is None:
                return False
            keys = {"PartitionKey": subject, "RowKey": follower}
            rows: list[TransactionOperation] = [("delete", keys, if_unchanged(edge))]
            try:
                await transact_counted(
                    self._storage, SUBJECT_FOLLOWERS, subject, rows, -1, _counter(follower)
                )
                return True
            except TableTransactionError as error:
                if failed_index(error, 404, 412) != 0:
                    raise
        raise contention()

    async def sync_index(self, follower: str, subject: str) -> None:
        """Make ``subjectFollowing`` agree with the truth for one pair.

        Read the index row, then the truth, then write the index row on the condition that it
        is unchanged since it was read; it is never deleted (only marked inactive), so a stale
        sync can never recreate a row another sync has since written. Always writing (even
        when nothing changed) is what makes every later sync invalidate an earlier stale one.
        """
        for _ in range(ETAG_ATTEMPTS):
            index = await get_entity(self._storage, SUBJECT_FOLLOWING, follower, subject)
            truth = await get_entity(self._storage, SUBJECT_FOLLOWERS, subject, follower)
            was_active = index is not None and bool(index.get("active"))
            if truth is None and (index is None or was_active):
                await self._note_left(follower, subject)
            row = _index_row(follower, subject, truth, index)
            write: TransactionOperation = (
                ("create", row)
                if index is None
                else ("update", row, {"mode": UpdateMode.REPLACE, **if_unchanged(index)})
            )
            delta = int(truth is not None) - int(was_active)
            try:
                await transact_counted(self._storage, SUBJECT_FOLLOWING, follower, [write], delta)
                return
            except TableTransactionError as error:
                if failed_index(error, 409, 412, 404) is None:
                    raise
        raise contention()

    async def _note_left(self, follower: str, subject: str) -> None:
        """File ``~unfollowed-{follower}`` in the subject's partition before an index row turns (or
        is made) inactive: every inactive index row naming the subject is found from the
        subject's side (its account's deletion ends each)."""
        row = {"PartitionKey": subject, "RowKey": LEFT_PREFIX + follower}
        await calls.submit_batch(self._storage, SUBJECT_FOLLOWERS, subject, [("upsert", row)])

    async def drop_left(self, follower: str, subject: str) -> None:
        """Delete the pair's ``~unfollowed-`` row (after its index row is gone)."""
        await delete_entity(self._storage, SUBJECT_FOLLOWERS, subject, LEFT_PREFIX + follower)

    async def left_page(
        self, subject: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[str]:
        """A page of the readers with an inactive index row naming the subject (one query)."""
        bounds = {"pk": subject, "low": LEFT_PREFIX, "high": LEFT_PREFIX[:-1] + "."}
        async with self._storage.guard(kind="query"):
            page = await query_page(
                self._storage.reader(SUBJECT_FOLLOWERS, subject),
                _REQUESTS,
                bounds,
                select=["RowKey"],
                limit=limit,
                continuation=continuation,
            )
        readers = [str(row["RowKey"]).removeprefix(LEFT_PREFIX) for row in page.items]
        return Page(readers, page.continuation)

    async def drop_index_row(self, follower: str, subject: str) -> None:
        """Delete one index row (a gone list's member, once its membership has ended)."""
        await delete_entity(self._storage, SUBJECT_FOLLOWING, follower, subject)

    async def drop_index(self, follower: str) -> None:
        """Delete the follower's whole index (a deleted list's members, once each has
        ended)."""
        await drop_partition(self._storage, SUBJECT_FOLLOWING, follower)

    async def history(self, follower: str, subject: str) -> PairHistory:
        """The pair's index row (its follow and unfollow times): one point read."""
        index = await get_entity(self._storage, SUBJECT_FOLLOWING, follower, subject)
        if index is None:
            return PairHistory()
        since = index.get("since")
        return PairHistory(
            active=bool(index.get("active")),
            since=since.timestamp() if isinstance(since, datetime) else 0.0,
            left_at=float(index.get(LEFT_AT) or 0),
            left_before=float(index.get(LEFT_BEFORE) or 0),
        )

    async def repair_index(self, follower: str, subject: str) -> None:
        """Sync the index only if it disagrees with the truth (a change made elsewhere, or a
        request that died between the two writes)."""
        index = await get_entity(self._storage, SUBJECT_FOLLOWING, follower, subject)
        truth = await self.is_following(follower, subject)
        if (index is not None and bool(index.get("active"))) != truth:
            await self.sync_index(follower, subject)

    async def following_among(self, follower: str, subjects: Iterable[str]) -> set[str]:
        """Which of ``subjects`` the follower follows, from its ``subjectFollowing`` rows,
        kept in step with the truth by every follow and unfollow request before it answers
        (and by the worker after a request that died between the two writes): one query per
        14 subjects (a filter holds at most 15 comparisons), all at once."""
        wanted = sorted(set(subjects))
        chunks = [wanted[i : i + _KEYS_PER_FILTER] for i in range(0, len(wanted), _KEYS_PER_FILTER)]
        found = await asyncio.gather(*(self._following_rows(follower, chunk) for chunk in chunks))
        return set().union(*found)

    async def _following_rows(self, follower: str, subjects: list[str]) -> set[str]:
        keys = " or ".join(f"RowKey eq @s{i}" for i in range(len(subjects)))
        parameters = {"pk": follower, **{f"s{i}": subject for i, subject in enumerate(subjects)}}
        async with self._storage.guard():
            page = await query_page(
                self._storage.reader(SUBJECT_FOLLOWING, follower),
                f"{PARTITION} and ( {keys} )",  # the SDK reads a parameter up to a space
                parameters,
                select=["RowKey", "active"],
                limit=1000,
                continuation=None,
            )
        return {entity["RowKey"] for entity in page.items if entity.get("active")}

    async def follower_count(self, subject: str) -> int:
        return await count_of(self._storage, SUBJECT_FOLLOWERS, subject)

    async def reach(self, subject: str) -> int:
        """Timelines the subject's posts are copied into: its followers and the lists it is
        a member of (one range query over both counters): what the hybrid threshold weighs."""
        counts = await counts_of(
            self._storage, SUBJECT_FOLLOWERS, subject, COUNT_PREFIX, MEMBERSHIPS_PREFIX
        )
        return sum(counts)

    async def following_count(self, follower: str) -> int:
        """Whom the follower follows (a list: its members), from the index's count."""
        return await count_of(self._storage, SUBJECT_FOLLOWING, follower)

    async def is_following(self, follower: str, subject: str) -> bool:
        entity = await get_entity(
            self._storage, SUBJECT_FOLLOWERS, subject, follower, select=["RowKey"]
        )
        return entity is not None

    async def follow_row(self, follower: str, subject: str) -> TableEntity | None:
        """The follow with its ``reposts`` flag, or None: no follow."""
        return await get_entity(
            self._storage, SUBJECT_FOLLOWERS, subject, follower, select=["RowKey", REPOSTS]
        )

    async def followers_page(
        self, subject: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[Edge]:
        """The subject's followers (users: the list rows, which sort after them, are left
        out by the query itself)."""
        return await edge_page(
            self._storage, SUBJECT_FOLLOWERS, subject, limit, continuation, until=LIST_PREFIX
        )

    async def following_page(
        self, follower: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[Edge]:
        page = await partition_page(
            self._storage,
            SUBJECT_FOLLOWING,
            follower,
            select=["RowKey", "since", "active"],
            limit=limit,
            continuation=continuation,
        )
        edges = [Edge(e["RowKey"], e["since"]) for e in page.items if e.get("active")]
        return Page(edges, page.continuation)

    async def index_page(
        self, follower: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[str]:
        """A page of the follower's index rows, active or ended (a list's members, those
        whose add died midway included): one query."""
        page = await partition_page(
            self._storage,
            SUBJECT_FOLLOWING,
            follower,
            select=["RowKey"],
            limit=limit,
            continuation=continuation,
        )
        return Page([str(row["RowKey"]) for row in page.items], page.continuation)

    async def following_after(
        self, follower: str, after: str, limit: int
    ) -> tuple[list[str], list[str]]:
        """The next ``limit`` rows after ``after`` in ``subjectFollowing`` order, as the
        subjects followed and those no longer followed: one query."""
        async with self._storage.guard():
            page = await query_page(
                self._storage.reader(SUBJECT_FOLLOWING, follower),
                f"{LISTING} and RowKey gt @after",
                {"pk": follower, "meta": META, "after": after},
                select=["RowKey", "active"],
                limit=limit,
                continuation=None,
            )
        rows = [(str(entity["RowKey"]), bool(entity.get("active"))) for entity in page.items]
        return [s for s, active in rows if active], [s for s, active in rows if not active]

    async def follower_ids_page(
        self, subject: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[str]:
        """Only the ids: what a fan-out needs, without parsing a timestamp per follower."""
        page = await partition_page(
            self._storage,
            SUBJECT_FOLLOWERS,
            subject,
            select=["RowKey"],
            limit=limit,
            continuation=continuation,
        )
        return Page([entity["RowKey"] for entity in page.items], page.continuation)

    async def active_follower_ids_page(
        self, subject: str, limit: int, continuation: dict[str, str] | None, posted_at: float
    ) -> tuple[Page[str], int]:
        """``follower_ids_page`` for a post made at ``posted_at`` (epoch seconds), without the
        followers marked inactive since then or earlier (``timeline.tables.activity``), and
        how many were left out."""
        page = await partition_page(
            self._storage,
            SUBJECT_FOLLOWERS,
            subject,
            select=["RowKey", INACTIVE, INACTIVE_FROM],
            limit=limit,
            continuation=continuation,
        )
        active = [entity["RowKey"] for entity in page.items if not _skips(entity, posted_at)]
        return Page(active, page.continuation), len(page.items) - len(active)

    async def set_reposts(self, follower: str, subject: str, reposts: bool) -> bool:
        """Show or hide the subject's reposts on an existing follow (a merge of the flag,
        if the row is unchanged since read); False when there is no follow."""
        for _ in range(ETAG_ATTEMPTS):
            edge = await get_entity(self._storage, SUBJECT_FOLLOWERS, subject, follower)
            if edge is None:
                return False
            if edge.get(REPOSTS, True) is reposts:
                return True
            row = {"PartitionKey": subject, "RowKey": follower, REPOSTS: reposts}
            try:
                async with self._storage.guard(kind="write-1"):
                    await update_entity(
                        self._storage.table(SUBJECT_FOLLOWERS, subject),
                        row,
                        UpdateMode.MERGE,
                        **if_unchanged(edge),
                    )
                return True
            except (ResourceModifiedError, ResourceNotFoundError):
                continue
        raise contention()

    async def repost_follower_ids_page(
        self, subject: str, limit: int, continuation: dict[str, str] | None, posted_at: float
    ) -> Page[str]:
        """``active_follower_ids_page`` for a repost made at ``posted_at``, without the
        followers who hide the subject's reposts (``reposts=false`` on the follow)."""
        page = await partition_page(
            self._storage,
            SUBJECT_FOLLOWERS,
            subject,
            select=["RowKey", INACTIVE, INACTIVE_FROM, REPOSTS],
            limit=limit,
            continuation=continuation,
        )
        wanted = [
            entity["RowKey"]
            for entity in page.items
            if entity.get(REPOSTS) is not False and not _skips(entity, posted_at)
        ]
        return Page(wanted, page.continuation)

    async def followers_between(self, subject: str, first: str, last: str) -> set[str]:
        """Followers of ``subject`` whose ids lie in ``[first, last]``."""
        return await row_keys_between(self._storage, SUBJECT_FOLLOWERS, subject, first, last)


def _counter(follower: str) -> str:
    """The subject's counter a follow moves: its followers', or for a list's membership its
    memberships' (so a list is no follower, yet counts toward the hybrid threshold)."""
    return MEMBERSHIPS_PREFIX if list_owner(follower) is not None else COUNT_PREFIX


def _skips(follow: TableEntity, posted_at: float) -> bool:
    """Whether a follow row marked inactive skips a post made at ``posted_at`` (a mark sets
    ``inactive_from`` with ``inactive``)."""
    return bool(follow.get(INACTIVE)) and posted_at >= float(follow[INACTIVE_FROM])


def is_follow_row(row_key: str) -> bool:
    """Whether a ``subjectFollowers`` row is a follow (they are all live: an unfollow deletes
    it): keyed by the follower, where metadata (counters, the audience's mode and
    copy rows) starts with ``~`` and a list's membership with ``|``."""
    return not row_key.startswith((META, LIST_PREFIX))


def _index_row(
    follower: str, subject: str, truth: TableEntity | None, index: TableEntity | None
) -> dict[str, Any]:
    source = truth if truth is not None else index
    since = source.get("since") if source is not None else None
    row = {
        "PartitionKey": follower,
        "RowKey": subject,
        "since": since or datetime.now(UTC),
        "active": truth is not None,
    }
    history = {key: index[key] for key in (LEFT_AT, LEFT_BEFORE) if index and key in index}
    if truth is None and index is not None and index.get("active"):  # an unfollow, recorded
        history = {LEFT_AT: time.time(), LEFT_BEFORE: float(index.get(LEFT_AT) or 0)}
    return row | history


LEFT_AT, LEFT_BEFORE = "left_at", "left_before"
"""An index row's history: when the pair was last seen unfollowed (Unix seconds) and the
time before that, written as the row turns inactive (what damps a toggling pair,
``timeline.delivery.follow``)."""


@dataclass(frozen=True, slots=True)
class PairHistory:
    """A follow pair's index row as read: active now, followed since, and its last two
    unfollows (0: none recorded)."""

    active: bool = False
    since: float = 0.0
    left_at: float = 0.0
    left_before: float = 0.0

    @property
    def previous_unfollow(self) -> float:
        """The unfollow before the current one, if the row already records the current
        (inactive), else the latest (the current unfollow's sync has not landed yet)."""
        return self.left_before if not self.active else self.left_at
