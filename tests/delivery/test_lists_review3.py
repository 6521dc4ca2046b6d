"""Lists against a third sceptical review (after 9a8e8ae), each on real storage with the
messages handled by the test: the admin command's scan for authors past the threshold, and
what a gone list's follow message leaves of the list's member index."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tests.delivery.helpers import Recorder, run_every_pass, unlimited_service
from tests.delivery.hybrid_helpers import TIMING, new_users
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.outcomes import Continue
from timeline.delivery.processor import FanoutProcessor
from timeline.delivery.regrade import queue_due_regrades, queue_regrade_if_due
from timeline.delivery.settings import Hybrid
from timeline.model.keys import list_reader
from timeline.model.messages import Followed, ListDeleted
from timeline.storage.accounts import Storage
from timeline.storage.names import SUBJECT_FOLLOWING, TIMELINES
from timeline.tables.repositories import Repositories
from timeline.tables.rows import partition_page


async def test_the_admin_scan_finds_an_author_past_the_threshold_by_list_memberships(
    storage: Storage, repos: Repositories
) -> None:
    """Since 5a6f918 the threshold weighs an author's reach (followers and list
    memberships), and ``timeline regrade`` (no users: every author) is documented as the way
    to move authors already past it, after turning hybrid fan-out on or lowering the
    threshold. Its scan (``AudienceRepository.authors_to_check``) still reads only the
    ``~count-`` rows: an author past the threshold by memberships is never a candidate."""
    author, owner = await new_users(repos, "author", "owner")
    recorder = Recorder(storage, forward=False)
    service = unlimited_service(storage, recorder)
    hybrid = Hybrid(threshold=4, max_merged=2, queue=recorder)
    for index in range(hybrid.threshold):
        list_id = (await service.lists.create(owner, owner, f"l{index}", False))["list_id"]
        await service.lists.add_member(owner, owner, list_id, author)
    assert await repos.follows.reach(author) == hybrid.threshold
    assert await queue_regrade_if_due(repos, hybrid, author)  # due, asked by name
    found = await queue_due_regrades(repos, hybrid, None)
    assert author in found, "the admin scan misses an author past the threshold by its lists"


async def test_a_gone_lists_follow_message_leaves_no_counter_row_in_its_index(
    storage: Storage, repos: Repositories
) -> None:
    """An add that read the list before its deletion writes its (inactive) index row before
    the deletion's second pass, which drops the index; then the membership and the last
    sync, which finds the membership and writes the index row active, counted: a new
    ``~count-NN`` row in the dropped partition. The add's ``Followed`` meets the gone list
    and ends the pair (``end_in_gone``): it deletes the index row, not the count it moved,
    so a gone list keeps a counter row for good."""
    owner, member = await new_users(repos, "owner", "member")
    recorder = Recorder(storage, forward=False)
    service = unlimited_service(storage, recorder)
    list_id = (await service.lists.create(owner, owner, "l", False))["list_id"]
    reader = list_reader(owner, list_id)
    deleter = unlimited_service(storage, recorder)
    follows: Any = service.lists._follows
    counting, adding = follows.following_count, follows.add
    second: list[ListDeleted] = []

    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        processor = FanoutProcessor.on(storage, writer, timing=TIMING)

        async def count_while_deleted(follower: str) -> int:
            await deleter.lists.delete(owner, owner, list_id)
            deleted = recorder.sent[-1]
            assert isinstance(deleted, ListDeleted)
            first = await processor.handle(deleted)
            assert isinstance(first, Continue)
            assert isinstance(first.message, ListDeleted)
            second.append(first.message)
            return int(await counting(follower))

        async def add_after_the_second_pass(follower: str, subject: str, since: datetime) -> bool:
            await run_every_pass(processor, second[0])
            return bool(await adding(follower, subject, since))

        follows.following_count = count_while_deleted
        follows.add = add_after_the_second_pass
        await service.lists.add_member(owner, owner, list_id, member)  # answered 204
        followed = next(m for m in recorder.sent if isinstance(m, Followed))
        await run_every_pass(processor, followed)
    assert not await repos.follows.is_following(reader, member)
    left = await partition_page(
        storage, SUBJECT_FOLLOWING, reader, select=["RowKey"], limit=10, continuation=None,
        until="~~",
    )  # fmt: skip
    assert [row["RowKey"] for row in left.items] == [], "rows left in a gone list's index"


async def test_a_gone_lists_follow_message_inside_the_deletions_pass_leaves_nothing(
    storage: Storage, repos: Repositories
) -> None:
    """A backlog ``Followed`` of a deleted list is worked while the deletion's first pass is
    between a member's ``remove`` and its index sync (``end_in_gone`` drops the index row the
    sync read): every membership ends, its member's reach is back to 0, and both passes
    leave nothing in the list's index (not reproduced: this one passes)."""
    owner, *members = await new_users(repos, "owner", "m", "m")
    recorder = Recorder(storage, forward=False)
    service = unlimited_service(storage, recorder)
    list_id = (await service.lists.create(owner, owner, "l", False))["list_id"]
    reader = list_reader(owner, list_id)
    for member in members:
        await service.lists.add_member(owner, owner, list_id, member)
    backlog = [m for m in recorder.sent if isinstance(m, Followed)]
    await service.lists.delete(owner, owner, list_id)
    deleted = recorder.sent[-1]
    assert isinstance(deleted, ListDeleted)

    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        processor = FanoutProcessor.on(storage, writer, timing=TIMING)
        follows: Any = processor._lists._repos.follows
        syncing = follows.sync_index

        async def sync_after_the_backlog(follower: str, subject: str) -> None:
            if backlog:
                await run_every_pass(processor, backlog.pop(0))
            await syncing(follower, subject)

        follows.sync_index = sync_after_the_backlog
        await run_every_pass(processor, deleted)
    for member in members:
        assert not await repos.follows.is_following(reader, member)
        assert await repos.follows.reach(member) == 0
    left = await partition_page(
        storage, SUBJECT_FOLLOWING, reader, select=["RowKey"], limit=10, continuation=None,
        until="~~",
    )  # fmt: skip
    assert [row["RowKey"] for row in left.items] == []
