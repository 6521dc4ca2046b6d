"""A deleted list (``ListDeleted``): its memberships end, one page of members per lease, and
its timeline and member index go; all of it again ``sweep_delay_s`` later.

Why nothing stays. The list's row is gone before the message is released. An add reserves
its ``Followed`` and makes every write (index row first, then the membership, then the
index's sync) before releasing it, inside the API's write deadline; so when its message
runs, all of the add's rows have landed or never will. If the add wrote before the
deletion's second pass read the index, that pass ends it (it starts ``sweep_delay_s``,
longer than any write deadline, after the first ended). If not (the add stalled past both
passes), its own message finds the list gone and ends that pair, dropping its index row and
the timeline (``timeline.delivery.accounts``, ``AccountRemoval.end``). Every copy in the
list's timeline was written inside the write deadline of a read of its membership, and its
writer re-checks the membership after writing (removing its copies if it is gone): a copy
that lands after a pass dropped the timeline was checked after that pass removed the
membership, and is removed by its own writer. The list id is never reused, so no list ever
reads what a deleted one left.
"""

from __future__ import annotations

import asyncio

from timeline.delivery.context import Context
from timeline.delivery.feed import Feed
from timeline.delivery.outcomes import DONE, Continue, Outcome
from timeline.delivery.regrade import queue_regrade_if_due
from timeline.model.keys import list_reader
from timeline.model.messages import ListDeleted

MEMBERS_PER_LEASE = 100
"""Members whose membership one lease ends (about four storage calls each)."""


class ListRemoval:
    def __init__(self, context: Context, feed: Feed) -> None:
        self._ctx = context
        self._repos = context.repos
        self._feed = feed

    async def remove(self, message: ListDeleted) -> Outcome:
        if await self._exists(message.owner, message.list_id):
            return DONE  # not deleted (a forged or mistaken message): ids are never reused
        reader = list_reader(message.owner, message.list_id)
        follows = self._repos.follows
        page = await follows.index_page(reader, MEMBERS_PER_LEASE, message.cursor)
        for member in page.items:  # an ended row may be an add that died midway
            await follows.remove(reader, member)
            await follows.sync_index(reader, member)
            await follows.drop_left(reader, member)  # the index goes whole, in the last pass
            await self._feed.unmerge_if_unfollowed(reader, member)
            await queue_regrade_if_due(self._repos, self._ctx.hybrid, member)
        if page.continuation is not None:
            return Continue(message.model_copy(update={"cursor": page.continuation}))
        await self._repos.timelines.drop(reader)
        if not message.confirm:
            again = message.model_copy(update={"cursor": None, "confirm": True})
            return Continue(again, delay_s=self._ctx.timing.sweep_delay_s)
        await follows.drop_index(reader)
        return DONE

    async def _exists(self, owner: str, list_id: str) -> bool:
        """Whether the list is there and its owner too (an account's deletion sends this
        message for each of its lists and leaves their rows to its last step)."""
        found, deleted = await asyncio.gather(
            self._repos.lists.get(owner, list_id), self._repos.users.deleted(owner)
        )
        return found is not None and not deleted
