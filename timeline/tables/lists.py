"""A user's lists: ``l-{slot}`` rows in the owner's ``relations`` partition (three hex digits,
one per list up to the owner's cap: ``timeline.tables.slots``), each with ``list_id``,
``title``, ``exclusive`` and ``since``. A list's id is new even when its slot is reused, so
nothing a deleted list left behind ever belongs to another.

A list's members are follows of its *reader* (``timeline.model.keys.list_reader``): a row in
each member's ``subjectFollowers`` partition (counted apart: a list is no follower, but it
weighs toward the hybrid threshold) and its index
in ``subjectFollowing``, where the reader's partition is the member listing and its count.
So a member's posts, reposts and deletes reach the list's timeline partition by the same
fan-out, backfill and purge as a follower's home timeline.

A home read loads the owner's relations partition anyway (``RelationsRepository.hidden``), so
the lists marked ``exclusive`` come with it at no extra query.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableEntity, UpdateMode

from timeline.errors import contention
from timeline.model.entities import Page
from timeline.retry import ETAG_ATTEMPTS
from timeline.storage.accounts import Storage
from timeline.storage.calls import update_entity
from timeline.storage.names import RELATIONS
from timeline.tables.rows import if_unchanged
from timeline.tables.slots import Slots

LISTED = "l-"
_SELECT = ["RowKey", "list_id", "title", "exclusive", "since"]


@dataclass(frozen=True, slots=True)
class UserList:
    list_id: str
    title: str
    exclusive: bool
    since: datetime

    def to_json(self) -> dict[str, Any]:
        return {"list_id": self.list_id, "title": self.title, "exclusive": self.exclusive}


class ListsRepository:
    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._slots = Slots(storage, RELATIONS, LISTED, 3, "list_id", 16)

    async def create(self, owner: str, title: str, exclusive: bool, most: int) -> UserList | None:
        """A new list in a free one of the owner's ``most`` slots; None when all are taken."""
        since = datetime.now(UTC)
        fields = {"title": title, "exclusive": exclusive, "since": since}
        list_id = await self._slots.take(owner, most, fields)
        return None if list_id is None else UserList(list_id, title, exclusive, since)

    async def get(self, owner: str, list_id: str) -> UserList | None:
        row = await self._slots.find(owner, list_id)
        return None if row is None else _list(row)

    async def update(
        self, owner: str, list_id: str, title: str | None, exclusive: bool | None
    ) -> UserList | None:
        """Change the title or ``exclusive`` (either may be None: kept), on the condition
        that the row is the one read (a list deleted meanwhile stays deleted, and a new one
        in its slot is not touched); None: no such list."""
        for _ in range(ETAG_ATTEMPTS):
            row = await self._slots.find(owner, list_id)
            if row is None:
                return None
            changes: dict[str, Any] = {"PartitionKey": owner, "RowKey": row["RowKey"]}
            if title is not None:
                changes["title"] = title
            if exclusive is not None:
                changes["exclusive"] = exclusive
            try:
                async with self._storage.guard(kind="write-1"):
                    await update_entity(
                        self._storage.table(RELATIONS, owner),
                        changes,
                        UpdateMode.MERGE,
                        **if_unchanged(row),
                    )
            except (ResourceModifiedError, ResourceNotFoundError):
                continue
            return _list({**row, **changes})
        raise contention("the list")

    async def delete(self, owner: str, list_id: str) -> bool:
        """Remove the list's row; False when there is none with this id."""
        return await self._slots.remove(owner, list_id)

    async def lists_page(
        self, owner: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[UserList]:
        page = await self._slots.page(owner, _SELECT, limit, continuation)
        return Page([_list(row) for row in page.items], page.continuation)


def exclusive_list_id(row: TableEntity) -> str | None:
    """The id of the list a relations row holds, if it is an exclusive list."""
    if str(row["RowKey"]).startswith(LISTED) and row.get("exclusive"):
        return str(row["list_id"])
    return None


def _list(row: TableEntity | dict[str, Any]) -> UserList:
    return UserList(
        list_id=str(row["list_id"]),
        title=str(row["title"]),
        exclusive=bool(row.get("exclusive")),
        since=row.get("since") or datetime.now(UTC),
    )
