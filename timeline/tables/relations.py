"""The ``relations`` table: blocks, mutes and keyword filters, each in the partition of the
user it concerns (and lists: ``timeline.tables.lists``).

Row keys (user ids never contain ``.``, so ``{prefix}`` to ``{prefix[0]}.`` is one range):

- ``b-{other}`` in the blocker's partition: the block itself (the truth, and the blocker's list);
- ``B-{blocker}`` in the blocked user's partition: "blocked by", written *before* the block row
  and deleted *after* it, so a read of the blocked side finds it whenever the block exists;
- ``m-{other}`` in the muter's partition: a mute, with ``reposts`` (their reposts muted too)
  and ``expires_at`` (epoch seconds; absent: no end), filed in ``expiries`` when it has one;
  its reverse row, ``{muter}`` in the partition ``{other}~muted`` (``muted_by``), is written
  before it and deleted after it, with the same end;
- ``f-{slot}`` in the owner's partition (``00`` to ``63``, hex: ``MAX_FILTERS`` of them): a
  keyword filter, with ``filter_id`` (the slot, then random digits), ``phrase``, ``since``
  and ``expires_at`` as a mute's (``timeline.model.phrases`` matches it). A new filter
  takes a free slot with an insert, so concurrent creations never pass the cap.

A home read loads the reader's whole partition in one query (``hidden``): every row it needs
to filter the page sits there, and each user holds at most ``MAX_BLOCKS`` blocks,
``MAX_MUTES`` mutes and ``MAX_FILTERS`` filters of its own.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from azure.data.tables import TableEntity

from timeline.model.entities import Page
from timeline.model.phrases import NO_PHRASES, Phrases
from timeline.storage.accounts import Storage
from timeline.storage.calls import query_page, submit_batch
from timeline.storage.names import RELATIONS
from timeline.tables.expiries import FILTER, MUTE, ExpiriesRepository
from timeline.tables.lists import exclusive_list_id
from timeline.tables.rows import (
    PARTITION,
    delete_entity,
    get_entity,
)
from timeline.tables.slots import Slots

BLOCK, BLOCKED_BY, FILTERED, MUTED = "b-", "B-", "f-", "m-"


RelationKind = Literal["block", "mute"]


def pair_keys(
    kind: RelationKind, actor: str, other: str
) -> tuple[tuple[str, str], tuple[str, str]]:
    """The keys of ``actor``'s block or mute of ``other``, and of its reverse row."""
    if kind == "block":
        return (actor, BLOCK + other), (other, BLOCKED_BY + actor)
    return (actor, MUTED + other), (muted_by(other), actor)


def reverse_fields(kind: RelationKind, relation: TableEntity) -> dict[str, Any]:
    """What a reverse row carries of its relation: a mute's end (a block's carries its
    ``since``, which nothing reads)."""
    if kind == "block" or relation.get("expires_at") is None:
        return {}
    return {"expires_at": float(relation["expires_at"])}


def muted_by(user: str) -> str:
    """The partition of the reverse rows of the mutes of ``user``, a row per muter (written
    before the mute, deleted after it): what finds them when its account is deleted. Not the
    user's own partition, which its every home read loads."""
    return f"{user}{META_SUFFIX}"


META_SUFFIX = "~muted"
MAX_BLOCKS = 1000
MAX_MUTES = 1000
MAX_FILTERS = 100
MAX_HIDDEN_PAGES = 5
"""The most queries a read spends loading its reader's relations (1,000 rows each): the
whole partition's first page, the reader's own blocks, filters, lists and mutes (up to
three: 1,000 + 100 + 1,000 + 1,000 rows at every cap, read before more "blocked by" rows,
which sort first), then "blocked by" rows."""
_RANGE = "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high"
_FROM = _RANGE
_AFTER = "PartitionKey eq @pk and RowKey gt @after and RowKey lt @high"


def _any_of(*ranges: str) -> str:
    """A filter for the rows of one partition in any of the named key ranges (each named
    ``@x`` to ``@x_end`` in ``BLOCK_AND_MUTE_RANGES``)."""
    either = " or ".join(f"( RowKey ge @{name} and RowKey lt @{name}_end )" for name in ranges)
    return f"PartitionKey eq @pk and ( {either} )"


BLOCK_AND_MUTE_RANGES = {
    "by": BLOCKED_BY, "by_end": "B.", "own": BLOCK, "own_end": "b.", "mute": MUTED, "mute_end": "m."
}  # fmt: skip
BLOCKS_EITHER_WAY = _any_of("by", "own")
"""A user's blocks either way: its "blocked by" rows, then its own blocks."""
BLOCKS_OR_MUTES = _any_of("by", "own", "mute")
"""A user's blocks either way and its own mutes."""


