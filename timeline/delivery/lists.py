"""A deleted list (``ListDeleted``): its memberships end, one page of members per lease, and
its timeline and member index go; all of it again ``sweep_delay_s`` later.

Why nothing stays. The list's row is gone before the message is released, and a member is
added only after reading that row, inside the API's write deadline, index row first (so a
membership is always found from the list's side, even one whose request died before its
follow row's sync); so the second pass, which starts ``sweep_delay_s`` (longer than any write
deadline) after the first ended, finds every membership written. Every copy in the list's
timeline was written inside the write deadline of a read of its membership, and its writer
re-checks the membership after writing (removing its copies if it is gone): a copy that lands
after a pass dropped the timeline was checked after that pass removed the membership, and is
removed by its own writer. The list id is never reused, so no list ever reads what a deleted
one left, and a follow or unfollow message of a list that is gone does nothing.
"""

from __future__ import annotations

from timeline.delivery.context import Context
from timeline.delivery.feed import Feed
from timeline.delivery.outcomes import DONE, Continue, Outcome
from timeline.model.keys import list_owner, list_reader
from timeline.model.messages import ListDeleted

MEMBERS_PER_LEASE = 100
"""Members whose membership one lease ends (about four storage calls each)."""


class ListRemoval:
    def __init__(self, context: Context, feed: Feed) -> None:
        self._ctx = context
        self._repos = context.repos
        self._feed = feed

    async def gone(self, reader: str) -> bool:
        """Whether ``reader`` is a list's that no longer exists (one point read; none for a
        user's own timeline)."""
        owner = list_owner(reader)
        if owner is None:
            return False
        return await self._repos.lists.get(owner, reader[len(owner) + 1 :]) is None

    async def remove(self, message: ListDeleted) -> Outcome:
        if await self._repos.lists.get(message.owner, message.list_id) is not None:
            return DONE  # not deleted (a forged or mistaken message): ids are never reused
        reader = list_reader(message.owner, message.list_id)
        follows = self._repos.follows
        after = (message.cursor or {}).get("after", "")
        active, ended = await follows.following_after(reader, after, MEMBERS_PER_LEASE)
        for member in [*active, *ended]:  # an ended row may be an add that died midway
            await follows.remove(reader, member)
            await follows.sync_index(reader, member)
            await self._feed.unmerge_if_unfollowed(reader, member)
        if len(active) + len(ended) == MEMBERS_PER_LEASE:
            last = max([*active, *ended])
            return Continue(message.model_copy(update={"cursor": {"after": last}}))
        await self._repos.timelines.drop(reader)
        if not message.confirm:
            again = message.model_copy(update={"cursor": None, "confirm": True})
            return Continue(again, delay_s=self._ctx.timing.sweep_delay_s)
        await follows.drop_index(reader)
        return DONE
