"""A deleted account (``AccountDeleted``): everything of it undone by the messages that undo
each thing, then its partitions dropped; and a follow or unfollow whose side is gone (a
deleted account or list) ends at once.

The deletion sends, page by page and as background work, what the API would send to undo
each of the account's things one by one: a ``ListDeleted`` per list it owns, an
``Unfollowed`` per follow either way (list memberships included, and every pair whose index
row may still name it: its ``~unfollowed-`` rows), an ``Unreposted`` per repost and a
``PostDeleted`` per post, a ``ReplyDetached`` per reply to its posts (its ``~re-`` rows,
which each reply's pass drops once done, or once it finds no reply to wait for), and a
``RelationChanged`` per block and mute either way (whose pass deletes both rows of a pair
with a deleted side). Those messages' own passes make each undo
exact, as they do for the API. Each is sent *before* anything it undoes changes (they
change it themselves), so a lease that dies midway is redone from what storage still shows.

Why nothing stays. The tombstone is written before the message is released, so every
request that could add a row of the account was accepted before it (or, in another API
process, within the credentials cache period after it) and lands within the API's hidden
time; so does a reply to its posts (the API checks the tombstone). The sweep runs again
every ``account_every_s`` (longer than both together) until one finds nothing left: no
post, repost, repost index or reply index row in its ``posts`` partition, no follower or
list membership in ``subjectFollowers``, no follow in ``subjectFollowing``, no block or mute
either way in ``relations`` (a pair's pass deletes the deleted user's row last). Only then
are the account's partitions dropped. A follow or unfollow message that runs later finds a
side gone and ends the pair (``end``): it never recreates a row of the account (the counter
rows it leaves in a finished deletion's partitions it drops).
"""

from __future__ import annotations

import asyncio
from typing import get_args

from timeline.delivery.context import Context
from timeline.delivery.feed import Feed
from timeline.delivery.outcomes import DONE, Continue, Outcome
from timeline.delivery.regrade import queue_regrade_if_due
from timeline.errors import ConfigurationError
from timeline.model.entities import Page
from timeline.model.keys import list_id_of, list_owner
from timeline.model.messages import (
    AccountDeleted,
    FanoutMessage,
    Followed,
    ListDeleted,
    Phase,
    PostDeleted,
    RelationChanged,
    ReplyDetached,
    Unfollowed,
    Unreposted,
)
from timeline.storage.queue import MessageSender
from timeline.tables.audience import MERGE_PREFIX

ITEMS_PER_LEASE = 100
"""Things one lease undoes (a message sent for each)."""
ORDER: tuple[Phase, ...] = tuple(phase for phase in get_args(Phase) if phase != "drop")
"""The sweep's phases; ``drop`` follows the last."""


