"""A block's or mute's pass (``RelationChanged``): its two rows agree in the end.

A block or mute is two rows in two partitions: the relation in the actor's, and the reverse
row in the other user's side (``timeline.tables.relations``), which is how that user's reads
see a block and how its account's deletion finds the users who mute it. A request writes the
reverse row first and deletes it last, but it can die between the two, and two requests on
one pair can interleave. So each request reserves this message before its writes and
releases it after them (``timeline.service.outbox``): its pass runs once the request's
writes have landed or never will.

The message alternates two passes. A *fix* reads both rows and the two users' tombstones and
makes the rows agree, every write sent within ``FIX_WITHIN_S`` of its reads (and ended a
storage timeout later): both rows
go when either user is deleted; the reverse row goes when the relation is missing, or has
ended (a mute past its end) and the reverse row does not carry that end; it is written (with
a mute's end) when the relation stands and the reverse row is missing or differs. An ended
mute whose rows agree is left to the expiry sweep, which takes them one by one. A *check*
(``confirm``), ``sweep_delay_s`` after a fix, makes the same reads and writes nothing: it
ends the message if there is nothing to change, and otherwise hands it to a fix at once.

Why the rows agree in the end (docs/guarantees.md, "Blocks and mutes"). After the last
request on the pair, the relation changes no more but to go (its expiry, or an account's
deletion, which take both rows). Only a fix writes, and every write of a fix ends within
``FIX_WITHIN_S`` and a storage timeout of its reads, so within ``sweep_delay_s``; a fix's
lease that dies is given again (a fix) after it. So a check reads both rows after every
write of its message's earlier passes has landed, and ends the message only when they
agree; every other message on the pair does the same. A deletion that starts after a fix
read the tombstones meets the check, which hands the pair to a fix that deletes both rows.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial

from azure.data.tables import TableEntity

from timeline.delivery.context import Context
from timeline.delivery.outcomes import DONE, Continue, Outcome
from timeline.model.messages import RelationChanged
from timeline.storage.flow.guard import deadline
from timeline.tables.relations import reverse_fields

Change = Callable[[], Awaitable[None]]
FIX_WITHIN_S = 25.0
"""How long after its reads a fix may still send a write: with a storage call's timeout,
well inside the expiry sweep's grace (``fanout_worker.sweeper``, 120 s), so a reverse row a
fix writes for a mute it read as live has landed before the sweep looks for it, ``GRACE_S``
after the mute's end."""


class RelationRepair:
    def __init__(self, context: Context) -> None:
        self._ctx = context
        self._relations = context.repos.relations
        self._users = context.repos.users

    async def settle(self, message: RelationChanged) -> Outcome:
        if message.confirm:
            if not await self._changes(message):
                return DONE
            return Continue(message.model_copy(update={"confirm": False}))
        changes = await self._changes(message)
        within = min(FIX_WITHIN_S, self._ctx.timing.write_deadline_s)
        with deadline(time.monotonic() + within):  # from the reads the writes rest on
            for change in changes:
                await change()
        check = message.model_copy(update={"confirm": True})
        return Continue(check, delay_s=self._ctx.timing.sweep_delay_s)

    async def _changes(self, message: RelationChanged) -> list[Change]:
        """What would make the pair's two rows agree, from what storage shows now."""
        kind, actor, other = message.kind, message.actor, message.other
        delete = partial(self._relations.delete_pair_row, kind, actor, other)
        gone = await asyncio.gather(self._users.deleted(actor), self._users.deleted(other))
        relation, reverse = await self._relations.pair(kind, actor, other)
        if any(gone):  # the live user's row first: the deleted one's finds the pair until then
            rows = (
                ((reverse, True), (relation, False))
                if gone[0]
                else ((relation, False), (reverse, True))
            )
            return [partial(delete, reverse=side) for row, side in rows if row is not None]
        if relation is None:
            return [] if reverse is None else [partial(delete, reverse=True)]
        wanted = reverse_fields(kind, relation)
        if reverse is not None and reverse_fields(kind, reverse) == wanted:
            return []  # an ended mute's too: the sweep takes its rows
        if _ended(relation):
            return [] if reverse is None else [partial(delete, reverse=True)]
        return [partial(self._relations.write_reverse, kind, actor, other, relation)]


def _ended(relation: TableEntity) -> bool:
    ends = relation.get("expires_at")
    return ends is not None and float(ends) <= time.time()
