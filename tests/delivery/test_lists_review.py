"""Lists against what a sceptical review tried (issue 31), each on real storage with the
messages handled by the test: a delete racing a rename, an add stalled past the deletion's
passes, the cap past 1,000 slots' worth, an owner in its own list, and what `timeline stats`
counts as a follow."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from tests.delivery.helpers import Recorder, run_every_pass, timeline_ids, unlimited_service
from tests.delivery.hybrid_helpers import TIMING, add_post, new_users
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.processor import FanoutProcessor
from timeline.delivery.regrade import queue_regrade_if_due
from timeline.delivery.settings import Hybrid
from timeline.errors import ConflictError, InvalidInputError
from timeline.model.keys import list_reader
from timeline.model.messages import ListDeleted, PostCreated
from timeline.model.tokens import TokenSigner
from timeline.reads.home import HomeTimeline
from timeline.service.operations import TimelineService
from timeline.storage import calls
from timeline.storage.accounts import Storage
from timeline.storage.names import RELATIONS, SUBJECT_FOLLOWERS, TIMELINES
from timeline.storage.queue import FanoutQueue
from timeline.tables.lists import ListsRepository
from timeline.tables.ratelimits import RateLimits
from timeline.tables.repositories import Repositories
from timeline.tables.slots import Slots
from timeline.tools.views import is_content


async def test_a_delete_racing_a_rename_still_deletes_the_list(
    storage: Storage, repos: Repositories, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delete is conditional on the row it read: a rename from another tab in between
    must make it read again and delete, not answer 204 and leave the list there."""
    (owner,) = await new_users(repos, "owner")
    recorder = Recorder(storage, forward=False)
    service = unlimited_service(storage, recorder)
    list_id = (await service.lists.create(owner, owner, "before", False))["list_id"]
    finding = Slots.find
    other_tab = ListsRepository(storage)
    reads = 0

    async def find_then_rename(slots: Slots, owner_id: str, wanted: str) -> Any:
        nonlocal reads
        row = await finding(slots, owner_id, wanted)
        if owner_id == owner:
            reads += 1
            if reads == 2:  # the read inside ``ListsRepository.delete``
                monkeypatch.setattr(Slots, "find", finding)
                assert await other_tab.update(owner_id, wanted, "renamed meanwhile", None)
        return row

    monkeypatch.setattr(Slots, "find", find_then_rename)
    await service.lists.delete(owner, owner, list_id)  # answered 204
    assert isinstance(recorder.sent[-1], ListDeleted)
    assert await repos.lists.get(owner, list_id) is None, "deleted (204), yet the list is there"


async def test_an_add_that_read_the_list_before_its_deletion_leaves_no_live_membership(
    storage: Storage, repos: Repositories
) -> None:
    """The add reads the list row first (``Lists._reader``) but its API write deadline starts
    only at the reservation, five storage calls later, and the index row is written before
    it: nothing bounds the time from the list read to the writes. An add slowed there past
    the deletion's two passes writes its index and membership rows after ``drop_index``; its
    ``Followed`` then meets a gone list and does nothing. The membership stays for good, and
    every post of the member is copied into the dead partition."""
    owner, member = await new_users(repos, "owner", "member")
    recorder = Recorder(storage, forward=False)
    service = unlimited_service(storage, recorder)
    list_id = (await service.lists.create(owner, owner, "l", False))["list_id"]
    reader = list_reader(owner, list_id)
    deleter = unlimited_service(storage, recorder)
    follows: Any = service.lists._follows
    counting = follows.following_count

    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        processor = FanoutProcessor.on(storage, writer, timing=TIMING)

        async def count_while_deleted(follower: str) -> int:
            # the add has read the list row; it stalls here while the list is deleted and
            # both passes of the deletion run (the second one ``sweep_delay_s`` later)
            await deleter.lists.delete(owner, owner, list_id)
            deleted = recorder.sent[-1]
            assert isinstance(deleted, ListDeleted)
            await run_every_pass(processor, deleted)
            return int(await counting(follower))

        follows.following_count = count_while_deleted
        await service.lists.add_member(owner, owner, list_id, member)  # answered 204
        follows.following_count = counting
        for message in recorder.sent[-1:]:  # the add's Followed
            await run_every_pass(processor, message)
        post = await add_post(repos, member)
        await run_every_pass(processor, PostCreated(author=member, post_id=post.post_id))
    assert await repos.lists.get(owner, list_id) is None
    assert not await repos.follows.is_following(reader, member), "a deleted list's live member"
    assert await timeline_ids(repos, reader) == [], "copies keep landing in a deleted list"
    assert (await repos.follows.history(reader, member)).since == 0.0, "an orphan index row"


