"""The domain records and their table-entity shapes."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Generic, TypeVar

from timeline.model.keys import (
    format_ticks,
    format_time,
    post_id_from_row_key,
    post_id_ticks,
    post_row_key,
    ticks_to_datetime,
)

T = TypeVar("T")

PROFILE_ROW_KEY = "profile"
POST_SELECT = [
    "RowKey", "author", "text", "reposted_by", "original", "reply_author", "reply_post",
    "visibility",
]  # fmt: skip
"""The only properties a post or timeline page needs: the rest derives from the row key.
``reposted_by`` and ``original`` are set on a repost's copies (``timeline.delivery.repost``),
``reply_author`` and ``reply_post`` on a reply, ``visibility`` on a followers-only post and
its copies; a plain public post has none of them."""
OPTIONAL = ("reposted_by", "original", "reply_author", "reply_post", "visibility")
PUBLIC, FOLLOWERS = "public", "followers"
"""A post's visibility: anyone, or only its author's followers (and the author)."""
DETACHED = "~"
"""A reply's ``reply_author`` once that account is deleted (no user id holds ``~``): the
reply stays, answering nobody (``reply_to.author`` null), and reaches no one new but its
author (``timeline.delivery.replies``)."""


@dataclass(frozen=True, slots=True)
class Post:
    post_id: str
    author: str
    text: str
    reposted_by: str | None = None
    """A repost's copy: who reposted it (``post_id`` is then the repost's id)."""
    original: str | None = None
    """A repost's copy: the original post's id (its author is ``author``)."""
    reply_author: str | None = None
    reply_post: str | None = None
    """A reply: the post it answers, and that post's author (``DETACHED`` once deleted)."""
    visibility: str | None = None
    """``FOLLOWERS`` for a followers-only post; None (stored as nothing) for a public one."""

    @property
    def followers_only(self) -> bool:
        return self.visibility == FOLLOWERS

    @property
    def replied_user(self) -> str | None:
        """The user a reply answers, while that account exists."""
        return None if self.reply_author == DETACHED else self.reply_author

    @property
    def row_key(self) -> str:
        return post_row_key(self.post_id)

    @property
    def created_at(self) -> datetime:
        return ticks_to_datetime(post_id_ticks(self.post_id))

    def properties(self) -> dict[str, str]:
        """Everything but the keys: one dict can serve every copy of the post."""
        properties = {"author": self.author, "text": self.text}
        for name in OPTIONAL:
            value = getattr(self, name)
            if value is not None:
                properties[name] = value
        return properties

    def to_entity(self, partition_key: str) -> dict[str, Any]:
        """The same shape in ``posts`` (keyed by author) and ``timelines`` (keyed by owner)."""
        return {"PartitionKey": partition_key, "RowKey": self.row_key, **self.properties()}

    @classmethod
    def from_entity(cls, entity: dict[str, Any]) -> Post:
        return cls(
            post_id=post_id_from_row_key(entity["RowKey"]),
            author=entity["author"],
            text=entity["text"],
            **{name: entity[name] for name in OPTIONAL if entity.get(name)},
        )

    def to_json(self) -> dict[str, Any]:
        return row_json({"RowKey": self.row_key, **self.properties()})


PostRow = dict[str, Any]
"""A post or timeline row as a query gives it (``POST_SELECT``: ``RowKey``, ``author``,
``text``): what the read path carries from storage to the response, with no ``Post``."""


def post_json(post_id: str, author: str, text: str) -> dict[str, str]:
    """A post as clients see it; its creation time is in its id."""
    return {
        "post_id": post_id,
        "author": author,
        "text": text,
        "created_at": format_ticks(post_id_ticks(post_id)),
    }


def row_json(row: PostRow) -> dict[str, Any]:
    """``Post.from_entity(row).to_json()`` without the ``Post``. A repost's copy shows the
    original (its id, author and time) with ``reposted_by``; a reply carries ``reply_to``."""
    original = row.get("original")
    item: dict[str, Any] = post_json(
        original or post_id_from_row_key(row["RowKey"]), row["author"], row["text"]
    )
    if original:
        item["reposted_by"] = row["reposted_by"]
    if row.get("reply_post"):
        answered = row.get("reply_author")
        answered = None if answered == DETACHED else answered
        item["reply_to"] = {"author": answered, "post_id": row["reply_post"]}
    item["visibility"] = row.get("visibility") or PUBLIC
    return item


def followers_only(row: PostRow) -> bool:
    """Whether a post or timeline row shows a followers-only post."""
    return row.get("visibility") == FOLLOWERS


def shown_post_id(row: PostRow) -> str:
    """The post a row shows: the original for a repost's copy, else its own."""
    return str(row.get("original") or post_id_from_row_key(row["RowKey"]))


@dataclass(frozen=True, slots=True)
class User:
    user_id: str
    display_name: str
    created_at: datetime
    locked: bool = False
    """Follows of a locked user are requests it approves."""
    followers: int = 0
    following: int = 0
    posts: int = 0

    def to_entity(self) -> dict[str, Any]:
        """The profile row; the counters live beside the facts they count."""
        return {
            "PartitionKey": self.user_id,
            "RowKey": PROFILE_ROW_KEY,
            "display_name": self.display_name,
            "created_at": self.created_at,
            "locked": self.locked,
        }

    @classmethod
    def from_entity(cls, entity: dict[str, Any]) -> User:
        return cls(
            user_id=entity["PartitionKey"],
            display_name=entity["display_name"],
            created_at=entity["created_at"],
            locked=bool(entity.get("locked", False)),
        )

    def with_counts(self, *, followers: int, following: int, posts: int) -> User:
        return replace(self, followers=followers, following=following, posts=posts)

    def to_json(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id,
            "display_name": self.display_name,
            "locked": self.locked,
            "followers": self.followers,
            "following": self.following,
            "posts": self.posts,
        }


@dataclass(frozen=True, slots=True)
class Edge:
    """One side of a follow: the other user's id and when the follow began."""

    user_id: str
    since: datetime

    def to_json(self) -> dict[str, str]:
        return {"user_id": self.user_id, "since": format_time(self.since)}


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One storage query's worth of items and the raw storage continuation, if any."""

    items: list[T]
    continuation: dict[str, str] | None
