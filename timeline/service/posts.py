"""Posts: publish, read and delete one post (the fan-out is the worker's)."""

from __future__ import annotations

from timeline.errors import NotFoundError
from timeline.model.entities import FOLLOWERS, Post
from timeline.model.idempotency import IdempotencyKeys
from timeline.model.keys import (
    POST_FORMAT_CHARACTERS,
    clean_text,
    new_post_id,
    now_ticks,
    validate_idempotency_key,
    validate_post_id,
    validate_user_id,
)
from timeline.model.messages import PostCreated, PostDeleted
from timeline.reads.private import may_see
from timeline.service.accounts import require_self
from timeline.service.outbox import Outbox
from timeline.service.relations import refuse_if_blocked
from timeline.tables.follows import FollowsRepository
from timeline.tables.posts import PostsRepository
from timeline.tables.ratelimits import RateLimiter
from timeline.tables.relations import RelationsRepository
from timeline.tables.reposts import RepostsRepository
from timeline.tables.users import UsersRepository


class Posts:
    """A post is written, then its message released (``timeline.service.outbox``); a delete
    queues its message first, then deletes (the worker completes a delete whose request died)."""

    def __init__(
        self,
        posts: PostsRepository,
        outbox: Outbox,
        *,
        max_post_chars: int,
        posting: RateLimiter,
        writes: RateLimiter,
        keys: IdempotencyKeys,
        replies: RepostsRepository,
        relations: RelationsRepository,
        follows: FollowsRepository,
        users: UsersRepository,
    ) -> None:
        self._posts = posts
        self._users = users
        self._follows = follows
        self._relations = relations
        self._replies = replies
        self._keys = keys
        self._outbox = outbox
        self._max_post_chars = max_post_chars
        self._posting = posting
        self._writes = writes

    async def create(
        self,
        actor: str,
        author: str,
        text: str,
        *,
        idempotency_key: str | None = None,
        reply_to: tuple[str, str] | None = None,
        followers_only: bool = False,
    ) -> Post:
        """Publish a post; ``reply_to`` (author, post id): a reply, filed under that post,
        which must exist and be visible to the author (404 ``reply_target_not_found``);
        ``followers_only``: only the author's followers get it and see it."""
        require_self(actor, author)
        validate_idempotency_key(idempotency_key)
        cleaned = clean_text(
            text, max_chars=self._max_post_chars, allowed_format=POST_FORMAT_CHARACTERS
        )
        target = None if reply_to is None else await self._reply_target(author, *reply_to)
        if target is not None:
            await refuse_if_blocked(self._relations, author, target.author, "reply to")
        await self._posting.check(author)
        record = None
        if idempotency_key is not None:
            request = [author, cleaned, *(reply_to or ()), *([FOLLOWERS] if followers_only else [])]
            record = self._keys.record(idempotency_key, request)
            earlier = await self._posts.by_key(author, record)
            if earlier is not None:
                return earlier
        ticks = now_ticks()
        post = Post(
            post_id=new_post_id(ticks),
            author=author,
            text=cleaned,
            reply_author=None if target is None else target.author,
            reply_post=None if target is None else target.post_id,
            visibility=FOLLOWERS if followers_only else None,
        )
        created = PostCreated(
            author=author,
            post_id=post.post_id,
            reply_author=post.reply_author,
            reply_post=post.reply_post,
        )
        async with self._outbox.written(created):
            if target is not None:  # read under the write deadline: docs/guarantees.md
                await self._refuse_if_deleted(target)  # ("Account deletion")
                await self._replies.note_reply(target.author, target.post_id, post)
            return await self._posts.add(post, record)

    async def _refuse_if_deleted(self, target: Post) -> None:
        """A reply to a deleted account's post (still there until its delete runs) would land
        after the deletion had looked for replies: refused as a post that does not exist."""
        if await self._users.deleted(target.author):
            raise NotFoundError(
                f"the post replied to ({target.author!r}, {target.post_id!r}) does not exist",
                code="reply_target_not_found",
            )

    async def _reply_target(self, replier: str, author: str, post_id: str) -> Post:
        validate_user_id(author)
        validate_post_id(post_id)
        target = await self._posts.get(author, post_id)
        if target is None or not await may_see(self._follows, replier, author, target.visibility):
            raise NotFoundError(
                f"the post replied to ({author!r}, {post_id!r}) does not exist",
                code="reply_target_not_found",
            )
        return target

    async def get(self, author: str, post_id: str, reader: str | None = None) -> Post:
        """One post; a 404 when there is none or ``reader`` (None: anonymous) may not see it
        (``timeline.reads.private``)."""
        validate_user_id(author)
        post = await self._posts.get(author, validate_post_id(post_id))
        if post is None or not await may_see(self._follows, reader, author, post.visibility):
            raise NotFoundError(f"post {post_id!r} not found", code="post_not_found")
        return post

    async def delete(self, actor: str, author: str, post_id: str) -> None:
        """Queue the delete, then delete the source row; the worker deletes it too if this
        request dies first, so a queued delete always happens."""
        require_self(actor, author)
        post = await self.get(author, post_id, actor)
        await self._writes.check(actor)
        await self._outbox.queue.send(
            PostDeleted(
                author=author,
                post_id=post_id,
                reply_author=post.replied_user,
                reply_post=post.reply_post,
            )
        )
        await self._posts.delete(author, post_id)
