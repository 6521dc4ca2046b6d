"""Request and response bodies: validation and the OpenAPI schemas come from these models."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from timeline.model.keys import LIST_ID_PATTERN, POST_ID_PATTERN, USER_ID_PATTERN, text_pattern
from timeline.model.tokens import CONTINUATION_PATTERN, MAX_CONTINUATION_CHARS
from timeline.service.accounts import MAX_DISPLAY_NAME_CHARS
from timeline.service.lists import MAX_TITLE_CHARS
from timeline.service.relations import MAX_PHRASE_CHARS


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class RegisterRequest(_Body):
    user_id: str = Field(json_schema_extra={"pattern": USER_ID_PATTERN})
    display_name: str | None = Field(
        default=None,
        description="1-64 characters after trimming; defaults to the id",
        json_schema_extra={"pattern": text_pattern(MAX_DISPLAY_NAME_CHARS)},
    )


class PostRef(_Body):
    author: str = Field(json_schema_extra={"pattern": USER_ID_PATTERN})
    post_id: str = Field(json_schema_extra={"pattern": POST_ID_PATTERN})


class ReplyTo(_Body):
    author: str | None = Field(
        description="who wrote the post replied to; null once that account is deleted"
    )
    post_id: str = Field(json_schema_extra={"pattern": POST_ID_PATTERN})


class PostRequest(_Body):
    text: str = Field(description="1 to TIMELINE_MAX_POST_CHARS (280) characters after trimming")
    reply_to: PostRef | None = Field(
        default=None,
        description="the post this one replies to (it must exist: 404 reply_target_not_found); "
        "a reply reaches only the followers who also follow the author replied to",
    )
    visibility: Literal["public", "followers"] = Field(
        default="public",
        description="followers: only the author's followers get it and see it (it cannot be "
        "reposted)",
    )


class RepostRequest(PostRef):
    """The post to repost (another user's or one's own)."""


class Registered(_Body):
    user_id: str
    display_name: str
    token: str = Field(description="bearer token for the Authorization header")


class Profile(_Body):
    user_id: str
    display_name: str
    locked: bool = Field(description="follows of this user are requests it approves")
    followers: int
    following: int
    posts: int


class ProfileEdit(_Body):
    display_name: str | None = Field(
        default=None,
        description="1-64 characters after trimming; absent: unchanged",
        json_schema_extra={"pattern": text_pattern(MAX_DISPLAY_NAME_CHARS)},
    )
    locked: bool | None = Field(
        default=None,
        description="true: a follow becomes a request the user approves; absent: unchanged "
        "(locking or unlocking changes no follow or request already made)",
    )


class AccountDeleting(_Body):
    user_id: str
    state: str = Field(
        description='"deleting": the account is gone at once; the rest of it goes in the background'
    )


class FollowRequested(_Body):
    state: str = Field(description='"requested": the user is locked and approves follows')


class PostOut(_Body):
    post_id: str = Field(json_schema_extra={"pattern": POST_ID_PATTERN})
    author: str
    text: str
    created_at: str = Field(description="RFC 3339 UTC with microseconds")
    reposted_by: str | None = Field(
        default=None,
        description="on a home timeline entry that a repost brought: who reposted the post "
        "(the item is the original: its id, author, text and time); absent on a plain entry",
    )
    reply_to: ReplyTo | None = Field(
        default=None, description="the post this one replies to; absent on other posts"
    )
    visibility: Literal["public", "followers"] = Field(
        description="followers: only the author and its followers see it"
    )


class RepostOut(PostOut):
    repost_id: str = Field(
        json_schema_extra={"pattern": POST_ID_PATTERN},
        description="this repost (its time orders its entries in followers' timelines)",
    )


class EdgeOut(_Body):
    user_id: str
    since: str = Field(description="RFC 3339 UTC with microseconds")


class PostPage(_Body):
    items: list[PostOut]
    continuation: str | None = Field(description="pass back to get the next page; null at the end")
    newest: str | None = Field(
        description="the position of the page's newest item, for 'since' (null when empty)"
    )


class EdgePage(_Body):
    items: list[EdgeOut]
    continuation: str | None = Field(description="pass back to get the next page; null at the end")


MAX_MARKER_VERSION = 2**53 - 1
"""The largest integer a JavaScript client holds exactly."""


class MarkerRequest(_Body):
    position: str = Field(
        description="a home timeline page's 'newest' (or a stream event id), as given",
        json_schema_extra={"pattern": CONTINUATION_PATTERN, "maxLength": MAX_CONTINUATION_CHARS},
    )
    version: int = Field(
        ge=0,
        le=MAX_MARKER_VERSION,
        description="the version last read (0 when there is no marker yet); another one is a 409",
    )


class Marker(_Body):
    position: str | None = Field(
        description="where the user stopped: a page's 'newest' (null before the first write)"
    )
    version: int = Field(description="1 after the first write, one more after each; 0: none")


class Status(_Body):
    status: str


class ErrorDetail(_Body):
    code: str
    message: str


class ErrorBody(_Body):
    error: ErrorDetail


RFC3339_PATTERN = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}"  # date and time
    r"(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})$"  # fraction and offset
)


class MuteRequest(_Body):
    expires_at: str | None = Field(
        default=None,
        description="RFC 3339 time the mute ends at, in the future (within 100 years); "
        "null or absent: never",
        json_schema_extra={"pattern": RFC3339_PATTERN},
    )
    reposts: bool = Field(default=True, description="mute their reposts too")


class MuteOut(_Body):
    user_id: str
    since: str = Field(description="RFC 3339 UTC with microseconds")
    expires_at: str | None = Field(description="when the mute stops applying; null: never")
    reposts: bool


class MutePage(_Body):
    items: list[MuteOut]
    continuation: str | None = Field(description="pass back to get the next page; null at the end")


class ListRequest(_Body):
    title: str = Field(
        description="1-100 characters after trimming",
        json_schema_extra={"pattern": text_pattern(MAX_TITLE_CHARS)},
    )
    exclusive: bool = Field(
        default=False,
        description="true: its members' posts and reposts stay out of the home timeline",
    )


class ListEdit(_Body):
    title: str | None = Field(
        default=None,
        description="1-100 characters after trimming; absent: unchanged",
        json_schema_extra={"pattern": text_pattern(MAX_TITLE_CHARS)},
    )
    exclusive: bool | None = Field(default=None, description="absent: unchanged")


class ListOut(_Body):
    list_id: str = Field(json_schema_extra={"pattern": LIST_ID_PATTERN})
    title: str
    exclusive: bool


class ListPage(_Body):
    items: list[ListOut]
    continuation: str | None = Field(description="pass back to get the next page; null at the end")


class FilterRequest(_Body):
    phrase: str = Field(
        description="hidden where it appears as whole words, ignoring case (1-100 characters "
        "after trimming)",
        json_schema_extra={"pattern": text_pattern(MAX_PHRASE_CHARS)},
    )
    expires_at: str | None = Field(
        default=None,
        description="RFC 3339 time the filter ends at, in the future (within 100 years); "
        "null or absent: never",
        json_schema_extra={"pattern": RFC3339_PATTERN},
    )


class FilterOut(_Body):
    filter_id: str = Field(json_schema_extra={"pattern": POST_ID_PATTERN})
    phrase: str
    since: str = Field(description="RFC 3339 UTC with microseconds")
    expires_at: str | None = Field(description="when the filter stops applying; null: never")


class FilterPage(_Body):
    items: list[FilterOut]
    continuation: str | None = Field(description="pass back to get the next page; null at the end")
