"""Domain operations behind the REST API: validation, authorization, storage, queueing."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from timeline.entities import Edge, Page, Post, User
from timeline.errors import (
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
)
from timeline.home import HomeTimeline, Position
from timeline.keys import (
    USER_ID_PATTERN,
    clean_text,
    new_post_id,
    now_ticks,
    validate_idempotency_key,
    validate_post_id,
    validate_user_id,
)
from timeline.messages import Followed, PostCreated, PostDeleted, Unfollowed
from timeline.queue import MessageSender
from timeline.ratelimit import RateLimits
from timeline.repositories import Repositories, request_id
from timeline.tokens import TokenSigner

T = TypeVar("T")
_USER_ID = re.compile(USER_ID_PATTERN.replace("$", r"\Z"))
MAX_DISPLAY_NAME_CHARS = 64


@dataclass(frozen=True, slots=True)
class PageOut:
    """A page as clients see it: JSON items and an opaque continuation."""

    items: list[dict[str, Any]]
    continuation: str | None


class TimelineService:
    """What the API does. Every write queues its message *before* it changes storage, so a
    stored change always has its fan-out queued; the worker waits for a change that is
    still on its way, and treats one that never arrived as never made. A request repeated
    after a lost answer changes nothing twice: facts and their counters change together in
    one transaction, and no message is sent unless the state really changes."""

    def __init__(
        self,
        repositories: Repositories,
        queue: MessageSender,
        signer: TokenSigner,
        *,
        page_size: int,
        max_post_chars: int,
        limits: RateLimits,
        home: HomeTimeline,
        timeline_cap: int = 0,
    ) -> None:
        self._repos = repositories
        self._queue = queue
        self._signer = signer
        self._page_size = page_size
        self._max_post_chars = max_post_chars
        self._limits = limits
        self._home = home
        self._cap = timeline_cap

    def authenticate(self, token: str) -> str:
        """The user id a bearer token acts as (no storage read)."""
        return self._signer.verify_bearer(token)

    async def register(
        self, user_id: str, display_name: str | None, *, client: str, idempotency_key: str | None
    ) -> tuple[User, str]:
        """Create the user; a retry with the first request's idempotency key gets a token too."""
        validate_user_id(user_id)
        validate_idempotency_key(idempotency_key)
        name = (
            user_id
            if display_name is None
            else clean_text(display_name, max_chars=MAX_DISPLAY_NAME_CHARS, field="display_name")
        )
        await self._limits.registrations.check(client)
        user = User(user_id=user_id, display_name=name, created_at=datetime.now(UTC))
        if not await self._repos.users.create(user, idempotency_key):
            user = await self.profile(user_id)
        return user, self._signer.mint_bearer(user_id)

    async def profile(self, user_id: str) -> User:
        user = await self._repos.users.get(validate_user_id(user_id))
        if user is None:
            raise _user_not_found(user_id)
        return user

    async def create_post(
        self, actor: str, author: str, text: str, *, idempotency_key: str | None = None
    ) -> Post:
        _require_self(actor, author)
        validate_idempotency_key(idempotency_key)
        cleaned = clean_text(text, max_chars=self._max_post_chars)
        await self._limits.posts.check(author)
        if idempotency_key is not None:
            earlier = await self._repos.posts.by_key(author, idempotency_key)
            if earlier is not None:
                return earlier
        post = Post(post_id=new_post_id(now_ticks()), author=author, text=cleaned)
        await self._queue.send(PostCreated(author=author, post_id=post.post_id))
        return await self._repos.posts.add(post, idempotency_key)

    async def get_post(self, author: str, post_id: str) -> Post:
        validate_user_id(author)
        post = await self._repos.posts.get(author, validate_post_id(post_id))
        if post is None:
            raise NotFoundError(f"post {post_id!r} not found", code="post_not_found")
        return post

    async def delete_post(self, actor: str, author: str, post_id: str) -> None:
        """Queue the delete, then delete the source row; the worker deletes it too if this
        request dies first, so a queued delete always happens."""
        _require_self(actor, author)
        await self.get_post(author, post_id)
        await self._limits.writes.check(actor)
        await self._queue.send(PostDeleted(author=author, post_id=post_id))
        await self._repos.posts.delete(author, post_id)

    async def follow(self, actor: str, follower: str, subject: str) -> None:
        _require_self(actor, follower)
        validate_user_id(subject)
        if subject == follower:
            raise InvalidInputError("users cannot follow themselves", code="self_follow")
        await self._limits.writes.check(actor)
        if not await self._repos.users.exists(subject):
            raise _user_not_found(subject)
        follows = self._repos.follows
        if await follows.is_following(follower, subject):
            await follows.repair_index(follower, subject)
            return
        requested = now_ticks()
        await self._queue.send(Followed(follower=follower, subject=subject, requested=requested))
        await follows.add(
            follower, subject, datetime.now(UTC), request=request_id(follower, requested)
        )
        await follows.sync_index(follower, subject)

    async def unfollow(self, actor: str, follower: str, subject: str) -> None:
        _require_self(actor, follower)
        validate_user_id(subject)
        await self._limits.writes.check(actor)
        follows = self._repos.follows
        if not await follows.is_following(follower, subject):
            await follows.repair_index(follower, subject)
            return
        requested = now_ticks()
        await self._queue.send(Unfollowed(follower=follower, subject=subject, requested=requested))
        await follows.remove(follower, subject, request=request_id(follower, requested))
        await follows.sync_index(follower, subject)

    async def home_timeline(
        self, actor: str, owner: str, limit: int | None, continuation: str | None
    ) -> PageOut:
        """The owner's timeline merged with the large authors it follows (``timeline.home``);
        the continuation counts what was served, so no page reads past the cap."""
        _require_self(actor, owner)
        scope = f"timeline:{owner}"
        position, served = _home_position(self._continuation(scope, continuation))
        wanted = self._limit(limit)
        if self._cap:
            wanted = min(wanted, self._cap - served)
            if wanted <= 0:
                return PageOut(items=[], continuation=None)
        posts, following = await self._home.page(owner, wanted, position)
        served += len(posts)
        if following is None or (self._cap and served >= self._cap):
            return self._page_out(scope, Page(posts, None), Post.to_json)
        token = {
            AFTER: following.after,
            LISTED: ",".join(following.listed or ()),
            SERVED: str(served),
        }
        return self._page_out(scope, Page(posts, token), Post.to_json)

    async def author_posts(
        self, author: str, limit: int | None, continuation: str | None
    ) -> PageOut:
        return await self._public_listing(
            "posts", author, self._repos.posts.page, Post.to_json, limit, continuation
        )

    async def followers(self, user_id: str, limit: int | None, continuation: str | None) -> PageOut:
        return await self._public_listing(
            "followers", user_id, self._repos.follows.followers_page, Edge.to_json, limit,
            continuation,
        )  # fmt: skip

    async def following(self, user_id: str, limit: int | None, continuation: str | None) -> PageOut:
        return await self._public_listing(
            "following", user_id, self._repos.follows.following_page, Edge.to_json, limit,
            continuation,
        )  # fmt: skip

    async def _public_listing(
        self,
        kind: str,
        user_id: str,
        fetch: Callable[[str, int, dict[str, str] | None], Awaitable[Page[T]]],
        to_json: Callable[[T], dict[str, Any]],
        limit: int | None,
        continuation: str | None,
    ) -> PageOut:
        """A page of a user's public list; an empty first page of an unknown user is a 404."""
        scope = f"{kind}:{validate_user_id(user_id)}"
        page = await fetch(user_id, self._limit(limit), self._continuation(scope, continuation))
        if not page.items and continuation is None and not await self._repos.users.exists(user_id):
            raise _user_not_found(user_id)
        return self._page_out(scope, page, to_json)

    def _limit(self, limit: int | None) -> int:
        if limit is None:
            return self._page_size
        if not 1 <= limit <= self._page_size:
            raise InvalidInputError(
                f"limit must be between 1 and {self._page_size}", code="invalid_limit"
            )
        return limit

    def _continuation(self, scope: str, continuation: str | None) -> dict[str, str] | None:
        return (
            None if continuation is None else self._signer.decode_continuation(scope, continuation)
        )

    def _page_out(
        self, scope: str, page: Page[T], to_json: Callable[[T], dict[str, Any]]
    ) -> PageOut:
        token = page.continuation
        return PageOut(
            items=[to_json(item) for item in page.items],
            continuation=None if token is None else self._signer.encode_continuation(scope, token),
        )


