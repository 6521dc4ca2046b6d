"""A block or mute is two rows in two partitions (the relation, and its reverse row the other
user's side finds it by). A request can die between them, and two requests on one pair can
interleave; the worker's pass of each request's ``RelationChanged`` makes the reverse row
agree with the relation, so an account's deletion finds every row that names it. The races
of the pass itself are in ``test_relation_pairs_races``."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.delivery.hybrid_helpers import new_users
from tests.delivery.test_account_deletion import World, rows_holding, world
from timeline.delivery.outcomes import DONE
from timeline.model.messages import RelationChanged
from timeline.storage.accounts import Storage
from timeline.storage.names import RELATIONS
from timeline.tables.credentials import IDENTITY_ROW_KEY
from timeline.tables.relations import (
    BLOCK,
    BLOCKED_BY,
    MUTED,
    RelationKind,
    RelationsRepository,
    muted_by,
    pair_keys,
)
from timeline.tables.rows import get_entity


class Died(Exception):
    """The process died here."""


def dies_writing(monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    """The request dies just before it would write a row whose key starts with ``prefix``."""
    upsert = RelationsRepository._upsert

    async def dying(self: RelationsRepository, row: dict[str, Any]) -> None:
        if str(row["RowKey"]).startswith(prefix):
            raise Died
        await upsert(self, row)

    monkeypatch.setattr(RelationsRepository, "_upsert", dying)


def dies_deleting(monkeypatch: pytest.MonkeyPatch, partition_suffix: str, key: str) -> None:
    """The request dies just before it would delete a row of that partition and key prefix."""
    delete = RelationsRepository._delete

    async def dying(self: RelationsRepository, user: str, row_key: str) -> None:
        if user.endswith(partition_suffix) and row_key.startswith(key):
            raise Died
        await delete(self, user, row_key)

    monkeypatch.setattr(RelationsRepository, "_delete", dying)


async def deleted_leaving_its_tombstone(w: World, user: str) -> bool:
    """Delete the user's account and run it to the end: whether only its tombstone names it."""
    await w.service.accounts.delete(user, user)
    await w.drain()
    return await rows_holding(w.storage, user) == [("users", user, IDENTITY_ROW_KEY)]


async def without_reverse_row(
    w: World, kind: RelationKind, actor: str, other: str
) -> tuple[str, str]:
    """A block or mute whose reverse row two interleaved requests took (a mute's reverse
    row, an unmute's two deletes, then the mute's own row); the reverse row's keys."""
    if kind == "mute":
        await w.repos.relations.mute(actor, other, None, False)
    else:
        await w.repos.relations.block(actor, other)
    await w.repos.relations.delete_pair_row(kind, actor, other, reverse=True)
    return pair_keys(kind, actor, other)[1]


async def row(storage: Storage, pk: str, rk: str) -> bool:
    return await get_entity(storage, RELATIONS, pk, rk, select=["RowKey"]) is not None


