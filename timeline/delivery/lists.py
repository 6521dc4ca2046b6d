"""A deleted list (``ListDeleted``): its memberships end, one page of members per lease, and
its timeline and member index go; all of it again ``sweep_delay_s`` later.

Why nothing stays. The list's row is gone before the message is released. An add reserves
its ``Followed`` before writing anything (index row first, then the membership), so every
membership written comes with a message that the worker runs, and a follow or unfollow
message of a list that is gone runs this deletion again, both passes: a membership whose
add stalled past both passes is ended by its own message. Otherwise the add wrote within the
API's write deadline of reading the list, and the second pass, ``sweep_delay_s`` (longer)
after the first ended, finds it. Every copy in the list's timeline was written inside the
write deadline of a read of its membership, and its writer re-checks the membership after
writing (removing its copies if it is gone): a copy that lands after a pass dropped the
timeline was checked after that pass removed the membership, and is removed by its own
writer. The list id is never reused, so no list ever reads what a deleted one left.
"""

from __future__ import annotations

from timeline.delivery.context import Context
from timeline.delivery.feed import Feed
from timeline.delivery.outcomes import DONE, Continue, Outcome
from timeline.model.keys import list_id_of, list_owner, list_reader
from timeline.model.messages import ListDeleted

MEMBERS_PER_LEASE = 100
"""Members whose membership one lease ends (about four storage calls each)."""


class ListRemoval:
    def __init__(self, context: Context, feed: Feed) -> None:
        self._ctx = context
        self._repos = context.repos
        self._feed = feed

    async def deletion_if_gone(self, reader: str) -> ListDeleted | None:
        """For a follow or unfollow message of a list that is gone, the list's deletion to
        run instead (both passes: it ends the membership the message is about, whatever
        stalled its add, and everything else the list still holds); None for a live list
        or a user's timeline (one point read for a list, none for a user)."""
        owner = list_owner(reader)
        if owner is None:
            return None
        list_id = list_id_of(reader)
        if await self._repos.lists.get(owner, list_id) is not None:
            return None
        return ListDeleted(owner=owner, list_id=list_id)

    async def remove(self, message: ListDeleted) -> Outcome:
        if await self._repos.lists.get(message.owner, message.list_id) is not None:
            return DONE  # not deleted (a forged or mistaken message): ids are never reused
        reader = list_reader(message.owner, message.list_id)
        follows = self._repos.follows
        page = await follows.index_page(reader, MEMBERS_PER_LEASE, message.cursor)
        for member in page.items:  # an ended row may be an add that died midway
            await follows.remove(reader, member)
            await follows.sync_index(reader, member)
            await self._feed.unmerge_if_unfollowed(reader, member)
        if page.continuation is not None:
            return Continue(message.model_copy(update={"cursor": page.continuation}))
        await self._repos.timelines.drop(reader)
        if not message.confirm:
            again = message.model_copy(update={"cursor": None, "confirm": True})
            return Continue(again, delay_s=self._ctx.timing.sweep_delay_s)
        await follows.drop_index(reader)
        return DONE