@dataclass(frozen=True, slots=True)
class Mute:
    user_id: str
    since: datetime
    expires_at: float | None
    reposts: bool

    def applies(self, now: float) -> bool:
        return _applies(self.expires_at, now)


@dataclass(frozen=True, slots=True)
class Filter:
    filter_id: str
    phrase: str
    since: datetime
    expires_at: float | None

    def applies(self, now: float) -> bool:
        return _applies(self.expires_at, now)


@dataclass(frozen=True, slots=True)
class Hidden:
    """What a reader's relations hide: authors whose posts and reposts go (blocks either way,
    mutes with reposts), authors whose own posts only go (mutes without reposts), and texts
    holding one of its live filters' phrases."""

    authors: frozenset[str] = frozenset()
    reposters: frozenset[str] = frozenset()
    phrases: Phrases = NO_PHRASES
    exclusive_lists: frozenset[str] = frozenset()
    """The reader's exclusive lists (ids): their members' entries stay out of its home
    timeline (``timeline.reads.hidden`` loads the members when there are any)."""

    def __bool__(self) -> bool:
        return bool(self.authors or self.reposters or self.phrases)

    def hides(self, author: object, reposted_by: object = None, text: object = None) -> bool:
        return (
            author in self.authors
            or (reposted_by is not None and reposted_by in self.reposters)
            or self.phrases.found_in(text)
        )

    def hides_row(self, row: dict[str, Any]) -> bool:
        """A timeline or post row: by its author, its ``reposted_by`` when present, or its
        text."""
        return self.hides(row.get("author"), row.get("reposted_by"), row.get("text"))


