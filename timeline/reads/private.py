"""Followers-only posts: who may see them, decided at read time.

A followers-only post reaches only its author's followers' timelines, but a copy outlives an
unfollow until the unfollow's purge, and a single post, an author's page, a replies page or a
stream may be read by anyone. So every read that can show one checks the reader against
storage as it is now: the author always sees it, a follower does (``subjectFollowers``, the
truth, for one author; the ``subjectFollowing`` index, synced by every follow and unfollow
before it answers, for a page's many), anyone else does not.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from timeline.model.entities import FOLLOWERS, followers_only
from timeline.tables.follows import FollowsRepository


async def may_see(
    follows: FollowsRepository, reader: str | None, author: str, visibility: str | None
) -> bool:
    """Whether ``reader`` (None: anonymous) may see a post of ``author`` with this
    ``visibility``."""
    if visibility != FOLLOWERS or reader == author:
        return True
    return reader is not None and await follows.is_following(reader, author)


async def unseen_authors(
    follows: FollowsRepository, reader: str | None, rows: Iterable[dict[str, Any]]
) -> set[str]:
    """The authors of the followers-only rows among ``rows`` whom ``reader`` does not follow
    (one query per 14 of them; none when the rows hold no followers-only post of others)."""
    private = {
        str(row["author"]) for row in rows if followers_only(row) and row["author"] != reader
    }
    if not private or reader is None:
        return private
    return private - await follows.following_among(reader, private)


async def visible(
    follows: FollowsRepository, reader: str | None, rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``rows`` without the followers-only posts ``reader`` may not see."""
    hidden = await unseen_authors(follows, reader, rows)
    if not hidden:
        return rows
    return [row for row in rows if not (followers_only(row) and row["author"] in hidden)]
