"""A block's or mute's pass (``RelationChanged``): its two rows agree in the end.

A block or mute is two rows in two partitions: the relation in the actor's, and the reverse
row in the other user's side (``timeline.tables.relations``), which is how that user's reads
see a block and how its account's deletion finds the users who mute it. A request writes the
reverse row first and deletes it last, but it can die between the two, and two requests on
one pair can interleave. So each request reserves this message before its writes and
releases it after them (``timeline.service.outbox``): its pass runs once the request's
writes have landed or never will.

A pass reads both rows and makes the reverse row agree with the relation: deleted when the
relation is missing, written (with a mute's end) when it stands and the reverse row is
missing or differs. A mute whose end has passed is left to the expiry sweep, which takes
its two rows one by one. When either user is deleted, the pass deletes both rows. It ends
only on a second pass (``confirm``, ``sweep_delay_s`` after the one before) that finds
nothing to change and follows a lease that ended well (``attempt`` 0); any other pass comes
back ``sweep_delay_s`` later.

Why the rows agree in the end (docs/guarantees.md, "Blocks and mutes"). After the last
request on the pair, the relation changes no more but to go (its expiry, an account's
deletion). Each pass's write lands within the storage timeout and the 30 s Azure may still
work on it, well inside ``sweep_delay_s``, and a lease that died leaves its message hidden
for the worker's visibility timeout. So the pass that ends a message read both rows after
every write of that message's earlier passes had landed, and found them in agreement; and
every message still to end will do the same. A pass never writes a row that names a deleted
user: it reads the tombstones first, and if a deletion begins after that read, the pass
comes back after it and deletes both rows.
"""

from __future__ import annotations

import asyncio
import time

from timeline.delivery.context import Context
from timeline.delivery.outcomes import DONE, Continue, Outcome
from timeline.model.messages import RelationChanged
from timeline.tables.relations import reverse_fields


class RelationRepair:
    def __init__(self, context: Context) -> None:
        self._ctx = context
        self._relations = context.repos.relations
        self._users = context.repos.users

    async def settle(self, message: RelationChanged) -> Outcome:
        changed = await self._agree(message)
        if message.confirm and not changed and message.attempt == 0:
            return DONE
        again = message.model_copy(update={"confirm": True})
        return Continue(again, delay_s=self._ctx.timing.sweep_delay_s)

    async def _agree(self, message: RelationChanged) -> bool:
        """Make the pair's rows agree; whether anything was written."""
        kind, actor, other = message.kind, message.actor, message.other
        gone = await asyncio.gather(self._users.deleted(actor), self._users.deleted(other))
        relation, reverse = await self._relations.pair(kind, actor, other)
        if any(gone):
            for row, is_reverse in ((relation, False), (reverse, True)):
                if row is not None:
                    await self._relations.delete_pair_row(kind, actor, other, reverse=is_reverse)
            return relation is not None or reverse is not None
        if relation is None:
            if reverse is not None:
                await self._relations.delete_pair_row(kind, actor, other, reverse=True)
            return reverse is not None
        ends = relation.get("expires_at")
        if ends is not None and float(ends) <= time.time():
            return False  # an ended mute: the sweep takes its rows
        wanted = reverse_fields(kind, relation)
        if reverse is not None and reverse_fields(kind, reverse) == wanted:
            return False
        await self._relations.write_reverse(kind, actor, other, relation)
        return True