class RelationsRepository:
    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._expiries = ExpiriesRepository(storage)
        self._filters = Slots(storage, RELATIONS, FILTERED, 2, "filter_id", 24)

    async def block(self, blocker: str, other: str) -> bool:
        """Record the block (its reverse row, then the block); False when it already
        existed."""
        if await self.blocks(blocker, other):
            return False
        since = datetime.now(UTC)
        relation, reverse = pair_keys("block", blocker, other)
        await self._upsert(_keyed(reverse, since=since))
        await self._upsert(_keyed(relation, since=since))
        return True

    async def unblock(self, blocker: str, other: str) -> None:
        await self._end("block", blocker, other)

    async def blocks(self, blocker: str, other: str) -> bool:
        row = await get_entity(self._storage, RELATIONS, blocker, BLOCK + other, select=["RowKey"])
        return row is not None

    async def blocked_either(self, one: str, other: str) -> bool:
        """Whether either user blocks the other: two point reads of the blocks themselves."""
        first, second = await asyncio.gather(self.blocks(one, other), self.blocks(other, one))
        return first or second

    async def mute(self, muter: str, other: str, expires_at: float | None, reposts: bool) -> None:
        """Record (or replace) the mute, its reverse row first; one with an expiry is filed
        first to be swept after it."""
        relation, reverse = pair_keys("mute", muter, other)
        ending = {} if expires_at is None else {"expires_at": float(expires_at)}
        if expires_at is not None:
            await self._expiries.note(MUTE, RELATIONS, *reverse, at=expires_at)
            await self._expiries.note(MUTE, RELATIONS, *relation, at=expires_at)
        await self._upsert(_keyed(reverse, **ending))
        await self._upsert(_keyed(relation, since=datetime.now(UTC), reposts=reposts, **ending))

    async def unmute(self, muter: str, other: str) -> None:
        await self._end("mute", muter, other)

    async def _end(self, kind: RelationKind, actor: str, other: str) -> None:
        """Remove the relation row, then its reverse row (idempotent)."""
        relation, reverse = pair_keys(kind, actor, other)
        await self._delete(*relation)
        await self._delete(*reverse)

    async def pair(
        self, kind: RelationKind, actor: str, other: str
    ) -> tuple[TableEntity | None, TableEntity | None]:
        """The relation row of ``actor``'s block or mute of ``other``, and its reverse row
        (None where missing): two point reads."""
        relation, reverse = pair_keys(kind, actor, other)
        found = await asyncio.gather(
            get_entity(self._storage, RELATIONS, *relation),
            get_entity(self._storage, RELATIONS, *reverse),
        )
        return found[0], found[1]

    async def write_reverse(
        self, kind: RelationKind, actor: str, other: str, relation: TableEntity
    ) -> None:
        """Write the reverse row as the relation asks: a mute's with its end, filed first to
        be swept after it (as a mute request files it)."""
        _, reverse = pair_keys(kind, actor, other)
        fields = reverse_fields(kind, relation)
        if "expires_at" in fields:
            await self._expiries.note(MUTE, RELATIONS, *reverse, at=fields["expires_at"])
        await self._upsert(_keyed(reverse, **fields))

    async def delete_pair_row(
        self, kind: RelationKind, actor: str, other: str, *, reverse: bool
    ) -> None:
        relation, reverse_row = pair_keys(kind, actor, other)
        await self._delete(*(reverse_row if reverse else relation))

    async def muters_page(
        self, user: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[str]:
        """One query's worth of the users who mute ``user`` (their reverse rows)."""
        async with self._storage.guard(kind="query"):
            page = await query_page(
                self._storage.reader(RELATIONS, muted_by(user)),
                PARTITION,
                {"pk": muted_by(user)},
                select=["RowKey"],
                limit=min(limit, 1000),
                continuation=continuation,
            )
        return Page([str(row["RowKey"]) for row in page.items], page.continuation)

    async def mute_of(self, muter: str, other: str) -> Mute | None:
        row = await get_entity(self._storage, RELATIONS, muter, MUTED + other)
        return None if row is None else _mute(row)

    async def count(self, user: str, prefix: str, most: int) -> int:
        """How many rows of ``prefix`` the user holds, counted up to ``most``."""
        counted, continuation = 0, None
        while counted < most:
            page = await self._range(user, prefix, ["RowKey"], most - counted, continuation)
            counted += len(page.items)
            continuation = page.continuation
            if continuation is None:
                break
        return counted

    async def blocks_page(
        self, blocker: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[tuple[str, datetime]]:
        page = await self._range(blocker, BLOCK, ["RowKey", "since"], limit, continuation)
        items = [(str(row["RowKey"])[2:], row["since"]) for row in page.items]
        return Page(items, page.continuation)

    async def ends_page(
        self, user: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[tuple[str, str]]:
        """One query's worth of the user's blocks both ways, as ``(blocker, blocked)``: its
        "blocked by" rows, then its own blocks."""
        async with self._storage.guard(kind="query"):
            page = await query_page(
                self._storage.reader(RELATIONS, user),
                BLOCKS_EITHER_WAY,
                {"pk": user, **BLOCK_AND_MUTE_RANGES},
                select=["RowKey"],
                limit=min(limit, 1000),
                continuation=continuation,
            )
        items = [
            (key[2:], user) if key.startswith(BLOCKED_BY) else (user, key[2:])
            for key in (str(row["RowKey"]) for row in page.items)
        ]
        return Page(items, page.continuation)

    async def mutes_page(
        self, muter: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[Mute]:
        select = ["RowKey", "since", "expires_at", "reposts"]
        page = await self._range(muter, MUTED, select, limit, continuation)
        return Page([_mute(row) for row in page.items], page.continuation)

    async def add_filter(self, owner: str, phrase: str, expires_at: float | None) -> Filter | None:
        """Record a new filter in a free one of the owner's ``MAX_FILTERS`` slots
        (``timeline.tables.slots``); None when all are taken. One with an expiry is filed to
        be swept after it."""
        since = datetime.now(UTC)
        fields: dict[str, Any] = {"phrase": phrase, "since": since}
        if expires_at is not None:
            fields["expires_at"] = float(expires_at)

        async def file_expiry(key: str) -> None:
            if expires_at is not None:
                await self._expiries.note(FILTER, RELATIONS, owner, key, at=expires_at)

        filter_id = await self._filters.take(owner, MAX_FILTERS, fields, file_expiry)
        return None if filter_id is None else Filter(filter_id, phrase, since, expires_at)

    async def delete_filter(self, owner: str, filter_id: str) -> bool:
        """Remove the filter; False when there is none with this id."""
        return await self._filters.remove(owner, filter_id)

    async def filters_page(
        self, owner: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[Filter]:
        select = ["RowKey", "filter_id", "phrase", "since", "expires_at"]
        page = await self._filters.page(owner, select, limit, continuation)
        return Page([_filter(row) for row in page.items], page.continuation)

    async def hidden(self, reader: str, now: float | None = None) -> tuple[Hidden, int]:
        """What the reader's blocks (either way), live mutes and live filters hide, and the
        queries it took: one for most readers (the whole partition); past 1,000 rows, the
        reader's own blocks, filters and mutes first (``B-`` sorts before ``b-``, ``f-`` and
        ``m-``), then more "blocked by"."""
        moment = time.time() if now is None else now
        found = _Found(set(), set(), set(), set())
        first = await self._hidden_page(reader, PARTITION, {"pk": reader}, None)
        _absorb(first.items, moment, found)
        queries = 1
        if first.continuation is not None:
            low = {"pk": reader, "low": BLOCK, "high": "~"}
            own: dict[str, str] | None = None
            while queries < MAX_HIDDEN_PAGES:
                page = await self._hidden_page(reader, _FROM, low, own)
                queries += 1
                _absorb(page.items, moment, found)
                own = page.continuation
                if own is None:
                    break
            last = str(first.items[-1]["RowKey"]) if first.items else ""
            after = last if last.startswith(BLOCKED_BY) else ""  # else: every B- row was read
            more = {"pk": reader, "after": after, "high": BLOCKED_BY[0] + "."}
            rest: dict[str, str] | None = None
            while queries < MAX_HIDDEN_PAGES and after.startswith(BLOCKED_BY):
                page = await self._hidden_page(reader, _AFTER, more, rest)
                queries += 1
                _absorb(page.items, moment, found)
                rest = page.continuation
                if rest is None:
                    break
        hidden = Hidden(
            frozenset(found.authors),
            frozenset(found.reposters),
            Phrases(frozenset(found.phrases)),
            frozenset(found.exclusive_lists),
        )
        return hidden, queries

    async def _hidden_page(
        self,
        reader: str,
        query_filter: str,
        parameters: dict[str, str],
        continuation: dict[str, str] | None,
    ) -> Page[TableEntity]:
        async with self._storage.guard(kind="query-1000"):
            return await query_page(
                self._storage.reader(RELATIONS, reader),
                query_filter,
                parameters,
                select=["RowKey", "expires_at", "reposts", "phrase", "list_id", "exclusive"],
                limit=1000,
                continuation=continuation,
            )

    async def _range(
        self,
        user: str,
        prefix: str,
        select: list[str],
        limit: int,
        continuation: dict[str, str] | None,
    ) -> Page[TableEntity]:
        async with self._storage.guard(kind="query"):
            return await query_page(
                self._storage.reader(RELATIONS, user),
                _RANGE,
                {"pk": user, "low": prefix, "high": prefix[0] + "."},
                select=select,
                limit=min(limit, 1000),
                continuation=continuation,
            )

    async def _upsert(self, row: dict[str, Any]) -> None:
        await submit_batch(self._storage, RELATIONS, row["PartitionKey"], [("upsert", row)])

    async def _delete(self, user: str, key: str) -> None:
        await delete_entity(self._storage, RELATIONS, user, key)


@dataclass(frozen=True, slots=True)
class _Found:
    authors: set[str]
    reposters: set[str]
    phrases: set[str]
    exclusive_lists: set[str]


def _absorb(rows: list[TableEntity], moment: float, found: _Found) -> None:
    """Add what each relation row hides (a mute or filter only while it applies)."""
    for row in rows:
        key = str(row["RowKey"])
        prefix, other = key[:2], key[2:]
        if prefix in (BLOCK, BLOCKED_BY):
            found.authors.add(other)
            found.reposters.add(other)
        elif prefix == MUTED and _mute(row).applies(moment):
            found.authors.add(other)
            if row.get("reposts", True):
                found.reposters.add(other)
        elif prefix == FILTERED and _applies(_expiry(row), moment):
            found.phrases.add(str(row["phrase"]))
        elif (list_id := exclusive_list_id(row)) is not None:
            found.exclusive_lists.add(list_id)


def _applies(expires_at: float | None, now: float) -> bool:
    """A mute or filter with an expiry stops applying at it, swept or not."""
    return expires_at is None or now < expires_at


def _expiry(row: TableEntity) -> float | None:
    expires = row.get("expires_at")
    return None if expires is None else float(expires)


def _filter(row: TableEntity) -> Filter:
    return Filter(
        filter_id=str(row["filter_id"]),
        phrase=str(row["phrase"]),
        since=row.get("since") or datetime.now(UTC),
        expires_at=_expiry(row),
    )


def _mute(row: TableEntity) -> Mute:
    return Mute(
        user_id=str(row["RowKey"])[2:],
        since=row.get("since") or datetime.now(UTC),
        expires_at=_expiry(row),
        reposts=bool(row.get("reposts", True)),
    )


def _keyed(keys: tuple[str, str], **fields: Any) -> dict[str, Any]:
    """A row of ``keys`` (partition, row) with ``fields``."""
    return {"PartitionKey": keys[0], "RowKey": keys[1], **fields}
