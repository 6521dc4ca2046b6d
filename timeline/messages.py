"""Fan-out queue messages: small references, never payloads."""

from __future__ import annotations

from typing import Annotated, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

from timeline.errors import MalformedMessageError
from timeline.keys import POST_ID_PATTERN, USER_ID_PATTERN

UserId = Annotated[str, StringConstraints(pattern=USER_ID_PATTERN)]
PostId = Annotated[str, StringConstraints(pattern=POST_ID_PATTERN)]


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PostCreated(_Message):
    """Deliver the post to the author's followers (and the author's own timeline)."""

    type: Literal["post"] = "post"
    author: UserId
    post_id: PostId


class PostDeleted(_Message):
    """Remove the post from every timeline it was delivered to."""

    type: Literal["delete"] = "delete"
    author: UserId
    post_id: PostId


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
    return orjson.dumps(message.model_dump()).decode()


def decode(text: str) -> FanoutMessage:
    """Parse a queue message, raising ``MalformedMessageError`` for anything unusable."""
    try:
        return _ADAPTER.validate_python(orjson.loads(text))
    except (orjson.JSONDecodeError, ValidationError) as error:
        raise MalformedMessageError(f"undecodable fan-out message: {error}") from None
