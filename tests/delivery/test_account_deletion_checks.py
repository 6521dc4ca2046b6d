"""Account deletion against the interleavings a second review found (each failed before its
fix): a block, mute or unmute whose request died between its two rows leaves a reverse row
that its check (``expiries`` kind ``reverse``) ends once due; a lost unfollow cannot hold
the deletion; and a mute made again without an end keeps its reverse row."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fanout_worker.sweeper import GRACE_S, Sweeper
from tests.delivery.hybrid_helpers import new_users
from tests.delivery.test_account_deletion import rows_holding, world
from tests.delivery.test_account_deletion_races import only_tombstone
from timeline.delivery.outcomes import Continue
from timeline.model.messages import AccountDeleted, FanoutMessage, Unfollowed
from timeline.storage.accounts import Storage
from timeline.tables.relations import BLOCK, MUTED, REVERSE_CHECK_S, RelationsRepository

LATER = REVERSE_CHECK_S + GRACE_S + 60
"""When every check a change filed is due."""


class _Died(Exception):
    """A request that dies between two of its writes."""


async def test_a_mute_whose_request_died_after_its_reverse_row_leaves_nothing_of_the_muter(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """M mutes U; the request writes the reverse row (``U~muted``, M) first, then dies
    before the mute row. M's deletion finds its mutes by its own ``m-`` rows only: the
    reverse row naming M goes at its check."""
    async with world(own) as w:
        muter, other = await new_users(w.repos, "muter", "other")
        upsert = RelationsRepository._upsert

        async def dies_before_the_mute_row(self: RelationsRepository, row: dict[str, Any]) -> None:
            if str(row["RowKey"]).startswith(MUTED):
                raise _Died
            await upsert(self, row)

        monkeypatch.setattr(RelationsRepository, "_upsert", dies_before_the_mute_row)
        with pytest.raises(_Died):
            await w.service.relations.mute(muter, muter, other, None, False)
        monkeypatch.setattr(RelationsRepository, "_upsert", upsert)
        await w.service.accounts.delete(muter, muter)
        await w.drain()
        await Sweeper(own).sweep(now=time.time() + LATER)  # the reverse row's check is due
        assert await rows_holding(own, muter) == only_tombstone(muter)


async def test_an_unmute_whose_request_died_after_the_mute_row_leaves_nothing_of_the_muter(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same from an unmute: it deletes the mute row, then dies before the reverse row."""
    async with world(own) as w:
        muter, other = await new_users(w.repos, "muter", "other")
        await w.service.relations.mute(muter, muter, other, None, False)
        delete = RelationsRepository._delete

        async def dies_before_the_reverse_row(
            self: RelationsRepository, user: str, key: str
        ) -> None:
            if not key.startswith(MUTED):
                raise _Died
            await delete(self, user, key)

        monkeypatch.setattr(RelationsRepository, "_delete", dies_before_the_reverse_row)
        with pytest.raises(_Died):
            await w.service.relations.unmute(muter, muter, other)
        monkeypatch.setattr(RelationsRepository, "_delete", delete)
        await w.service.accounts.delete(muter, muter)
        await w.drain()
        await Sweeper(own).sweep(now=time.time() + LATER)  # the reverse row's check is due
        assert await rows_holding(own, muter) == only_tombstone(muter)


async def test_a_lost_unfollow_does_not_hold_the_deletion_forever(own: Storage) -> None:
    """U has a follower F; the Unfollowed its deletion sends for F is lost once (parked in
    the poison queue after repeated failures, say). The gate before the reposts phase then
    polls F's follower row for ever: the followers phase, which would send it again, only
    runs again on the confirm pass, which the gate never lets the sweep reach."""
    async with world(own) as w:
        gone, follower = await new_users(w.repos, "gone", "follower")
        await w.service.follows.follow(follower, follower, gone)
        await w.drain()
        await w.service.accounts.delete(gone, gone)
        work: list[FanoutMessage] = list(w.recorder.sent)
        w.recorder.sent.clear()
        lost, phases, polls = 0, [], 0
        while work and polls < 60:
            message = work.pop(0)
            if isinstance(message, Unfollowed) and message.subject == gone and not lost:
                lost += 1
                continue
            if isinstance(message, AccountDeleted):
                polls += 1
                phases.append((message.phase, message.confirm))
            outcome = await w.processor.handle(message)
            if isinstance(outcome, Continue):
                work.append(outcome.message)
            work.extend(w.recorder.sent)
            w.recorder.sent.clear()
        assert lost == 1
        assert polls < 60, phases[-5:]
        assert await rows_holding(own, gone) == only_tombstone(gone)


async def test_a_block_whose_request_died_after_its_blocked_by_row_leaves_nothing_of_the_blocker(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B blocks U; the request writes ``B-{B}`` in U's partition first, then dies before
    ``b-{U}`` in B's. B's deletion reads only its own partition's ``b-``/``B-`` rows, so the
    row naming B in U's partition stays after B is gone."""
    async with world(own) as w:
        blocker, other = await new_users(w.repos, "blocker", "other")
        upsert = RelationsRepository._upsert

        async def dies_before_the_block_row(self: RelationsRepository, row: dict[str, Any]) -> None:
            if str(row["RowKey"]).startswith(BLOCK):
                raise _Died
            await upsert(self, row)

        monkeypatch.setattr(RelationsRepository, "_upsert", dies_before_the_block_row)
        with pytest.raises(_Died):
            await w.service.relations.block(blocker, blocker, other)
        monkeypatch.setattr(RelationsRepository, "_upsert", upsert)
        await w.drain()
        await w.service.accounts.delete(blocker, blocker)
        await w.drain()
        await Sweeper(own).sweep(now=time.time() + LATER)  # the reverse row's check is due
        assert await rows_holding(own, blocker) == only_tombstone(blocker)


async def test_a_mute_made_again_without_an_end_still_finds_its_muter(own: Storage) -> None:
    """M mutes U until soon, then again with no end; the sweep after the first end keeps the
    mute (it has no end now) and must keep its reverse row, or U's deletion misses M's
    ``m-{U}`` row."""
    async with world(own) as w:
        muter, other = await new_users(w.repos, "muter", "other")
        relations = w.repos.relations
        await relations.mute(muter, other, time.time() + 60, True)
        await relations.mute(muter, other, None, True)
        await Sweeper(own).sweep(now=time.time() + LATER)
        assert await relations.mute_of(muter, other) is not None
        await w.service.accounts.delete(other, other)
        await w.drain()
        assert await rows_holding(own, other) == only_tombstone(other)
