"""Home timeline pages: the reader's own partition merged with the newest posts of the large
authors it follows (hybrid fan-out), in one round of concurrent storage queries.

A page reads every source from one position (the last row key served; row keys order posts
newest first, ties by post id, in every table), then serves, newest first, only what no
source can still undercut: items up to the *bound*, the last key read by any source that has
more. So no item is served twice or skipped, whatever each source returned, and a page may
be short when one source is dense, and even empty (with a continuation) while a listed
author's copies that the page hides fill the reader's partition (between an unfollow of a
merged author and the worker's purge).

Which authors are merged is read from storage on every page: the reader's merge rows (the
head of its timeline partition, read by the same query as its newest posts) and which of
those authors the reader still follows (its ``subjectFollowing`` rows, one query, which
every follow and unfollow request brings in step before it answers). A merged author's
copies in the reader's own partition are ignored (its posts come from ``posts``, so a
delete shows at once); a listed author the reader no longer follows is dropped with its
copies (an unfollow shows at once).
To start the author queries in the same round trip as the head, the process remembers each
reader's last merge list as a guess; a guess never decides anything, and an author missing
from it costs one more round trip, once.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, replace

from azure.data.tables import TableEntity

from timeline.model.entities import DETACHED, POST_SELECT, Post, PostRow, shown_post_id
from timeline.reads.activity import Attendance
from timeline.storage.accounts import Storage
from timeline.storage.calls import query_page, query_rows, to_entity
from timeline.storage.names import POSTS, TIMELINES
from timeline.tables.activity import HEAD_SELECT, Head, head_of
from timeline.tables.audience import merge_row_author
from timeline.tables.follows import FollowsRepository
from timeline.tables.rows import FIRST_POST_KEY, META

_HEAD = "PartitionKey eq @pk and RowKey lt @until"
_AFTER = "PartitionKey eq @pk and RowKey gt @after and RowKey lt @until"
MIN_AUTHOR_ROWS = 10
"""The fewest rows a page asks of one merged author (see ``HomeTimeline._author_rows``)."""
HEAD_ROWS = 5
"""A reader's head rows besides its merge rows: ``!a``, ``!c``, ``!d`` (activity), ``!n``
(merge count) and ``!r`` (read marker); the head query asks for them on top of a page."""


@dataclass(frozen=True, slots=True)
class Position:
    """Where the next page starts: after the row key ``after``, with the authors the first
    page listed (None: this is a first page, so read the merge rows). Pages stop before the
    row key ``until``: a newer-than read sets it to the client's position (older posts have
    greater keys), so its pages end there."""

    after: str = FIRST_POST_KEY
    listed: tuple[str, ...] | None = None
    until: str = META
    dormant: bool = False
    """Pages of a dormant reader: every followed author (and the reader) merged from
    ``posts``, the reader's own partition not read (``_dormant_page``)."""


@dataclass(frozen=True, slots=True)
class _Source:
    rows: list[PostRow]
    """Its posts' rows, newest first: no ``Post`` is built on a page read."""
    more: bool
    last_key: str
    """The last row key read (a post or not): the source is complete up to here."""


