"""Rows a user holds a capped number of (keyword filters, lists): each in one of the owner's
slots, row key ``{prefix}{slot}`` in hex, taken with an insert, so no race of creations ever
holds more than the cap. A row's id is its slot, then random digits: a row made in a freed
slot gets a new id, so nothing keyed by a deleted row's id ever belongs to another.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from azure.data.tables import TableEntity

from timeline.errors import contention
from timeline.model.entities import Page
from timeline.retry import ETAG_ATTEMPTS
from timeline.storage.accounts import Storage
from timeline.storage.calls import query_page
from timeline.tables.rows import create_entity, delete_entity, etag, get_entity

_RANGE = "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high"


@dataclass(frozen=True, slots=True)
class Slots:
    storage: Storage
    table: str
    prefix: str
    """Its rows' key prefix: two characters, the second ``-`` (so ``{prefix[0]}.`` ends it)."""
    digits: int
    """Hex digits of a slot (the most slots: ``16 ** digits``)."""
    id_field: str
    random_digits: int
    """Hex digits of an id after its slot."""

    async def take(
        self,
        owner: str,
        most: int,
        fields: dict[str, Any],
        before: Callable[[str], Awaitable[None]] | None = None,
    ) -> str | None:
        """Insert ``fields`` in a free one of the owner's first ``most`` slots, with a new
        id (``before`` is given the row key first: an expiry to file, say); the id, or None
        when every slot is taken."""
        for _ in range(ETAG_ATTEMPTS):
            taken = await self._taken(owner)
            free = [key for slot in range(most) if (key := self._key(slot)) not in taken]
            if not free:
                return None
            key = secrets.choice(free)
            row_id = key[len(self.prefix) :] + secrets.token_hex(self.random_digits // 2)
            if before is not None:
                await before(key)
            row = {"PartitionKey": owner, "RowKey": key, self.id_field: row_id, **fields}
            if await create_entity(self.storage, self.table, row):
                return row_id
        raise contention(f"the {self.id_field} slots")

    async def _taken(self, owner: str) -> set[str]:
        """The row keys of the owner's taken slots: a query per 1,000."""
        taken: set[str] = set()
        continuation: dict[str, str] | None = None
        while True:
            page = await self.page(owner, ["RowKey"], 1000, continuation)
            taken.update(str(row["RowKey"]) for row in page.items)
            continuation = page.continuation
            if continuation is None:
                return taken

    async def find(self, owner: str, row_id: str) -> TableEntity | None:
        """The row of the slot ``row_id`` names, if it holds that id."""
        key = self._key(int(row_id[: self.digits], 16))
        row = await get_entity(self.storage, self.table, owner, key)
        return row if row is not None and row.get(self.id_field) == row_id else None

    async def remove(self, owner: str, row_id: str) -> bool:
        """Delete the row with this id (on the condition that it is the row read, so a new
        row in a freed slot is never deleted; one changed meanwhile, say renamed, is read
        again); False when there is none."""
        for _ in range(ETAG_ATTEMPTS):
            row = await self.find(owner, row_id)
            if row is None:
                return False
            if await delete_entity(self.storage, self.table, owner, row["RowKey"], etag(row)):
                return True
        raise contention(f"the {self.id_field} slots")

    async def page(
        self, owner: str, select: list[str], limit: int, continuation: dict[str, str] | None
    ) -> Page[TableEntity]:
        """The owner's rows, by slot: one query."""
        async with self.storage.guard(kind="query"):
            return await query_page(
                self.storage.reader(self.table, owner),
                _RANGE,
                {"pk": owner, "low": self.prefix, "high": self.prefix[0] + "."},
                select=select,
                limit=min(limit, 1000),
                continuation=continuation,
            )

    def _key(self, slot: int) -> str:
        return f"{self.prefix}{slot:0{self.digits}x}"