async def test_the_list_cap_above_1000_answers_409_not_503(
    storage: Storage, repos: Repositories
) -> None:
    """``TIMELINE_MAX_LISTS`` may be up to 4096, but ``ListsRepository.create`` reads the taken
    slots with one query of at most 1,000 rows: past 1,000 lists it takes a taken slot for a
    free one, its inserts fail, and a full owner gets a 503 (contention) instead of 409
    ``too_many_lists`` (and a nearly full one mostly 503s too)."""
    (owner,) = await new_users(repos, "owner")
    most = 1001
    rows = [
        (
            "upsert",
            {
                "PartitionKey": owner,
                "RowKey": f"l-{slot:03x}",
                "list_id": f"{slot:03x}{slot:016x}",
                "title": f"list {slot}",
                "exclusive": False,
                "since": datetime.now(UTC),
            },
        )
        for slot in range(most)
    ]
    for chunk in calls.chunked(rows):
        await calls.submit_batch(storage, RELATIONS, owner, chunk)
    service = TimelineService(
        Repositories.on(storage),
        FanoutQueue(storage),
        TokenSigner(b"test", token_ttl_s=3600),
        page_size=250,
        max_post_chars=280,
        limits=RateLimits.per_minute(storage, posts=0, writes=0, registrations=0),
        home=HomeTimeline(storage, max_merged=20),
        max_lists=most,
    )
    with pytest.raises(ConflictError) as raised:
        await service.lists.create(owner, owner, "one too many", False)
    assert raised.value.code == "too_many_lists"


async def test_an_owner_cannot_be_a_member_of_its_own_list(
    storage: Storage, repos: Repositories
) -> None:
    """An exclusive list holding its owner would hide the owner's own posts from its home
    timeline: like a follow of oneself, the add is a 400."""
    (owner,) = await new_users(repos, "owner")
    service = unlimited_service(storage, Recorder(storage, forward=False))
    list_id = (await service.lists.create(owner, owner, "me", True))["list_id"]
    with pytest.raises(InvalidInputError) as refused:
        await service.lists.add_member(owner, owner, list_id, owner)
    assert refused.value.code == "self_member"


async def test_list_memberships_count_toward_moving_a_large_author_to_read_time(
    storage: Storage, repos: Repositories
) -> None:
    """A membership is no follower, but it costs a copy per post as one does: an author in
    more lists than the hybrid threshold is due to move to read time (one account may hold
    100 lists: without this, it could multiply a target's copies a hundredfold)."""
    author, owner = await new_users(repos, "author", "owner")
    recorder = Recorder(storage, forward=False)
    service = unlimited_service(storage, recorder)
    hybrid = Hybrid(threshold=4, max_merged=2, queue=recorder)
    readers = []
    for index in range(hybrid.threshold + 2):
        list_id = (await service.lists.create(owner, owner, f"l{index}", False))["list_id"]
        await service.lists.add_member(owner, owner, list_id, author)
        readers.append(list_reader(owner, list_id))
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        processor = FanoutProcessor.on(storage, writer, timing=TIMING, hybrid=hybrid)
        post = await add_post(repos, author)
        await run_every_pass(processor, PostCreated(author=author, post_id=post.post_id))
    copies = [reader for reader in readers if await timeline_ids(repos, reader)]
    assert len(copies) == len(readers)  # one copy per list, as for followers
    assert await queue_regrade_if_due(repos, hybrid, author), (
        f"{len(copies)} copies per post, past the threshold of {hybrid.threshold}, "
        "yet no move to read time is due"
    )


def test_timeline_stats_count_no_list_membership_as_a_follow() -> None:
    """``timeline stats`` counts ``subjectFollowers`` rows as "follows" by ``is_follow_row``
    (every key not starting with ``~``): a list's membership, keyed ``{owner}~{list_id}``,
    counts as a follow (and its index row in ``subjectFollowing`` as another)."""
    membership: dict[str, object] = {"RowKey": list_reader("owner", "0" * 19)}
    assert not is_content(SUBJECT_FOLLOWERS, membership)