class HomeTimeline:
    def __init__(
        self,
        storage: Storage,
        *,
        max_merged: int,
        guesses: int = 100_000,
        attendance: Attendance | None = None,
        dormant_authors: int = 200,
    ) -> None:
        self._storage = storage
        self._attendance = attendance
        self._follows = FollowsRepository(storage)
        self._max_merged = max_merged
        self._dormant_authors = dormant_authors
        self._guesses: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self._guess_capacity = guesses

    @property
    def storage(self) -> Storage:
        return self._storage

    def for_lists(self) -> HomeTimeline:
        """The same reads for lists' timelines: no attendance (a list is never dormant)."""
        return HomeTimeline(self._storage, max_merged=self._max_merged)

    async def page(
        self, owner: str, limit: int, position: Position
    ) -> tuple[list[Post], Position | None]:
        """Up to ``limit`` posts from ``position`` and where the next page starts (None: the
        timeline ended)."""
        rows, following = await self.rows(owner, limit, position)
        return [Post.from_entity(row) for row in rows], following

    async def rows(
        self, owner: str, limit: int, position: Position, *, once: bool = True
    ) -> tuple[list[PostRow], Position | None]:
        """``page`` as the posts' rows (``POST_SELECT``), for a response built straight
        from them; a post shown twice in the page (the original and a repost of it, or two
        reposts) only at its newest row (the position is the page's, so none is skipped).
        ``once=False`` leaves that to the caller (one that filters first: ``hidden``)."""
        rows, following = await self._rows(owner, limit, position)
        return (shown_once(rows) if once else rows), following

    async def _rows(
        self, owner: str, limit: int, position: Position
    ) -> tuple[list[PostRow], Position | None]:
        if position.dormant:
            return await self._dormant_page(owner, limit, position)
        if position.listed is None:
            return await self._first_page(owner, limit, position.until)
        if not position.listed:
            own = await self._own(owner, limit, position)
            return _merge(own, {}, (), limit, position.until)
        own, merged = await asyncio.gather(
            self._own(owner, limit, position),
            self._authors(
                owner, position.listed, limit, after=position.after, until=position.until
            ),
        )
        return _merge(own, merged, position.listed, limit, position.until)

    async def _first_page(
        self, owner: str, limit: int, until: str
    ) -> tuple[list[PostRow], Position | None]:
        guess = self._guesses.get(owner, ())
        if guess:
            (own, listed, head), guessed = await asyncio.gather(
                self._head(owner, limit, until), self._authors(owner, guess, limit, until=until)
            )
        else:  # most readers merge no one: no tasks to start beside the head's query
            (own, listed, head), guessed = await self._head(owner, limit, until), {}
        if self._attendance is not None:
            seen = self._attendance.seen(owner, head)
            if head.dormant:
                page, _ = await asyncio.gather(
                    self._dormant_page(owner, limit, Position(until=until, dormant=True)), seen
                )
                return page
            await seen
        merged = {author: source for author, source in guessed.items() if author in listed}
        missing = tuple(author for author in listed if author not in guess)
        if missing:
            merged |= await self._authors(owner, missing, limit, listed=len(listed), until=until)
        self._remember(owner, listed)
        return _merge(own, merged, listed, limit, until)

    def _remember(self, owner: str, listed: tuple[str, ...]) -> None:
        if not listed and owner not in self._guesses:
            return
        self._guesses[owner] = listed
        self._guesses.move_to_end(owner)
        while len(self._guesses) > self._guess_capacity:
            self._guesses.popitem(last=False)

    async def registered(self, owner: str) -> None:
        """A new user: ``Attendance.registered``."""
        if self._attendance is not None:
            await self._attendance.registered(owner)

    @property
    def touch_every_s(self) -> float:
        """How often an open stream counts as activity (``Attendance.every_s``)."""
        return self._attendance.every_s if self._attendance is not None else float("inf")

    async def touch(self, owner: str) -> None:
        """Activity without a page (a stream opens): ``Attendance.touch``."""
        if self._attendance is not None:
            await self._attendance.touch(owner)

    async def _dormant_page(
        self, owner: str, limit: int, position: Position
    ) -> tuple[list[PostRow], Position | None]:
        """A page of a dormant (or waking) reader, complete at once for the authors the wake
        has not restored yet (the next ``dormant_authors`` after its cursor, from ``posts``,
        with the reader's own); the rest, and the large authors it merges, as on any page.
        At most ``dormant_authors`` + the merged authors + 4 queries, however many follows."""
        heads = await self._head_rows(owner)
        head = head_of(heads)
        hybrid = tuple(a for a in (merge_row_author(r["RowKey"]) for r in heads) if a)
        window, dropped = await self._follows.following_after(
            owner, head.restored, self._dormant_authors
        )
        authors = tuple(sorted({owner, *window}))
        others = tuple(author for author in hybrid if author not in authors)
        rows = self._author_rows(limit, len(authors) + len(others))
        after, until = position.after, position.until
        own, sources, large = await asyncio.gather(
            self._query(TIMELINES, owner, after, until, limit),
            asyncio.gather(*(self._query(POSTS, a, after, until, rows) for a in authors)),
            self._authors(
                owner, others, limit, after=after, until=until, listed=len(authors) + len(others)
            ),
        )
        merged = await self._replies_shown(owner, dict(zip(authors, sources, strict=True)))
        merged |= large
        skipped = (*authors, *others, *dropped)  # their copies: merged instead, or unfollowed
        posts, following = _merge(own, merged, skipped, limit, until)
        if following is None:
            return posts, None
        return posts, replace(following, listed=(), dormant=True)

    async def _head_rows(self, owner: str) -> list[TableEntity]:
        """The head rows only (activity, cursor, merge rows; bounded): one query."""
        async with self._storage.guard():
            page = await query_page(
                self._storage.reader(TIMELINES, owner),
                _HEAD,
                {"pk": owner, "until": FIRST_POST_KEY},
                select=["RowKey", *HEAD_SELECT],
                limit=self._max_merged + 8,
                continuation=None,
            )
        return list(page.items)

    async def _head(
        self, owner: str, limit: int, until: str
    ) -> tuple[_Source, tuple[str, ...], Head]:
        """The reader's head rows (merge and activity rows) and newest posts: one query
        (more only if storage cut it short inside the head rows, which are bounded)."""
        listed: list[str] = []
        heads: list[TableEntity] = []
        continuation: dict[str, str] | None = None
        while True:
            async with self._storage.guard():
                page = await query_rows(
                    self._storage.reader(TIMELINES, owner),
                    _HEAD,
                    {"pk": owner, "until": until},
                    select=[*POST_SELECT, *HEAD_SELECT],
                    limit=limit + self._max_merged + HEAD_ROWS,
                    continuation=continuation,
                )
            rows = [row for row in page.items if row["RowKey"] >= FIRST_POST_KEY]
            for row in page.items:
                if row["RowKey"] >= FIRST_POST_KEY:
                    break  # head rows sort before every post
                heads.append(to_entity(row))  # few, and read as entities (etags, types)
                author = merge_row_author(row["RowKey"])
                if author is not None:
                    listed.append(author)
            continuation = page.continuation
            if rows or continuation is None:
                last = rows[-1]["RowKey"] if rows else FIRST_POST_KEY
                source = _Source(rows, continuation is not None, last)
                return source, tuple(listed), head_of(heads)

    async def _own(self, owner: str, limit: int, position: Position) -> _Source:
        return await self._query(TIMELINES, owner, position.after, position.until, limit)

    async def _authors(
        self,
        owner: str,
        authors: tuple[str, ...],
        limit: int,
        *,
        after: str = FIRST_POST_KEY,
        until: str = META,
        listed: int | None = None,
    ) -> dict[str, _Source]:
        """The posts between ``after`` and ``until`` of each author the owner still follows,
        all at once."""
        if not authors:
            return {}
        rows = self._author_rows(limit, listed if listed is not None else len(authors))
        queries = [self._query(POSTS, author, after, until, rows) for author in authors]
        following, sources = await asyncio.gather(
            self._follows.following_among(owner, authors), asyncio.gather(*queries)
        )
        return await self._replies_shown(
            owner,
            {
                author: source
                for author, source in zip(authors, sources, strict=True)
                if author in following
            },
        )

    async def _replies_shown(self, owner: str, merged: dict[str, _Source]) -> dict[str, _Source]:
        """Merged authors' replies obey the delivery's rule: shown only to a reader who
        follows the author replied to (one more query per 14 such authors, only when a page
        holds such replies). A source's last key stays: the bound, hence paging, is the same."""
        targets = {
            target
            for author, source in merged.items()
            for row in source.rows
            if author != owner  # the reader's own replies: its own posts, always shown
            and (target := row.get("reply_author"))
            and target not in (author, owner)
        }
        if not targets:
            return merged
        asked = targets - {DETACHED}  # answers a deleted account: nobody follows it
        followed = await self._follows.following_among(owner, asked) if asked else set()
        shown = {
            author: [row for row in source.rows if _shown(row, author, owner, followed)]
            for author, source in merged.items()
        }
        return {author: replace(source, rows=shown[author]) for author, source in merged.items()}

    def _author_rows(self, limit: int, authors: int) -> int:
        """What to ask of each merged author: an equal share of the page (at least
        ``MIN_AUTHOR_ROWS``), so a page reads about twice ``limit`` rows whatever the number
        of authors; a source that runs out of rows first only shortens the page."""
        return min(limit, max(MIN_AUTHOR_ROWS, -(-limit // (authors + 1))))

    async def _query(
        self,
        table: str,
        partition: str,
        after: str,
        until: str,
        limit: int,
    ) -> _Source:
        async with self._storage.guard():
            page = await query_rows(
                self._storage.reader(table, partition),
                _AFTER,
                {"pk": partition, "until": until, "after": after},
                select=POST_SELECT,
                limit=limit,
                continuation=None,
            )
        last = page.items[-1]["RowKey"] if page.items else after
        return _Source(page.items, page.continuation is not None, last)


def _merge(
    own: _Source, merged: dict[str, _Source], listed: tuple[str, ...], limit: int, until: str
) -> tuple[list[PostRow], Position | None]:
    """Newest first, up to the bound; the next position is the last key served, or the bound
    when the page served everything up to it."""
    kept = own
    if listed:
        skipped = set(listed)
        kept = _Source(  # a repost's entry is the reposter's, never a merged author's copy
            [row for row in own.rows if row.get("reposted_by") or row["author"] not in skipped],
            own.more,
            own.last_key,
        )
    sources = [kept, *merged.values()]
    bound = min((source.last_key for source in sources if source.more), default=None)
    candidates = [
        row for source in sources for row in source.rows if bound is None or row["RowKey"] <= bound
    ]
    if len(sources) > 1:
        candidates.sort(key=_row_key)  # each source is in order already
    page = candidates[:limit]
    if len(candidates) > limit:
        return page, Position(page[-1]["RowKey"], listed, until=until)
    if bound is not None:
        return page, Position(bound, listed, until=until)
    return page, None


def _shown(row: PostRow, author: str, owner: str, followed: set[str]) -> bool:
    target = row.get("reply_author")
    return not target or owner in (author, target) or target == author or target in followed


def shown_once(rows: list[PostRow]) -> list[PostRow]:
    """The rows without those that show a post an earlier (newer) row already shows."""
    if not any(row.get("original") for row in rows):
        return rows
    seen: set[str] = set()
    kept = []
    for row in rows:
        shown = shown_post_id(row)
        if shown not in seen:
            seen.add(shown)
            kept.append(row)
    return kept


def _row_key(row: PostRow) -> str:
    return row["RowKey"]  # type: ignore[no-any-return]
