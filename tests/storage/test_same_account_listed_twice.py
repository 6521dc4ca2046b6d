"""One storage account listed twice under two spellings is refused, so rebalance cannot delete data.

An operator "adds an account" but pastes the first account's connection string again in
another form (its secondary key, the fields in another order, or for Azurite ``localhost``
instead of ``127.0.0.1``). Were it accepted, ``timeline rebalance`` would "copy" about half
the partitions onto themselves and then delete them from the "old home" -- the same table.
So ``Storage`` refuses two account ids that differ only in case, and each account's member
row carries a random id that two configured accounts may not share.
"""

from __future__ import annotations

import pytest

from timeline.errors import ConfigurationError
from timeline.storage.accounts import Storage, StorageOptions
from timeline.storage.names import USERS
from timeline.storage.rebalance import Rebalancer
from timeline.tools.azurite import Azurite


def _same_account_other_string(connection_string: str) -> str:
    """The same account, fields in another order (what key2 or a re-typed string gives)."""
    fields = [field for field in connection_string.split(";") if field]
    return ";".join(reversed(fields))


async def _users_rows(storage: Storage) -> int:
    client = storage.account_table(0, USERS)
    async with storage.guard():
        return len([e async for e in client.list_entities(select=["PartitionKey"])])


async def _no_fence(_seconds: float) -> None:
    """One process only: nothing else routes, so the fences need not be waited."""


@pytest.mark.parametrize("variant", ["reordered", "localhost"])
async def test_the_same_account_listed_twice_is_refused(
    private_azurite: Azurite, variant: str
) -> None:
    first = private_azurite.connection_string
    if variant == "reordered":
        second = _same_account_other_string(first)
    else:
        second = first.replace("127.0.0.1", "localhost")
    assert second != first
    async with Storage(first, StorageOptions()) as storage:
        await storage.create_all()
        client = storage.account_table(0, USERS)
        async with storage.guard():
            for n in range(40):
                await client.upsert_entity({"PartitionKey": f"user-{n}", "RowKey": "p", "x": n})
        assert await _users_rows(storage) == 40

    lost: int | None = None
    refusal: ConfigurationError | None = None
    try:
        async with Storage([first, second], StorageOptions()) as grown:
            # Not refused: the "new" account is the first one under another name.
            await Rebalancer(grown, margin_s=0, steps=1, progress=False, sleep=_no_fence).run()
            lost = 40 - await _users_rows(grown)
    except ConfigurationError as error:
        refusal = error  # the fix: two strings naming one account are refused
    if refusal is None:
        pytest.fail(f"the same account was accepted twice; the rebalance deleted {lost} of 40")
    assert "twice" in refusal.message, f"refused, but not as a duplicate: {refusal.message}"
    async with Storage(first, StorageOptions()) as storage:
        assert await _users_rows(storage) == 40, "refused, but only after losing rows"
