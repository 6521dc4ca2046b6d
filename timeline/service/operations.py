"""Domain operations behind the REST API: validation, authorization, storage, queueing."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

from timeline.errors import (
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
)
from timeline.model.entities import Edge, Page, Post, User
from timeline.model.keys import (
    USER_ID_PATTERN,
    clean_text,
    new_post_id,
    now_ticks,
    validate_idempotency_key,
    validate_post_id,
    validate_user_id,
)
from timeline.model.messages import Followed, PostCreated, PostDeleted, Unfollowed
from timeline.model.tokens import POSITION_KEY, TokenSigner
from timeline.reads.home import HomeTimeline, Position
from timeline.reads.live import TimelineWatch
from timeline.storage.queue import MessageSender
from timeline.tables.audience import FIRST_POST_KEY
from timeline.tables.follows import request_id
from timeline.tables.ratelimits import RateLimits
from timeline.tables.repositories import Repositories
from timeline.tables.rows import META

T = TypeVar("T")
_USER_ID = re.compile(USER_ID_PATTERN.replace("$", r"\Z"))
MAX_DISPLAY_NAME_CHARS = 64


@dataclass(frozen=True, slots=True)
class PageOut:
    """A page as clients see it: JSON items, an opaque continuation and, for lists of posts,
    the signed position of the page's newest item (what ``since`` takes)."""

    items: list[dict[str, Any]]
    continuation: str | None
    newest: str | None = None


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

    def token_expiry(self, token: str) -> int:
        """When a verified bearer token expires (Unix seconds): a stream ends then."""
        return self._signer.bearer_expiry(token)

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
        self,
        actor: str,
        owner: str,
        limit: int | None,
        continuation: str | None,
        since: str | None = None,
    ) -> PageOut:
        """The owner's timeline merged with the large authors it follows (``timeline.reads.home``);
        the continuation counts what was served, so no page reads past the cap. With
        ``since``, only what is newer than that position, paged down to it."""
        _require_self(actor, owner)
        scope = f"timeline:{owner}"
        position, served = _home_position(self._continuation(scope, continuation))
        position = self._newer_than(scope, position, since)
        wanted = self._limit(limit)
        if self._cap:
            wanted = min(wanted, self._cap - served)
            if wanted <= 0:
                return PageOut(items=[], continuation=None)
        posts, following = await self._home.page(owner, wanted, position)
        served += len(posts)
        if following is None or (self._cap and served >= self._cap):
            return self._posts_out(scope, Page(posts, None))
        token = {
            AFTER: following.after,
            LISTED: ",".join(following.listed or ()),
            SERVED: str(served),
        }
        if following.until != META:
            token[UNTIL] = following.until
        return self._posts_out(scope, Page(posts, token))

    async def watch_timeline(
        self,
        actor: str,
        owner: str,
        since: str | None,
        *,
        lookback_s: float,
        since_name: str = "since",
    ) -> TimelineWatch:
        """What a live stream of the owner's timeline sends: entries newer than the position
        ``since`` names (a ``Last-Event-ID``), or, without one, those that land from now.
        A poll sends at most a timeline's worth (the cap), however old the position."""
        _require_self(actor, owner)
        most = self._cap or MAX_STREAM_ENTRIES
        watch = TimelineWatch(self._home, owner, lookback_s=lookback_s, max_entries=most)
        if since is not None:
            scope = f"timeline:{owner}"
            watch.start_after(self._signer.decode_position(scope, since, name=since_name))
            return watch
        newest, _ = await self._home.page(owner, 1, Position())
        watch.start_after(newest[0].row_key if newest else None)
        await watch.skip_present()
        return watch

    def position_token(self, owner: str, row_key: str) -> str:
        """What a stream event's id carries: the same signed position as a page's newest."""
        return self._signer.encode_position(f"timeline:{owner}", row_key)

    async def author_posts(
        self,
        author: str,
        limit: int | None,
        continuation: str | None,
        since: str | None = None,
    ) -> PageOut:
        """A user's own posts, newest first; with ``since``, only those newer than it."""
        scope = f"posts:{validate_user_id(author)}"
        token = self._continuation(scope, continuation)
        until = token.pop(UNTIL, None) if token else None
        until = self._since(scope, since, until) or META
        page = await self._repos.posts.page(author, self._limit(limit), token or None, until)
        if not page.items and not (continuation or since):
            await self._require_user(author)
        if page.continuation is not None and until != META:
            page = Page(page.items, {**page.continuation, UNTIL: until})
        return self._posts_out(scope, page)

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
        if not page.items and continuation is None:
            await self._require_user(user_id)
        return self._page_out(scope, page, to_json)

    async def _require_user(self, user_id: str) -> None:
        if not await self._repos.users.exists(user_id):
            raise _user_not_found(user_id)

    def _newer_than(self, scope: str, position: Position, since: str | None) -> Position:
        """``position`` bounded by ``since``, which must agree with a continuation's bound."""
        given = position.until if position.until != META else None
        until = self._since(scope, since, given)
        return position if until is None else replace(position, until=until)

    def _since(self, scope: str, since: str | None, carried: str | None) -> str | None:
        """The row key a newer-than read stops at: from ``since``, or carried on by the
        continuation (a client that repeats ``since`` with a continuation must repeat it
        unchanged)."""
        if since is None:
            return carried
        until = self._signer.decode_position(scope, since)
        if carried is not None and carried != until:
            raise InvalidInputError(
                "this continuation belongs to a read with another 'since'", code="invalid_since"
            )
        return until

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

    def _posts_out(self, scope: str, page: Page[Post]) -> PageOut:
        """A page of posts, with the position of its newest item."""
        out = self._page_out(scope, page, Post.to_json)
        if page.items:
            newest = self._signer.encode_position(scope, page.items[0].row_key)
            out = replace(out, newest=newest)
        return out

    def _page_out(
        self, scope: str, page: Page[T], to_json: Callable[[T], dict[str, Any]]
    ) -> PageOut:
        token = page.continuation
        return PageOut(
            items=[to_json(item) for item in page.items],
            continuation=None if token is None else self._signer.encode_continuation(scope, token),
        )


MAX_STREAM_ENTRIES = 1000
"""The most entries one poll of a stream sends when timelines are not capped."""
SERVED = "n"
"""In a home timeline's continuation: entries served so far (pages stop at the cap)."""
AFTER = "a"
"""In a home timeline's continuation: the last row key served (or the merge bound)."""
LISTED = "m"
"""In a home timeline's continuation: the authors the first page merged, comma-separated."""
UNTIL = "u"
"""In a newer-than read's continuation: the row key its pages stop at (its ``since``)."""


def _home_position(token: dict[str, str] | None) -> tuple[Position, int]:
    """The position and served count of a home timeline continuation; a token from before
    hybrid fan-out (a storage continuation) resumes that query and merges nothing."""
    if token is None:
        return Position(), 0
    served = token.get(SERVED, "0")
    if AFTER in token:
        after = token[AFTER]
        listed = tuple(author for author in token.get(LISTED, "").split(",") if author)
        until = token.get(UNTIL, META)
        valid = (
            (after == FIRST_POST_KEY or POSITION_KEY.match(after))
            and all(map(_USER_ID.match, listed))
            and (until == META or POSITION_KEY.match(until))
        )
        position = Position(after, listed, until=until)
    else:
        resume = {key: value for key, value in token.items() if key != SERVED}
        valid = bool(resume) and LISTED not in resume and UNTIL not in resume
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
