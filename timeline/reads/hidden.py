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
from dataclasses import dataclass, replace

from timeline.metrics import RELATION_CHECKS
from timeline.model.entities import PostRow, followers_only, shown_post_id
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
) -> VisiblePage:
    """Up to ``wanted`` entries from ``position`` that the owner's relations do not hide,
    nor are followers-only posts of authors it no longer follows (``timeline.reads.private``,
    checked with ``follows`` when given), and where the next page starts (None: the timeline
    ended)."""
    ask = thinning.ask(owner, wanted) if thinning is not None else wanted
    (hidden, checks), (rows, following) = await asyncio.gather(
        relations.hidden(owner), home.rows(owner, ask, position, once=False)
    )
    RELATION_CHECKS.inc(checks)

    filtering = bool(hidden)

    async def hider(rows: list[PostRow]) -> Hiding:
        nonlocal filtering
        unseen = set() if follows is None else await unseen_authors(follows, owner, rows)
        filtering = filtering or bool(unseen)
        return Hiding(hidden, frozenset(unseen))

    kept: list[PostRow] = []
    read = _take(rows, await hider(rows), wanted, kept)
    if read < len(rows):  # more than the page needs: the next starts after the last served
        if following is None:  # where the merge list of that position is unknown: read exact
            rows, following = await home.rows(owner, wanted, position, once=False)
            kept.clear()
            read = _take(rows, await hider(rows), wanted, kept)
        else:
            following = replace(following, after=kept[-1]["RowKey"])
    rounds = 1  # a page short for other reasons (a dense merged author) stays as it was
    while filtering and len(kept) < wanted and following is not None and rounds < MAX_ROUNDS:
        start = following
        rows, following = await home.rows(owner, max(wanted, REFILL_ROWS), start, once=False)
        rounds += 1
        taken = _take(rows, await hider(rows), wanted, kept)
        if taken < len(rows):  # the rest is read again by the next page
            following = replace(start, after=kept[-1]["RowKey"])
        read += taken
    if thinning is not None:
        thinning.note(owner, read, len(kept))
    return VisiblePage(kept, following, read, checks)


@dataclass(frozen=True, slots=True)
class Hiding:
    """What one round hides: the reader's relations, and the authors of followers-only
    entries it does not follow."""

    relations: Hidden
    unseen: frozenset[str]

    def hides_row(self, row: PostRow) -> bool:
        if self.unseen and followers_only(row) and row["author"] in self.unseen:
            return True
        return self.relations.hides_row(row)


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
