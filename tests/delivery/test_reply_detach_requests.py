"""A reply request meeting an account's deletion (``timeline.delivery.replies``): a detached
reply keeps to the published schema; the tombstone is read under the write deadline, so a
reply request stalled before it is refused, not landed after the deletion; an idempotent
replay of a reply answers its post even once the account it answers is deleted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from api import schemas
from tests.delivery.helpers import unlimited_service
from tests.delivery.hybrid_helpers import new_users
from tests.delivery.test_account_deletion import rows_holding, world
from tests.delivery.test_account_deletion_races import only_tombstone
from tests.delivery.test_reply_detach import thread
from timeline.errors import NotFoundError
from timeline.service import posts as posts_service
from timeline.service.outbox import Outbox
from timeline.service.relations import refuse_if_blocked
from timeline.storage.accounts import Storage


async def test_a_detached_reply_keeps_to_the_published_schema(own: Storage) -> None:
    async with world(own) as w:
        (gone, replier, reader, *_), reply, _ = await thread(w)
        await w.service.accounts.delete(gone, gone)
        await w.drain()
        shown = (await w.service.posts.get(replier, reply, reader)).to_json()
        assert shown["reply_to"]["author"] is None
        schemas.PostOut.model_validate(shown)


async def test_a_reply_stalled_before_its_write_is_refused_once_the_account_is_deleted(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request stalls after its first checks, before its write deadline starts (the
    outbox's reservation); the account is deleted meanwhile, the whole deletion included. It
    reads the tombstone under the deadline, so it is refused: a reply accepted lands within
    the API's hidden time of the tombstone, before the deletion's second sweep."""
    async with world(own) as w:
        outbox = Outbox(w.recorder, write_deadline_s=0.2, hidden_s=1)
        s = unlimited_service(own, w.recorder, outbox=outbox)
        gone, replier = await new_users(w.repos, "gone", "replier")
        original = await s.posts.create(gone, gone, "the original")
        await w.drain()
        reached, resume = asyncio.Event(), asyncio.Event()

        async def stalled(*args: Any) -> None:
            await refuse_if_blocked(*args)
            reached.set()
            await resume.wait()

        monkeypatch.setattr(posts_service, "refuse_if_blocked", stalled)
        late = asyncio.create_task(
            s.posts.create(replier, replier, "late", reply_to=(gone, original.post_id))
        )
        await reached.wait()
        await s.accounts.delete(gone, gone)
        await w.drain()
        assert await w.repos.users.deletions() == []
        resume.set()
        with pytest.raises(NotFoundError) as refused:
            await late
        assert refused.value.code == "reply_target_not_found"
        await w.drain()
        assert await rows_holding(own, gone) == only_tombstone(gone)


async def test_a_replay_of_a_reply_answers_its_post_after_the_deletion(own: Storage) -> None:
    async with world(own) as w:
        gone, replier = await new_users(w.repos, "gone", "replier")
        s = w.service
        original = await s.posts.create(gone, gone, "the original")
        target = (gone, original.post_id)
        first = await s.posts.create(
            replier, replier, "an answer", idempotency_key="k-1", reply_to=target
        )
        await w.drain()
        await s.accounts.delete(gone, gone)
        again = await s.posts.create(
            replier, replier, "an answer", idempotency_key="k-1", reply_to=target
        )
        assert again.post_id == first.post_id
