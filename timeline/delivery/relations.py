"""A block's or mute's pass (``RelationChanged``): its reverse row agrees with it in the end.

A block or mute is two rows in two partitions: the relation in the actor's, and the reverse
row in the other user's side (``timeline.tables.relations``), which is how that user's reads
see a block and how its account's deletion finds the users who mute it. A request writes the
reverse row first and deletes it last, but it can die between the two, and two requests on
one pair can interleave. So each request reserves this message before its writes and
releases it after them (``timeline.service.outbox``): its pass runs once the request's
writes have landed or never will.

Why the rows agree in the end. The pass reads the relation, writes the reverse row to match,
and reads the relation again; if it changed meanwhile, it goes round again. After the last
request on the pair, the relation no longer changes (the account deletion and the expiry
sweep only delete both rows), so a pass that reads it then sets the reverse row right, and
one did: the last request's own. A write of an earlier pass that read an older relation
either landed before that pass's second read (which saw the change and went round) or was
overtaken by the storage timeout; the second pass, ``sweep_delay_s`` later, after any such
write has landed, settles the pair once more.
"""

from __future__ import annotations

from timeline.delivery.context import Context
from timeline.delivery.outcomes import DONE, Continue, Outcome
from timeline.model.messages import RelationChanged

ROUNDS = 3
"""Passes round a relation that keeps changing before the lease ends (the message comes
back and goes on)."""


class RelationRepair:
    def __init__(self, context: Context) -> None:
        self._ctx = context
        self._relations = context.repos.relations

    async def settle(self, message: RelationChanged) -> Outcome:
        for _ in range(ROUNDS):
            if await self._relations.reverse_agrees(message.kind, message.actor, message.other):
                break
        else:
            return Continue(message)
        if message.confirm:
            return DONE
        again = message.model_copy(update={"confirm": True})
        return Continue(again, delay_s=self._ctx.timing.sweep_delay_s)
