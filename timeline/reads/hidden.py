"""Home pages without what the reader's blocks and mutes hide, filtered at read time.

A block's purge and a mute's whole life never rewrite the timeline in time for the next
read (a purge is asynchronous; a mute never rewrites it), so every page filters: the
reader's relations are loaded once per page (one query, beside the page's own first round),
and a page that filtering thins reads on from where it stopped, up to ``MAX_ROUNDS`` rounds,
so it is full whenever more entries exist. The continuation is the last round's: every
entry up to it was served or hidden, none skipped.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from timeline.model.entities import PostRow
from timeline.reads.home import HomeTimeline, Position
from timeline.tables.relations import RelationsRepository

MAX_ROUNDS = 5
"""The most page reads one filtered page makes (the first included)."""


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
    if not hidden:
        return VisiblePage(rows, following, len(rows), checks)
    kept = [row for row in rows if not hidden.hides_row(row)]
    read, rounds = len(rows), 1
    while len(kept) < wanted and following is not None and rounds < MAX_ROUNDS:
        rows, following = await home.rows(owner, wanted - len(kept), following)
        kept += [row for row in rows if not hidden.hides_row(row)]
        read, rounds = read + len(rows), rounds + 1
    return VisiblePage(kept, following, read, checks)