SERVED = "n"
"""In a home timeline's continuation: entries served so far (pages stop at the cap)."""
AFTER = "a"
"""In a home timeline's continuation: the last row key served (or the merge bound)."""
LISTED = "m"
"""In a home timeline's continuation: the authors the first page merged, comma-separated."""
_ROW_KEY = re.compile(r"[0-9]{19}_[0-9a-f]{26}\Z|0\Z")


def _home_position(token: dict[str, str] | None) -> tuple[Position, int]:
    """The position and served count of a home timeline continuation; a token from before
    hybrid fan-out (a storage continuation) resumes that query and merges nothing."""
    if token is None:
        return Position(), 0
    served = token.get(SERVED, "0")
    if AFTER in token:
        after = token[AFTER]
        listed = tuple(author for author in token.get(LISTED, "").split(",") if author)
        valid = _ROW_KEY.match(after) and all(map(_USER_ID.match, listed))
        position = Position(after, listed)
    else:
        resume = {key: value for key, value in token.items() if key != SERVED}
        valid = bool(resume) and LISTED not in resume
        position = Position(listed=(), resume=resume)
    if not valid or not served.isdigit():
        raise InvalidInputError("the continuation token is malformed", code="invalid_continuation")
    return position, int(served)


def _require_self(actor: str, user_id: str) -> None:
    validate_user_id(user_id)
    if actor != user_id:
        raise PermissionDeniedError(
            f"this token acts as {actor!r}, not {user_id!r}", code="forbidden"
        )


def _user_not_found(user_id: str) -> NotFoundError:
    return NotFoundError(f"user {user_id!r} not found", code="user_not_found")
