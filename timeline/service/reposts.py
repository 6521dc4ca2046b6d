"""Reposts (repost, undo) and a post's replies listing; a reply itself is a post
(``timeline.service.posts``), whose target this module checks and files.

A repost is written, then its message released (``timeline.service.outbox``); an undo queues
its message first, then turns the row ``void`` (the worker finds it undone either way)."""

from __future__ import annotations

from typing import Any

from timeline.errors import NotFoundError, PermissionDeniedError
from timeline.model.entities import Page, Post
from timeline.model.keys import new_post_id, now_ticks, validate_post_id, validate_user_id
from timeline.model.messages import Reposted, Unreposted
from timeline.reads.private import may_see, unseen_authors
from timeline.service.accounts import require_self
from timeline.service.outbox import Outbox
from timeline.service.paging import PageOut, Pager
from timeline.service.relations import refuse_if_blocked
from timeline.tables.follows import FollowsRepository
from timeline.tables.posts import PostsRepository
from timeline.tables.ratelimits import RateLimiter
from timeline.tables.relations import RelationsRepository
from timeline.tables.reposts import RepostsRepository, live_replies


class Reposts:
    """Reposts and replies: what the API does with them."""

    def __init__(
        self,
        posts: PostsRepository,
        reposts: RepostsRepository,
        outbox: Outbox,
        pager: Pager,
        *,
        writes: RateLimiter,
        relations: RelationsRepository,
        follows: FollowsRepository,
    ) -> None:
        self._posts = posts
        self._follows = follows
        self._relations = relations
        self._reposts = reposts
        self._outbox = outbox
        self._pager = pager
        self._writes = writes

    async def repost(self, actor: str, reposter: str, author: str, post_id: str) -> dict[str, Any]:
        """Repost ``author``'s post (idempotent: a second repost of it is the first)."""
        require_self(actor, reposter)
        original = await self.target(author, post_id, code="post_not_found", reader=reposter)
        if original.followers_only:
            raise PermissionDeniedError(
                "a followers-only post cannot be reposted", code="not_repostable"
            )
        existing = await self._reposts.live_id(reposter, post_id)
        if existing is None:
            await refuse_if_blocked(self._relations, reposter, author, "repost")
            await self._writes.check(actor)
            existing = new_post_id(now_ticks())
            message = Reposted(
                reposter=reposter, author=author, post_id=post_id, repost_id=existing
            )
            async with self._outbox.written(message):
                await self._reposts.note_index(author, post_id, reposter, existing)
                await self._reposts.create(reposter, author, post_id, existing)
        return {**original.to_json(), "reposted_by": reposter, "repost_id": existing}

    async def unrepost(self, actor: str, reposter: str, post_id: str) -> None:
        """Undo the reposter's repost of the post (idempotent: none is fine)."""
        require_self(actor, reposter)
        validate_post_id(post_id)
        row = await self._reposts.truth(reposter, post_id)
        if row is None or row.get("void"):
            return
        await self._writes.check(actor)
        repost_id = str(row["repost_id"])
        message = Unreposted(
            reposter=reposter, author=str(row["author"]), post_id=post_id, repost_id=repost_id
        )
        await self._outbox.queue.send(message)
        await self._reposts.remove(reposter, post_id, repost_id)

    async def target(self, author: str, post_id: str, *, code: str, reader: str | None) -> Post:
        """The post a repost or reply names; a 404 with ``code`` when it does not exist or
        ``reader`` may not see it (a followers-only post of an author it does not follow)."""
        validate_user_id(author)
        validate_post_id(post_id)
        post = await self._posts.get(author, post_id)
        if post is None or not await may_see(self._follows, reader, author, post.visibility):
            raise NotFoundError(f"post {post_id!r} of {author!r} not found", code=code)
        return post

    async def replies(
        self,
        author: str,
        post_id: str,
        limit: int | None,
        continuation: str | None,
        *,
        reader: str | None = None,
    ) -> PageOut:
        """A post's replies, newest first, one index query a page (then a point read per
        reply: the index may name a reply deleted since, or never stored), without the
        followers-only ones ``reader`` may not see (such a page may be short)."""
        scope = f"replies:{validate_user_id(author)}:{validate_post_id(post_id)}"
        token = self._pager.continuation(scope, continuation)
        await self.target(author, post_id, code="post_not_found", reader=reader)
        page = await self._reposts.replies_page(author, post_id, self._pager.limit(limit), token)
        found = await live_replies(self._posts, page.items)
        found = [post for post in found if post.reply_post == post_id]
        rows = [{"author": post.author, "visibility": post.visibility} for post in found]
        unseen = await unseen_authors(self._follows, reader, rows)
        found = [post for post in found if not (post.followers_only and post.author in unseen)]
        return self._pager.posts_out(scope, Page(found, page.continuation))
