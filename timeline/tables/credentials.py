"""Revocation state, in each user's own ``users`` partition: the token epoch on the profile
row (revoking all tokens raises it), and one ``~revoked-{token id}`` row per token revoked
alone, kept until that token would have expired anyway.

A user's whole state is one query (the profile row and the revoked rows sort apart from
everything else in the partition), so checking a token costs one storage request per user
per cache period (``timeline.service.credentials``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from azure.core.exceptions import ResourceModifiedError
from azure.data.tables import TableEntity, UpdateMode

from timeline.errors import NotFoundError, contention
from timeline.model.entities import PROFILE_ROW_KEY
from timeline.model.keys import fold_user_id
from timeline.retry import ETAG_ATTEMPTS
from timeline.storage import calls
from timeline.storage.accounts import Storage
from timeline.storage.calls import query_page, submit_batch
from timeline.storage.names import USERS
from timeline.tables.rows import META, PARTITION, delete_entity, etag, get_entity, if_unchanged

TOKEN_EPOCH = "token_epoch"  # noqa: S105 (a field name)
IDENTITY_ROW_KEY = "identity"
"""The identity row (``timeline.tables.users``): a deleted account's tombstone."""
DELETED_AT = "deleted_at"
"""The profile row's field: tokens minted with a lower epoch are revoked (absent: 0)."""
REVOKED = f"{META}revoked-"
_STATE = "(RowKey eq @profile or (RowKey ge @revoked and RowKey lt @revoked_end ) )"
"""(The SDK substitutes a parameter only when a space follows it, hence ``@revoked_end )``.)"""
MAX_REVOKED_READ = 1000
"""Revoked rows one state read returns; more single revocations than this outstanding for
one user would go unread (a user mints tokens only by registering or from an operator)."""


@dataclass(frozen=True, slots=True)
class CredentialState:
    """What a user's tokens are checked against."""

    epoch: int
    revoked: frozenset[str]
    deleted: bool = False
    """The account was deleted: every token of it is refused."""


class CredentialsRepository:
    """A user's token epoch and revoked token ids, in ``users``."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    async def state(self, user_id: str) -> CredentialState:
        """The user's epoch and live revocations (epoch 0 and none for a user with no
        profile: such a token was minted by an operator, and nothing revoked it), and
        whether its account was deleted (its tombstone, the identity row of its case fold:
        in the same query when the id is its own fold, else one point read beside it)."""
        folded = fold_user_id(user_id)
        parameters = {
            "pk": user_id,
            "profile": PROFILE_ROW_KEY,
            "revoked": REVOKED,
            "revoked_end": REVOKED[:-1] + ".",
            "identity": IDENTITY_ROW_KEY,
        }
        query = f"{PARTITION} and ( RowKey eq @identity or {_STATE} )"
        if folded != user_id:
            query = f"{PARTITION} and {_STATE}"
            del parameters["identity"]
        rows, tombstone = await asyncio.gather(
            self._rows(user_id, query, parameters),
            get_entity(self._storage, USERS, folded, IDENTITY_ROW_KEY, select=[DELETED_AT])
            if folded != user_id
            else _none(),
        )
        moment = time.time()
        epoch, revoked, deleted = 0, set(), tombstone is not None and _is_deleted(tombstone)
        for row in rows:
            if row["RowKey"] == PROFILE_ROW_KEY:
                epoch = int(row.get(TOKEN_EPOCH) or 0)
            elif row["RowKey"] == IDENTITY_ROW_KEY:
                deleted = _is_deleted(row)
            elif float(row.get("expires_at") or 0) > moment:
                revoked.add(str(row["RowKey"]).removeprefix(REVOKED))
            else:
                await self._forget(user_id, row)
        return CredentialState(epoch, frozenset(revoked), deleted)

    async def _rows(
        self, user_id: str, query: str, parameters: dict[str, str]
    ) -> list[TableEntity]:
        async with self._storage.guard(kind="read"):
            page = await query_page(
                self._storage.reader(USERS, user_id),
                query,
                parameters,
                select=["RowKey", TOKEN_EPOCH, "expires_at", DELETED_AT],
                limit=MAX_REVOKED_READ,
                continuation=None,
            )
        return list(page.items)

    async def _forget(self, user_id: str, row: TableEntity) -> None:
        """Delete a revoked row whose token has expired by itself."""
        await delete_entity(self._storage, USERS, user_id, row["RowKey"], etag(row))

    async def revoke(self, user_id: str, token_id: str, expires: int) -> None:
        """Revoke one token (idempotent): its row lives until the token's own expiry."""
        row = {
            "PartitionKey": user_id,
            "RowKey": f"{REVOKED}{token_id}",
            "expires_at": float(expires),
        }
        await submit_batch(self._storage, USERS, user_id, [("upsert", row)])

    async def revoke_all(self, user_id: str) -> int:
        """Raise the user's token epoch (a conditional merge on the profile row, so two at
        once both count and no other field is touched); returns the new epoch."""
        for _ in range(ETAG_ATTEMPTS):
            profile = await get_entity(
                self._storage, USERS, user_id, PROFILE_ROW_KEY, select=[TOKEN_EPOCH]
            )
            if profile is None:
                raise NotFoundError(f"user {user_id!r} not found", code="user_not_found")
            epoch = int(profile.get(TOKEN_EPOCH) or 0) + 1
            change = {"PartitionKey": user_id, "RowKey": PROFILE_ROW_KEY, TOKEN_EPOCH: epoch}
            async with self._storage.guard(kind="write-1"):
                try:
                    await calls.update_entity(
                        self._storage.table(USERS, user_id),
                        change,
                        mode=UpdateMode.MERGE,
                        **if_unchanged(profile),
                    )
                    return epoch
                except ResourceModifiedError:
                    continue
        raise contention()


def _is_deleted(row: TableEntity) -> bool:
    return row.get(DELETED_AT) is not None


async def _none() -> None:
    return None