async def test_a_mute_that_died_between_its_rows_leaves_nothing_of_its_muter(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reverse row landed, the mute did not: the pass removes the reverse row, and the
    muter's deletion leaves only its tombstone (before: the reverse row stayed, named it)."""
    async with world(own) as w:
        muter, other = await new_users(w.repos, "muter", "other")
        with monkeypatch.context() as patch:
            dies_writing(patch, MUTED)
            with pytest.raises(Died):
                await w.service.relations.mute(muter, muter, other, None, False)
        assert await row(own, muted_by(other), muter)
        await w.drain()
        assert not await row(own, muted_by(other), muter)
        assert await deleted_leaving_its_tombstone(w, muter)


async def test_a_block_that_died_between_its_rows_leaves_nothing_of_its_blocker(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The "blocked by" row landed, the block did not: the pass removes it (it hid the
    blocker from the other's reads with no block standing)."""
    async with world(own) as w:
        blocker, other = await new_users(w.repos, "blocker", "other")
        with monkeypatch.context() as patch:
            dies_writing(patch, BLOCK)
            with pytest.raises(Died):
                await w.service.relations.block(blocker, blocker, other)
        assert await row(own, other, BLOCKED_BY + blocker)
        await w.drain()
        assert not await row(own, other, BLOCKED_BY + blocker)
        assert await deleted_leaving_its_tombstone(w, blocker)


async def test_an_unmute_that_died_between_its_rows_leaves_no_reverse_row(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with world(own) as w:
        muter, other = await new_users(w.repos, "muter", "other")
        await w.service.relations.mute(muter, muter, other, None, True)
        await w.drain()
        with monkeypatch.context() as patch:
            dies_deleting(patch, "~muted", muter)
            with pytest.raises(Died):
                await w.service.relations.unmute(muter, muter, other)
        assert not await row(own, muter, MUTED + other)
        await w.drain()
        assert not await row(own, muted_by(other), muter)


async def test_an_unblock_that_died_between_its_rows_leaves_no_blocked_by_row(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with world(own) as w:
        blocker, other = await new_users(w.repos, "blocker", "other")
        await w.service.relations.block(blocker, blocker, other)
        await w.drain()
        with monkeypatch.context() as patch:
            dies_deleting(patch, other, BLOCKED_BY)
            with pytest.raises(Died):
                await w.service.relations.unblock(blocker, blocker, other)
        await w.drain()
        assert not await row(own, other, BLOCKED_BY + blocker)


@pytest.mark.parametrize("kind", ["block", "mute"])
async def test_a_relation_whose_reverse_row_an_interleaving_removed_gets_it_back(
    own: Storage, kind: RelationKind
) -> None:
    """A mute's reverse row, then an unmute's two deletes, then the mute's own row: two
    requests interleaved leave the relation without its reverse row; the pass writes it."""
    async with world(own) as w:
        actor, other = await new_users(w.repos, "actor", "other")
        reverse = await without_reverse_row(w, kind, actor, other)
        w.recorder.sent.append(RelationChanged(kind=kind, actor=actor, other=other))
        await w.drain()
        assert await row(own, *reverse)


@pytest.mark.parametrize("kind", ["block", "mute"])
async def test_every_block_and_mute_request_sends_its_pass(own: Storage, kind: str) -> None:
    async with world(own) as w:
        actor, other = await new_users(w.repos, "actor", "other")
        s = w.service.relations
        if kind == "mute":
            await s.mute(actor, actor, other, None, False)
            await s.unmute(actor, actor, other)
        else:
            await s.block(actor, actor, other)
            await s.unblock(actor, actor, other)
        passes = [m for m in w.recorder.sent if isinstance(m, RelationChanged)]
        assert passes == [RelationChanged(kind=kind, actor=actor, other=other)] * 2


async def test_a_mutes_end_round_trips_exactly(own: Storage) -> None:
    """The pass compares ends as floats after a round trip through Azurite; odd fractions,
    whole numbers and far ends all compare equal, so a check after agreement ends."""
    async with world(own) as w:
        muter, *others = await new_users(w.repos, "muter", "a", "b", "c", "d")
        now = time.time()
        ends = [now + 1234.5678901234567, float(int(now) + 7200), now + 99 * 365 * 86_400, None]
        for other, end in zip(others, ends, strict=True):
            until = None if end is None else datetime.fromtimestamp(end, UTC)
            await w.service.relations.mute(muter, muter, other, until, True)
        w.recorder.sent.clear()
        for other in others:
            before = await get_entity(own, RELATIONS, muted_by(other), muter)
            assert before is not None
            message = RelationChanged(kind="mute", actor=muter, other=other, confirm=True)
            assert await w.processor.handle(message) == DONE
            after = await get_entity(own, RELATIONS, muted_by(other), muter)
            assert after is not None
            assert after.metadata["etag"] == before.metadata["etag"]
