"""Fan-out queue messages: small references, never payloads."""

from __future__ import annotations

from typing import Annotated, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from timeline.errors import MalformedMessageError
from timeline.model.keys import (
    LIST_ID_PATTERN,
    POST_ID_PATTERN,
    READER_ID_PATTERN,
    USER_ID_PATTERN,
)
from timeline.model.priority import Priority

UserId = Annotated[str, StringConstraints(pattern=USER_ID_PATTERN)]
PostId = Annotated[str, StringConstraints(pattern=POST_ID_PATTERN)]
ReaderId = Annotated[str, StringConstraints(pattern=READER_ID_PATTERN)]
"""A user, or a list (``timeline.model.keys.list_reader``): whose timeline."""
ListId = Annotated[str, StringConstraints(pattern=LIST_ID_PATTERN)]
Cursor = Annotated[
    dict[
        Annotated[str, StringConstraints(max_length=32)],
        Annotated[str, StringConstraints(max_length=2048)],
    ],
    Field(max_length=4),
]
"""Where in the author's followers a chunked fan-out resumes: a storage continuation."""


class _Message(BaseModel):
    """What every message carries besides its work: the bookkeeping of its own retries,
    rewritten in place when the worker hands the message back to the queue."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    released: int = Field(default=0, ge=0)
    """The queue's dequeue count when the last lease ended with a recorded outcome; the
    dequeue count now, less this and the current lease, is how many leases in a row ended
    with no outcome (a dead worker)."""
    failures: int = Field(default=0, ge=0)
    """Real, non-retryable failures so far (storage trouble is not counted)."""
    attempt: int = Field(default=0, ge=0)
    """Leases in a row that made no progress: the exponent of the next backoff (clamped)."""
    level: int = Field(default=0, ge=0)
    """Set just before a suspect runs in isolation (``fanout_worker.isolation``): how small
    its group was; 0 when its last lease ended with an outcome."""
    solo: int = Field(default=0, ge=0)
    """Runs in a row, alone in a worker, that ended with no outcome (a dead worker)."""
    background: bool = False
    """Sent by an account's deletion: background work, whatever its kind."""


class PostCreated(_Message):
    """Deliver the post to one page of the author's followers, starting at ``cursor``;
    the first page (no cursor) also goes to the author's own timeline."""

    type: Literal["post"] = "post"
    author: UserId
    post_id: PostId
    cursor: Cursor | None = None
    merged: bool = False
    """Set by the first page when the author is merged at read time: the cursor then walks
    the author's overflow readers, not its followers (``timeline.tables.audience``)."""
    reply_author: UserId | None = None
    reply_post: PostId | None = None
    """A reply: the post it answers, whose reply index row its request filed first (this
    message drops that row if the reply itself was never stored)."""


class RepostsPosition(BaseModel):
    """Where a delete's purge of its original's reposts resumes, in the original's repost
    index (``timeline.delivery.repost_purge``): after the row of ``reposter``'s repost
    ``repost_id`` (None: from the first), or, with ``followers``, inside it: that repost's
    readers from there on, while its index row is there."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    reposter: UserId | None = None
    repost_id: PostId | None = None
    followers: Cursor | None = None


class PostDeleted(_Message):
    """Remove the post from one page of followers' timelines, starting at ``cursor``; the
    first page (no cursor) also deletes the source row and the author's own copy. Then its
    reposts, a few per lease, from ``reposts`` on. After the last step the message comes back
    once more, ``confirm``ed, to sweep late writes."""

    type: Literal["delete"] = "delete"
    author: UserId
    post_id: PostId
    cursor: Cursor | None = None
    confirm: bool = False
    merged: bool = False
    """Set by the first page when no follower can hold a copy of the post but the author's
    overflow readers: the cursor then walks those."""
    reply_author: UserId | None = None
    reply_post: PostId | None = None
    """A reply's target, whose replies index row the first page drops."""
    reposts: RepostsPosition | None = None
    """Set once the readers' pages are done and the purge of the reposts has more to do."""

    @model_validator(mode="after")
    def _one_cursor(self) -> PostDeleted:
        """One cursor at a time (the readers' or the reposts'): the message stays small."""
        if self.reposts is not None and self.cursor is not None:
            raise ValueError("a delete walks its readers or its reposts, not both at once")
        return self


class Followed(_Message):
    """Backfill the subject's newest posts and reposts into the follower's timeline (a
    list's, for a member added to it)."""

    type: Literal["follow"] = "follow"
    follower: ReaderId
    subject: UserId
    confirm: bool = False
    """The delayed second pass of a damped backfill: copies what a purge that was in flight
    took away after the first pass looked."""


class Unfollowed(_Message):
    """Purge the subject's posts from the follower's timeline."""

    type: Literal["unfollow"] = "unfollow"
    follower: ReaderId
    subject: UserId
    confirm: bool = False
    """The second, delayed purge that sweeps writes which landed after the first."""


class Regrade(_Message):
    """Move an author across the hybrid fan-out threshold, one page of followers at a time:
    to ``merged`` (give followers merge rows) or back to ``copied`` (copy the author's newest
    posts into their timelines, then drop their merge rows)."""

    type: Literal["regrade"] = "regrade"
    author: UserId
    merge: bool
    token: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
    """Names this move in the author's mode row: only the message that started it goes on."""
    cursor: Cursor | None = None
    fenced: bool = False
    """A move down has waited one sweep delay since ``shrinking`` before touching followers."""


