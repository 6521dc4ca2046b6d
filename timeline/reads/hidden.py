"""Home pages without what the reader's blocks, mutes and filters hide, nor followers-only
posts of authors it no longer follows, filtered at read time.

A block's or unfollow's purge and a mute's whole life never rewrite the timeline in time for
the next read (a purge is asynchronous; a mute never rewrites it), so every page filters: the
reader's relations are loaded once per page (one query, beside the page's own first round;
a round holding followers-only entries of others adds one ``subjectFollowing`` query per 14
of their authors),
and a page that filtering thins reads on from where it stopped, at least ``REFILL_ROWS``
entries a round, up to ``MAX_ROUNDS`` rounds, so it is full whenever more entries exist
(unless that many rounds in a row are all hidden: then it is short, with a continuation).
A round that finds more than the page needs stops at the last entry served and the next
page starts after it (with the same merge list), so every entry is served once or hidden.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, replace

from timeline.metrics import RELATION_CHECKS
from timeline.model.entities import PostRow, followers_only, shown_post_id
from timeline.model.keys import list_reader
from timeline.reads.home import HomeTimeline, Position
from timeline.reads.private import unseen_authors
from timeline.tables.follows import FollowsRepository
from timeline.tables.relations import Hidden, RelationsRepository

MAX_ROUNDS = 5
"""The most page reads one filtered page makes (the first included)."""
REFILL_ROWS = 100
"""The fewest entries a refill round asks for: few of them may stay."""


@dataclass(frozen=True, slots=True)
class VisiblePage:
    rows: list[PostRow]
    following: Position | None
    read: int
    """Entries read, hidden ones included: what counts against the timeline cap."""
    checks: int
    """Queries spent loading the reader's relations."""


class Thinning:
    """Per reader, the share of its last page that its relations hid: a guess that sizes the
    first round (a reader who mutes a tenth of what it gets reads a tenth more at once, not a
    second round). A guess never decides what is served, only how many rows are asked."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._shares: OrderedDict[str, float] = OrderedDict()
        self._capacity = capacity

    def ask(self, owner: str, wanted: int) -> int:
        share = self._shares.get(owner, 0.0)
        return wanted + min(wanted, math.ceil(wanted * share * 1.5)) if share else wanted

    def note(self, owner: str, read: int, kept: int) -> None:
        if read == kept and owner not in self._shares:
            return
        self._shares[owner] = (read - kept) / read if read else 0.0
        self._shares.move_to_end(owner)
        while len(self._shares) > self._capacity:
            self._shares.popitem(last=False)


async def visible_rows(
    home: HomeTimeline,
    relations: RelationsRepository,
    owner: str,
    wanted: int,
    position: Position,
    thinning: Thinning | None = None,
    follows: FollowsRepository | None = None,
    *,
    reader: str | None = None,
) -> VisiblePage:
    """Up to ``wanted`` entries from ``position`` that the owner's relations do not hide,
    nor are followers-only posts of authors it no longer follows (``timeline.reads.private``,
    checked with ``follows`` when given), and where the next page starts (None: the timeline
    ended). ``reader``: the timeline of one of the owner's lists instead of its home
    timeline (which alone leaves out the members of its exclusive lists)."""
    timeline = reader or owner
    ask = thinning.ask(timeline, wanted) if thinning is not None else wanted
    (hidden, checks), (rows, following) = await asyncio.gather(
        relations.hidden(owner), home.rows(timeline, ask, position, once=False)
    )
    excluded: frozenset[str] = frozenset()
    if reader is None and hidden.exclusive_lists and follows is not None:
        excluded, queries = await exclusive_members(follows, owner, hidden.exclusive_lists)
        checks += queries
    RELATION_CHECKS.inc(checks)

    filtering = bool(hidden) or bool(excluded)

    async def hider(rows: list[PostRow]) -> Hiding:
        nonlocal filtering
        unseen = set() if follows is None else await unseen_authors(follows, owner, rows)
        filtering = filtering or bool(unseen)
        return Hiding(hidden, frozenset(unseen), excluded)

    kept: list[PostRow] = []
    read = _take(rows, await hider(rows), wanted, kept)
    if read < len(rows):  # more than the page needs: the next starts after the last served
        if following is None:  # where the merge list of that position is unknown: read exact
            rows, following = await home.rows(timeline, wanted, position, once=False)
            kept.clear()
            read = _take(rows, await hider(rows), wanted, kept)
        else:
            following = replace(following, after=kept[-1]["RowKey"])
    rounds = 1  # a page short for other reasons (a dense merged author) stays as it was
    while filtering and len(kept) < wanted and following is not None and rounds < MAX_ROUNDS:
        start = following
        rows, following = await home.rows(timeline, max(wanted, REFILL_ROWS), start, once=False)
        rounds += 1
        taken = _take(rows, await hider(rows), wanted, kept)
        if taken < len(rows):  # the rest is read again by the next page
            following = replace(start, after=kept[-1]["RowKey"])
        read += taken
    if thinning is not None:
        thinning.note(timeline, read, len(kept))
    return VisiblePage(kept, following, read, checks)


@dataclass(frozen=True, slots=True)
class Hiding:
    """What one round hides: the reader's relations, and the authors of followers-only
    entries it does not follow."""

    relations: Hidden
    unseen: frozenset[str]
    excluded: frozenset[str] = frozenset()
    """Members of the reader's exclusive lists: their posts and reposts stay out of home."""

    def hides_row(self, row: PostRow) -> bool:
        if self.unseen and followers_only(row) and row["author"] in self.unseen:
            return True
        if self.excluded and (row.get("reposted_by") or row["author"]) in self.excluded:
            return True
        return self.relations.hides_row(row)


async def exclusive_members(
    follows: FollowsRepository, owner: str, list_ids: Iterable[str]
) -> tuple[frozenset[str], int]:
    """The members of the owner's exclusive lists, and the queries it took: one per 1,000
    members of each list, the lists at once."""

    async def members(list_id: str) -> tuple[set[str], int]:
        found: set[str] = set()
        queries, continuation = 0, None
        while True:
            page = await follows.following_page(list_reader(owner, list_id), 1000, continuation)
            queries += 1
            found.update(edge.user_id for edge in page.items)
            continuation = page.continuation
            if continuation is None:
                return found, queries

    results = await asyncio.gather(*(members(list_id) for list_id in sorted(list_ids)))
    return frozenset().union(*(found for found, _ in results)), sum(q for _, q in results)


def _take(rows: list[PostRow], hidden: Hiding, wanted: int, kept: list[PostRow]) -> int:
    """Append to ``kept`` the rows not hidden and showing a post ``kept`` does not show yet
    (rows come newest first: the newest visible entry of a post stays, across rounds), until
    it holds ``wanted``; the rows consumed. Filtering before de-duplicating: a hidden repost's
    entry never takes its post along."""
    shown = {shown_post_id(row) for row in kept}
    for index, row in enumerate(rows):
        if not hidden.hides_row(row) and (post := shown_post_id(row)) not in shown:
            shown.add(post)
            kept.append(row)
            if len(kept) == wanted:
                return index + 1
    return len(rows)
