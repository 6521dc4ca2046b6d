"""Fan-out queue messages: small references, never payloads."""

from __future__ import annotations

from typing import Annotated, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

from timeline.errors import MalformedMessageError
from timeline.keys import POST_ID_PATTERN, USER_ID_PATTERN

UserId = Annotated[str, StringConstraints(pattern=USER_ID_PATTERN)]
PostId = Annotated[str, StringConstraints(pattern=POST_ID_PATTERN)]
Cursor = Annotated[
    dict[
        Annotated[str, StringConstraints(max_length=32)],
        Annotated[str, StringConstraints(max_length=2048)],
    ],
    Field(max_length=4),
]
"""Where in the author's followers a chunked fan-out resumes: a storage continuation."""


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PostCreated(_Message):
    """Deliver the post to one page of the author's followers, starting at ``cursor``;
    the first page (no cursor) also goes to the author's own timeline."""

    type: Literal["post"] = "post"
    author: UserId
    post_id: PostId
    cursor: Cursor | None = None


class PostDeleted(_Message):
    """Remove the post from one page of followers' timelines, starting at ``cursor``; the
    first page (no cursor) also deletes the source row and the author's own copy."""

    type: Literal["delete"] = "delete"
    author: UserId
    post_id: PostId
    cursor: Cursor | None = None


class Followed(_Message):
    """Backfill the subject's newest posts into the follower's timeline."""

    type: Literal["follow"] = "follow"
    follower: UserId
    subject: UserId


class Unfollowed(_Message):
    """Purge the subject's posts from the follower's timeline."""

    type: Literal["unfollow"] = "unfollow"
    follower: UserId
    subject: UserId


FanoutMessage = Annotated[
    PostCreated | PostDeleted | Followed | Unfollowed, Field(discriminator="type")
]
_ADAPTER: TypeAdapter[FanoutMessage] = TypeAdapter(FanoutMessage)


def encode(message: FanoutMessage) -> str:
    return orjson.dumps(message.model_dump(exclude_none=True)).decode()


def decode(text: str) -> FanoutMessage:
    """Parse a queue message, raising ``MalformedMessageError`` for anything unusable."""
    try:
        return _ADAPTER.validate_python(orjson.loads(text))
    except (orjson.JSONDecodeError, ValidationError) as error:
        raise MalformedMessageError(f"undecodable fan-out message: {error}") from None