class Wake(_Message):
    """Bring a dormant reader's timeline back (``timeline.delivery.dormancy``): unmark its
    follows and copy its followed authors' newest posts in; ``confirm`` is the delayed
    second pass that does it again (for a sweep's late mark) and ends the dormancy."""

    type: Literal["wake"] = "wake"
    reader: UserId
    generation: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
    """The dormancy this wake ends (the marker's ``gen``): a stale wake does nothing."""
    confirm: bool = False


class Reposted(_Message):
    """Deliver a repost (``repost_id``) of ``author``'s ``post_id`` to one page of the
    reposter's followers (``timeline.delivery.repost``)."""

    type: Literal["repost"] = "repost"
    reposter: UserId
    author: UserId
    post_id: PostId
    repost_id: PostId
    cursor: Cursor | None = None


class Unreposted(_Message):
    """Remove a repost's copies from one page of the reposter's followers' timelines; after
    the last page it comes back once more, ``confirm``ed, to sweep late copies."""

    type: Literal["unrepost"] = "unrepost"
    reposter: UserId
    author: UserId
    post_id: PostId
    repost_id: PostId
    cursor: Cursor | None = None
    confirm: bool = False


class ListDeleted(_Message):
    """End a deleted list's memberships (one page of members per lease, from ``cursor``),
    then drop its timeline; again ``sweep_delay_s`` later (``confirm``) for what landed
    late."""

    type: Literal["list_deleted"] = "list_deleted"
    owner: UserId
    list_id: ListId
    cursor: Cursor | None = None
    confirm: bool = False


class RelationChanged(_Message):
    """A block or mute, or its end, was written (``kind``, by ``actor`` of ``other``): make
    its two rows agree, since the request may have died between them or interleaved with
    another on the pair; then, ``sweep_delay_s`` later, check them (``confirm``: reads only),
    and fix them again until a check finds them agreeing."""

    type: Literal["relation"] = "relation"
    kind: Literal["block", "mute"]
    actor: UserId
    other: UserId
    confirm: bool = False


class ReplyDetached(_Message):
    """The account a reply answers (``target``, whose post ``target_post`` it answers) is
    deleted: mark the reply and its copies as answering nobody (``timeline.delivery.replies``):
    its readers a page per lease from ``cursor``, then its reposts' readers, one repost and
    one page per lease, from ``reposts``; then all of it once more, ``confirm``ed,
    ``sweep_delay_s`` later, for copies written from older reads; then drop its index row.
    ``sweep``: the deletion's sweep that sent it; from the second on, every reply request
    accepted before the deletion has landed (a reply not stored by then never will be)."""

    type: Literal["detach"] = "detach"
    author: UserId
    post_id: PostId
    target: UserId
    target_post: PostId
    sweep: int = Field(default=0, ge=0)
    cursor: Cursor | None = None
    merged: bool = False
    """As a delete's: only the author's overflow readers can hold a copy."""
    reposts: RepostsPosition | None = None
    confirm: bool = False


Phase = Literal[
    "lists",
    "following",
    "followers",
    "unfollowed",
    "reposts",
    "posts",
    "replies",
    "blocks",
    "mutes",
    "muters",
    "drop",
]
"""What an account's deletion does, in this order (``timeline.delivery.accounts``)."""


class AccountDeleted(_Message):
    """Undo everything of a deleted account, one phase and one page per lease (from
    ``cursor``); the whole sweep again every ``account_every_s`` (``confirm``) until one finds
    nothing left, then drop the account's partitions."""

    type: Literal["account_deleted"] = "account_deleted"
    user: UserId
    phase: Phase = "lists"
    cursor: Cursor | None = None
    confirm: bool = False
    sweep: int = Field(default=0, ge=0)
    """Which sweep this is (0: the first)."""


FanoutMessage = Annotated[
    PostCreated
    | PostDeleted
    | Followed
    | Unfollowed
    | Regrade
    | Wake
    | Reposted
    | Unreposted
    | ListDeleted
    | AccountDeleted
    | RelationChanged
    | ReplyDetached,
    Field(discriminator="type"),
]
_ADAPTER: TypeAdapter[FanoutMessage] = TypeAdapter(FanoutMessage)


def urgency(message: FanoutMessage) -> Priority:
    """``HIGH`` for what a user waits to see: every page of a post's or a repost's fan-out
    (a follower is waiting on each), a delete's first page, an unfollow's first purge, and
    a returning reader's wake; a delete's later pages and second passes, every backfill and
    regrade, and everything an account's deletion sends, are background work."""
    match message:
        case _Message(background=True):
            return Priority.LOW
        case PostCreated() | PostDeleted(cursor=None, confirm=False, reposts=None):
            return Priority.HIGH
        case Reposted() | Unreposted(cursor=None, confirm=False):
            return Priority.HIGH
        case Unfollowed(confirm=False) | Wake(confirm=False):
            return Priority.HIGH
        case _:
            return Priority.LOW


def encode(message: FanoutMessage) -> str:
    """Compact JSON: fields at their defaults are left out (``type`` always stays)."""
    data = message.model_dump(exclude_defaults=True)
    data["type"] = message.type
    return orjson.dumps(data).decode()


def decode(text: str) -> FanoutMessage:
    """Parse a queue message, raising ``MalformedMessageError`` for anything unusable."""
    try:
        return _ADAPTER.validate_python(orjson.loads(text))
    except (orjson.JSONDecodeError, ValidationError) as error:
        raise MalformedMessageError(f"undecodable fan-out message: {error}") from None
