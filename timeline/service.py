"""Domain operations behind the REST API: validation, authorization, storage, queueing."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from timeline.entities import Edge, Page, Post, User
from timeline.errors import (
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
    TimelineError,
)
from timeline.keys import (
    clean_text,
    new_post_id,
    now_ticks,
    validate_post_id,
    validate_user_id,
)
from timeline.messages import Followed, PostCreated, PostDeleted, Unfollowed
from timeline.queue import FanoutQueue
from timeline.ratelimit import PostRateLimiter
from timeline.repositories import Repositories
from timeline.tokens import TokenSigner

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_DISPLAY_NAME_CHARS = 64


@dataclass(frozen=True, slots=True)
class PageOut:
    """A page as clients see it: JSON items and an opaque continuation."""

    items: list[dict[str, Any]]
    continuation: str | None


class TimelineService:
    def __init__(
        self,
        repositories: Repositories,
        queue: FanoutQueue,
        signer: TokenSigner,
        *,
        page_size: int,
        max_post_chars: int,
        rate_limiter: PostRateLimiter | None,
    ) -> None:
        self._repos = repositories
        self._queue = queue
        self._signer = signer
        self._page_size = page_size
        self._max_post_chars = max_post_chars
        self._rate_limiter = rate_limiter

    def authenticate(self, token: str) -> str:
        """The user id a bearer token acts as (no storage read)."""
        return self._signer.verify_bearer(token)

    async def register(self, user_id: str, display_name: str | None) -> tuple[User, str]:
        validate_user_id(user_id)
        name = (
            user_id
            if display_name is None
            else clean_text(display_name, max_chars=MAX_DISPLAY_NAME_CHARS, field="display_name")
        )
        user = User(user_id=user_id, display_name=name, created_at=datetime.now(UTC))
        await self._repos.users.create(user)
        return user, self._signer.mint_bearer(user_id)

    async def profile(self, user_id: str) -> User:
        user = await self._repos.users.get(validate_user_id(user_id))
        if user is None:
            raise _user_not_found(user_id)
        return user

    async def create_post(self, actor: str, author: str, text: str) -> Post:
        _require_self(actor, author)
        post = Post(
            post_id=new_post_id(now_ticks()),
            author=author,
            text=clean_text(text, max_chars=self._max_post_chars),
        )
        if self._rate_limiter is not None:
            await self._rate_limiter.check(author)
        await self._repos.posts.add(post)
        try:
            await self._queue.send(PostCreated(author=author, post_id=post.post_id))
        except TimelineError:
            await self._undo_post(post)
            raise
        await self._repos.users.adjust_counters(author, posts=1)
        return post

    async def _undo_post(self, post: Post) -> None:
        """Best effort: a post that could not be queued is not kept half-published."""
        try:
            await self._repos.posts.delete(post.author, post.post_id)
        except TimelineError:
            log.warning("post %s kept without fan-out: storage failed twice", post.post_id)

    async def get_post(self, author: str, post_id: str) -> Post:
        validate_user_id(author)
        post = await self._repos.posts.get(author, validate_post_id(post_id))
        if post is None:
            raise NotFoundError(f"post {post_id!r} not found", code="post_not_found")
        return post

    async def delete_post(self, actor: str, author: str, post_id: str) -> None:
        """Queue the delete first: the worker deletes the source row before purging copies, so
        a fan-out that re-checks the source after writing can never outlive the delete."""
        _require_self(actor, author)
        await self.get_post(author, post_id)
        await self._queue.send(PostDeleted(author=author, post_id=post_id))
        if await self._repos.posts.delete(author, post_id):
            await self._repos.users.adjust_counters(author, posts=-1)

    async def follow(self, actor: str, follower: str, subject: str) -> None:
        _require_self(actor, follower)
        validate_user_id(subject)
        if subject == follower:
            raise InvalidInputError("users cannot follow themselves", code="self_follow")
        if not await self._repos.users.exists(subject):
            raise _user_not_found(subject)
        if await self._repos.follows.add(follower, subject, datetime.now(UTC)):
            await self._repos.users.adjust_counters(follower, following=1)
            await self._repos.users.adjust_counters(subject, followers=1)
        await self._queue.send(Followed(follower=follower, subject=subject))

    async def unfollow(self, actor: str, follower: str, subject: str) -> None:
        _require_self(actor, follower)
        validate_user_id(subject)
        if await self._repos.follows.remove(follower, subject):
            await self._repos.users.adjust_counters(follower, following=-1)
            await self._repos.users.adjust_counters(subject, followers=-1)
        await self._queue.send(Unfollowed(follower=follower, subject=subject))

    async def home_timeline(
        self, actor: str, owner: str, limit: int | None, continuation: str | None
    ) -> PageOut:
        _require_self(actor, owner)
        scope = f"timeline:{owner}"
        page = await self._repos.timelines.page(
            owner, self._limit(limit), self._continuation(scope, continuation)
        )
        return self._page_out(scope, page, Post.to_json)

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


def _require_self(actor: str, user_id: str) -> None:
    validate_user_id(user_id)
    if actor != user_id:
        raise PermissionDeniedError(
            f"this token acts as {actor!r}, not {user_id!r}", code="forbidden"
        )


def _user_not_found(user_id: str) -> NotFoundError:
    return NotFoundError(f"user {user_id!r} not found", code="user_not_found")
