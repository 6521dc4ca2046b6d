"""A repost's write that lands but whose answer is lost: azure-core's retry policy resends
it, and the resend meets the row its first try stored (409 on an insert, 412 on an If-Match
replace). That is the repost stored, not a lost race: the API must say so and keep the
repost's index row, or the original's delete never finds the repost's entries."""

from __future__ import annotations

from typing import Any

import pytest
from azure.core.pipeline.transport import AioHttpTransport

from tests.delivery.helpers import run_every_pass
from tests.delivery.social.helpers import reposter_with_readers, shown, stored_repost
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.processor import FanoutProcessor
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.messages import PostDeleted, Reposted, Unreposted
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.repositories import Repositories


def _first_answer_lost(monkeypatch: pytest.MonkeyPatch, method: str) -> list[int]:
    """The first ``method`` request writing a ``~rp-`` row lands, but its answer reads 503
    (a front end timing out after the partition committed); the statuses are recorded."""
    send = AioHttpTransport.send
    statuses: list[int] = []

    async def answer_lost(self: AioHttpTransport, request: Any, **kwargs: Any) -> Any:
        response = await send(self, request, **kwargs)
        body = request.content if isinstance(request.content, bytes | str) else b""
        text = body.decode() if isinstance(body, bytes) else body
        if request.method == method and ("~rp-" in text or "~rp-" in request.url):
            statuses.append(response.status_code)
            if len(statuses) == 1:
                response.status_code = 503
        return response

    monkeypatch.setattr(AioHttpTransport, "send", answer_lost)
    return statuses


@pytest.mark.parametrize("method", ["POST", "PUT"])
async def test_a_repost_write_whose_answer_was_lost_is_stored_and_deleted_with_its_original(
    storage: Storage, repos: Repositories, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    author, reposter, [reader], post_id = await reposter_with_readers(repos, 1)
    if method == "PUT":  # over an undone repost's void row: an If-Match replace
        old = await stored_repost(repos, reposter, author, post_id)
        await repos.reposts.remove(reposter, post_id, old.repost_id)
        undo = Unreposted(
            reposter=reposter, author=author, post_id=post_id, repost_id=old.repost_id
        )
        async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
            await FanoutProcessor.on(storage, writer).handle(undo)  # its first pass: void row
    ticks = now_ticks()
    message = Reposted(
        reposter=reposter, author=author, post_id=post_id, repost_id=new_post_id(ticks)
    )
    await repos.reposts.note_index(author, post_id, reposter, message.repost_id)
    statuses = _first_answer_lost(monkeypatch, method)
    await repos.reposts.create(reposter, author, post_id, message.repost_id)
    monkeypatch.undo()
    assert len(statuses) == 2  # the first try and azure-core's resend
    assert await repos.reposts.indexed(author, post_id, reposter, message.repost_id)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        worker = FanoutProcessor.on(storage, writer)
        await run_every_pass(worker, message)
        assert await shown(repos, reader) == [(post_id, reposter)]
        await run_every_pass(worker, PostDeleted(author=author, post_id=post_id))
    assert await repos.reposts.live_id(reposter, post_id) is None
    assert await shown(repos, reader) == []
