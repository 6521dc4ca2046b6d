"""What the fan-out worker does with each message, and why the end state is always right.

Every decision is taken from storage: a copy is written only after reading that its post
exists and (for followers) that the follow exists, and it must be sent within
``write_deadline_s`` of that read or not at all (``PartitionWriter`` drops it). Undo happens
twice: at once, by re-checking after the write (the common race, fixed in milliseconds), and
for good by a second pass of every delete and unfollow that runs ``sweep_delay_s`` later,
after any write that read the old state has landed or been dropped. The full argument, one
interleaving at a time, is in docs/guarantees.md ("Why it is correct").

A post or delete covers one page of followers per lease; the message's cursor is advanced in
place (the worker rewrites the message), so a redelivered page never forks the chain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from timeline.delivery.accounts import AccountRemoval
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.context import Context
from timeline.delivery.delete import PostRetraction
from timeline.delivery.dormancy import Waking
from timeline.delivery.feed import Feed
from timeline.delivery.follow import FollowChanges
from timeline.delivery.lists import ListRemoval
from timeline.delivery.outcomes import Outcome
from timeline.delivery.post import PostDelivery
from timeline.delivery.regrade import Regrading
from timeline.delivery.relations import RelationRepair
from timeline.delivery.replies import ReplyDetachment
from timeline.delivery.repost import RepostDelivery, RepostRetraction
from timeline.delivery.settings import Hybrid, Timing
from timeline.model.messages import (
    AccountDeleted,
    FanoutMessage,
    Followed,
    ListDeleted,
    PostCreated,
    PostDeleted,
    Regrade,
    RelationChanged,
    ReplyDetached,
    Reposted,
    Unfollowed,
    Unreposted,
    Wake,
)
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.storage.queue import FanoutQueues, MessageSender
from timeline.tables.activity import Inactivity
from timeline.tables.repositories import Repositories
from timeline.tables.traces import trace

if TYPE_CHECKING:
    from timeline.config import Settings


def worker_writer(storage: Storage, settings: Settings) -> PartitionWriter:
    """The timelines' writer a worker runs, on these settings (the bench builds the same)."""
    return PartitionWriter(
        storage,
        TIMELINES,
        linger_s=settings.worker_linger_s,
        max_in_flight=settings.worker_write_concurrency,
        max_buffered=settings.worker_max_buffered,
        trace=trace,
    )


class FanoutProcessor:
    """Hands each message to the handler of its kind: ``post`` (``PostCreated``), ``delete``
    (``PostDeleted``), ``follow`` (``Followed``, ``Unfollowed``), ``regrade`` (``Regrade``),
    ``dormancy`` (``Wake``), ``repost`` (``Reposted``, ``Unreposted``), ``lists``
    (``ListDeleted``; a follow or unfollow of a list's members is a ``Followed`` or
    ``Unfollowed`` of the list's reader), ``accounts`` (``AccountDeleted``, and a follow or
    unfollow with a side gone), ``relations`` (``RelationChanged``), ``replies``
    (``ReplyDetached``).
    They share one ``Context`` (repositories, writer, settings, admission) and one ``Feed``
    (every write to a reader's timeline)."""

    def __init__(
        self,
        repositories: Repositories,
        writer: PartitionWriter,
        *,
        follower_page_size: int = 1000,
        timing: Timing | None = None,
        timeline_cap: int = 0,
        hybrid: Hybrid | None = None,
        inactivity: Inactivity | None = None,
        queue: MessageSender | None = None,
    ) -> None:
        context = Context(
            repositories,
            writer,
            follower_page_size=follower_page_size,
            timing=timing,
            hybrid=hybrid,
            queue=queue,
        )
        self._context = context
        feed = Feed(context, timeline_cap=timeline_cap)
        self._posts = PostDelivery(context, feed)
        self._reposts = RepostDelivery(context, feed)
        self._unreposts = RepostRetraction(context, feed)
        self._deletes = PostRetraction(context, feed)
        self._follows = FollowChanges(context, feed)
        self._regrades = Regrading(context, feed)
        self._wakes = Waking(context, feed, inactivity or Inactivity())
        self._lists = ListRemoval(context, feed)
        self._accounts = AccountRemoval(context, feed)
        self._relations = RelationRepair(context)
        self._replies = ReplyDetachment(context)

    @classmethod
    def on(
        cls,
        storage: Storage,
        writer: PartitionWriter,
        *,
        follower_page_size: int = 1000,
        timing: Timing | None = None,
        timeline_cap: int = 0,
        hybrid: Hybrid | None = None,
        inactivity: Inactivity | None = None,
        queue: MessageSender | None = None,
    ) -> FanoutProcessor:
        return cls(
            Repositories.on(storage),
            writer,
            follower_page_size=follower_page_size,
            timing=timing,
            timeline_cap=timeline_cap,
            hybrid=hybrid,
            inactivity=inactivity,
            queue=queue,
        )

    @classmethod
    def configured(
        cls,
        storage: Storage,
        writer: PartitionWriter,
        settings: Settings,
        queue: MessageSender | None = None,
    ) -> FanoutProcessor:
        """The processor a worker runs, on these settings (the bench builds the same); what
        it sends goes to ``queue`` (default: the fan-out queues)."""
        queue = queue or FanoutQueues(storage)
        return cls.on(
            storage,
            writer,
            follower_page_size=settings.worker_follower_page_size,
            timing=settings.fanout_timing(),
            timeline_cap=settings.max_timeline_items,
            hybrid=settings.hybrid(queue),
            inactivity=settings.inactivity(),
            queue=queue,
        )

    async def handle(self, message: FanoutMessage) -> Outcome:
        match message:
            case PostCreated():
                return await self._posts.deliver(message)
            case PostDeleted():
                return await self._deletes.retract(message)
            case Followed() | Unfollowed() if await self._accounts.gone(message):
                return await self._accounts.end(message)
            case Followed():
                return await self._follows.backfill(message)
            case Unfollowed():
                return await self._follows.unfollowed(message)
            case Regrade():
                return await self._regrades.regrade(message)
            case Wake():
                return await self._wakes.wake(message)
            case Reposted():
                return await self._reposts.deliver(message)
            case Unreposted():
                return await self._unreposts.retract(message)
            case ListDeleted():
                return await self._lists.remove(message)
            case AccountDeleted():
                return await self._accounts.remove(message)
            case RelationChanged():
                return await self._relations.settle(message)
            case ReplyDetached():
                return await self._replies.detach(message)
