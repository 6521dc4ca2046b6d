"""Home pages without what the reader's blocks and mutes hide, filtered at read time.

A block's purge and a mute's whole life never rewrite the timeline in time for the next
read (a purge is asynchronous; a mute never rewrites it), so every page filters: the
reader's relations are loaded once per page (one query, beside the page's own first round),
and a page that filtering thins reads on from where it stopped, at least ``REFILL_ROWS``
entries a round, up to ``MAX_ROUNDS`` rounds, so it is full whenever more entries exist
(unless that many rounds in a row are all hidden: then it is short, with a continuation).
A round that finds more than the page needs stops at the last entry served and the next
page starts after it (with the same merge list), so every entry is served once or hidden.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from timeline.metrics import RELATION_CHECKS
from timeline.model.entities import PostRow
from timeline.reads.home import HomeTimeline, Position
from timeline.tables.relations import RelationsRepository

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


async def visible_rows(
    home: HomeTimeline,
    relations: RelationsRepository,
    owner: str,
    wanted: int,
    position: Position,
) -> VisiblePage:
    """Up to ``wanted`` entries from ``position`` that the owner's relations do not hide,
    and where the next page starts (None: the timeline ended)."""
    (hidden, checks), (rows, following) = await asyncio.gather(
        relations.hidden(owner), home.rows(owner, wanted, position)
    )
    RELATION_CHECKS.inc(checks)
    if not hidden:
        return VisiblePage(rows, following, len(rows), checks)
    kept = [row for row in rows if not hidden.hides_row(row)]
    read, rounds = len(rows), 1
    while len(kept) < wanted and following is not None and rounds < MAX_ROUNDS:
        start = following
        rows, following = await home.rows(owner, max(wanted, REFILL_ROWS), start)
        rounds += 1
        for index, row in enumerate(rows):
            if not hidden.hides_row(row):
                kept.append(row)
            if len(kept) == wanted:
                if index + 1 < len(rows):  # the rest is read again by the next page
                    following = replace(start, after=row["RowKey"], resume=None)
                rows = rows[: index + 1]
                break
        read += len(rows)
    return VisiblePage(kept, following, read, checks)