class AccountRemoval:
    def __init__(self, context: Context, feed: Feed) -> None:
        self._ctx = context
        self._repos = context.repos
        self._feed = feed

    async def remove(self, message: AccountDeleted) -> Outcome:
        user = message.user
        if not await self._repos.users.deleted(user):  # its request died before the tombstone
            await self._repos.users.forget_deletion(user)  # (or the message is forged)
            return DONE
        if message.phase == "drop":
            return await self._drop(message)
        page = await self._undo_page(user, message.phase, message.cursor, message.sweep)
        if page.continuation is not None:
            return Continue(message.model_copy(update={"cursor": page.continuation}))
        following = ORDER.index(message.phase) + 1
        phase = ORDER[following] if following < len(ORDER) else "drop"
        update: dict[str, object] = {"phase": phase, "cursor": None}
        if phase == "drop" and not message.confirm:  # the first sweep: a second one later
            update = {
                "phase": ORDER[0],
                "cursor": None,
                "confirm": True,
                "sweep": message.sweep + 1,
            }
            return Continue(message.model_copy(update=update), delay_s=self._account_sweep_s)
        return Continue(message.model_copy(update=update))

    @property
    def _sweep_s(self) -> float:
        return self._ctx.timing.sweep_delay_s

    @property
    def _account_sweep_s(self) -> float:
        return self._ctx.timing.account_every_s

    async def _undo_page(
        self, user: str, phase: Phase, cursor: dict[str, str] | None, sweep: int
    ) -> Page[object]:
        """Send the undo of one page of the phase's things (in the ``sweep``-th sweep)."""
        repos, limit = self._repos, ITEMS_PER_LEASE
        messages: list[FanoutMessage] = []
        page: Page[object]
        match phase:
            case "lists":
                lists = await repos.lists.lists_page(user, limit, cursor)
                messages = [ListDeleted(owner=user, list_id=item.list_id) for item in lists.items]
                page = Page(list(lists.items), lists.continuation)
            case "following":
                subjects = await repos.follows.index_page(user, limit, cursor)
                messages = [Unfollowed(follower=user, subject=s) for s in subjects.items]
                page = Page(list(subjects.items), subjects.continuation)
            case "followers" | "unfollowed":
                readers = await (
                    repos.follows.follower_ids_page
                    if phase == "followers"
                    else repos.follows.left_page
                )(user, limit, cursor)
                messages = [Unfollowed(follower=r, subject=user) for r in readers.items]
                page = Page(list(readers.items), readers.continuation)
            case "reposts":
                reposts = await repos.reposts.own_page(user, limit, cursor)
                messages = [
                    Unreposted(reposter=user, author=author, post_id=post, repost_id=repost)
                    for author, post, repost in reposts.items
                ]
                page = Page(list(reposts.items), reposts.continuation)
            case _:
                return await self._undo_rest(user, phase, cursor, sweep)
        await self._send(messages)
        return page

    async def _undo_rest(
        self, user: str, phase: Phase, cursor: dict[str, str] | None, sweep: int
    ) -> Page[object]:
        repos, limit = self._repos, ITEMS_PER_LEASE
        if phase == "posts":
            posts = await repos.posts.page(user, limit, cursor)
            await self._send(
                [
                    PostDeleted(
                        author=user,
                        post_id=post.post_id,
                        reply_author=post.replied_user,
                        reply_post=post.reply_post,
                    )
                    for post in posts.items
                ]
            )
            return Page(list(posts.items), posts.continuation)
        if phase == "replies":  # each, unless one sent by this or the last sweep has begun
            replies = await repos.reposts.replies_to_page(user, limit, cursor, sweep - 1)
            await self._send(
                [
                    ReplyDetached(author=a, post_id=p, target=user, target_post=q, sweep=sweep)
                    for a, p, q in replies.items
                ]
            )
            return Page(list(replies.items), replies.continuation)
        relations = repos.relations
        messages: list[FanoutMessage]
        page: Page[object]
        if phase == "blocks":  # both ways: its "b-" and "B-" rows
            blocks = await relations.ends_page(user, limit, cursor)
            messages = [RelationChanged(kind="block", actor=a, other=o) for a, o in blocks.items]
            page = Page(list(blocks.items), blocks.continuation)
        elif phase == "mutes":
            mutes = await relations.mutes_page(user, limit, cursor)
            messages = [
                RelationChanged(kind="mute", actor=user, other=mute.user_id) for mute in mutes.items
            ]
            page = Page(list(mutes.items), mutes.continuation)
        else:
            muters = await relations.muters_page(user, limit, cursor)
            messages = [RelationChanged(kind="mute", actor=m, other=user) for m in muters.items]
            page = Page(list(muters.items), muters.continuation)
        await self._send(messages)
        return page

    async def _send(self, messages: list[FanoutMessage]) -> None:
        """Send them as background work (user-facing work goes first)."""
        queue = self._queue()
        background = [message.model_copy(update={"background": True}) for message in messages]
        await asyncio.gather(*(queue.send(message) for message in background))

    def _queue(self) -> MessageSender:
        if self._ctx.queue is None:
            raise ConfigurationError("an account's deletion needs the processor's queue")
        return self._ctx.queue

    async def _drop(self, message: AccountDeleted) -> Outcome:
        """Once a sweep finds nothing of the account left to undo, drop its partitions; else
        sweep again later (what it sent then, or a request that landed late, is still at
        work)."""
        user = message.user
        if await self._repos.users.undone(user):
            await self._repos.users.drop_account(user)
            return DONE
        update = {"phase": ORDER[0], "cursor": None, "confirm": True, "sweep": message.sweep + 1}
        again = message.model_copy(update=update)
        return Continue(again, delay_s=self._account_sweep_s)

    async def gone(self, message: Followed | Unfollowed) -> bool:
        """Whether a side of the pair is gone: a deleted list (or a list of a deleted owner)
        or a deleted account. Point reads, in parallel: the list's row for a list, and the
        tombstones of the users."""
        reader, subject = message.follower, message.subject
        owner = list_owner(reader)
        checks = [self._repos.users.deleted(subject), self._repos.users.deleted(owner or reader)]
        if owner is not None:
            checks.append(self._list_missing(owner, list_id_of(reader)))
        return any(await asyncio.gather(*checks))

    async def _list_missing(self, owner: str, list_id: str) -> bool:
        return await self._repos.lists.get(owner, list_id) is None

    async def end(self, message: Followed | Unfollowed) -> Outcome:
        """End a pair with a gone side; now and once more ``account_every_s`` later (a request
        or delivery in flight may still write). The follow goes (uncounted), and the index
        row after it is synced (the follower's count), then the reader's copies: its whole
        timeline if the reader is gone (and its request to follow the subject, if any), else
        the subject's copies in it, and the trace of its merge row's removal (a stream needs
        none: the subject has no posts left to merge). A deleted account whose deletion has
        ended loses the counter rows this left. Only this pair: a backlog
        of such messages costs one end each."""
        reader, subject = message.follower, message.subject
        follows, users = self._repos.follows, self._repos.users
        await follows.remove(reader, subject)
        await self._feed.unmerge_if_unfollowed(reader, subject)
        await follows.sync_index(reader, subject)
        await follows.drop_index_row(reader, subject)
        await follows.drop_left(reader, subject)
        reader_gone = await self._reader_gone(reader)
        if reader_gone:
            await follows.drop_request(reader, subject)  # a gone user's request to follow
            await self._repos.timelines.drop(reader)
        else:
            await self._feed.purge(reader, subject)
        if await users.deleted(subject):
            if not reader_gone:  # the merge row's removal trace names the deleted subject
                await self._repos.timelines.drop_trace(reader, MERGE_PREFIX + subject)
            await users.tidy_after(subject)
        else:
            await queue_regrade_if_due(self._repos, self._ctx.hybrid, subject)
        if reader_gone and list_owner(reader) is None:
            await users.tidy_after(reader)
        if not message.confirm:  # after what a request still in flight may write
            again = message.model_copy(update={"confirm": True})
            return Continue(again, delay_s=self._account_sweep_s)
        a_list = reader_gone and list_owner(reader) is not None
        if a_list and not (await follows.index_page(reader, 1, None)).items:
            await follows.drop_index(reader)  # its counter rows, once no member is left
        return DONE

    async def _reader_gone(self, reader: str) -> bool:
        owner = list_owner(reader)
        if owner is None:
            return await self._repos.users.deleted(reader)
        gone = await asyncio.gather(
            self._repos.users.deleted(owner), self._list_missing(owner, list_id_of(reader))
        )
        return any(gone)
