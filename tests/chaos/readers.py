"""The readers' end-state checks: every home timeline, every live list's timeline (read by
its owner) and every author's page read through the API (every page) equals the truth for
dormant, waking and active readers alike; once every wake is done the readers' markers are
gone and no follow row is left marked inactive."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from tests.chaos.truth import Truth
from tests.chaos.workload import Clients
from tests.conftest import eventually
from timeline.errors import StorageUnavailableError
from timeline.storage.accounts import Storage
from timeline.storage.names import SUBJECT_FOLLOWERS
from timeline.storage.queue import FanoutQueues
from timeline.tables.follows import INACTIVE
from timeline.tables.rows import get_entity

QUIESCE_TIMEOUT_S = 120.0


READ_TRIES = 3


async def check_reads(clients: Clients, truth: Truth) -> None:
    """Every reader's home timeline, and every live list's timeline read by its owner,
    through the API, is the truth (the first of these reads of a dormant reader wakes it; a
    list's read wakes no one)."""
    for reader, expected in truth.homes.items():
        served = None
        for _ in range(READ_TRIES):  # a page refused while storage is slow (503) is read again
            served = await clients.read(reader, truth.state)
            if served is not None:
                break
        assert served is not None, f"{reader}: the API read failed {READ_TRIES} times"
        truth.check(f"{reader} ({clients.schedules[reader]})", served, expected)
    for reader, expected in truth.list_views.items():
        owner, _, list_id = reader.removeprefix("|").partition("~")
        served = None
        for _ in range(READ_TRIES):
            served = await clients.read_list(owner, list_id)
            if served is not None:
                break
        assert served is not None, f"list {reader}: the API read failed {READ_TRIES} times"
        exclusive = " exclusive" if truth.lists[owner][list_id] else ""
        truth.check(f"list {reader}{exclusive}", served, expected)
        truth.seen.list_entries += sum(len(page) for page in served)


async def check_author_pages(clients: Clients, truth: Truth) -> None:
    """Every author's page, read by each user and anonymously, holds exactly the author's
    live posts the reader may see: the followers-only ones only for the author and the
    author's followers (its ``subjectFollowers`` rows, the truth), newest first."""
    for author, posts in truth.live.items():
        newest_first = sorted(posts.values(), key=lambda post: post.row_key)
        followers = truth.followers[author]
        for reader in [None, *truth.homes]:
            sees_all = reader is not None and (reader == author or reader in followers)
            expected = [p.post_id for p in newest_first if sees_all or not p.followers_only]
            served = None
            for _ in range(READ_TRIES):
                served = await clients.author_page(author, reader)
                if served is not None:
                    break
            assert served is not None, f"{author}'s page as {reader}: the API read failed"
            assert served == expected, f"{author}'s page as {reader}: {served} != {expected}"
            truth.seen.private_on_pages += sum(
                1 for p in newest_first if p.followers_only and p.post_id in served
            )


@contextlib.asynccontextmanager
async def reading(clients: Clients, truth: Truth) -> AsyncIterator[None]:
    """Read (and check) every reader's timeline over and over meanwhile, so none goes
    dormant again while the wakes finish and the partitions are checked."""
    failures: list[BaseException] = []

    async def loop() -> None:
        while True:
            try:
                await check_reads(clients, truth)
            except AssertionError as error:
                failures.append(error)
                return
            await asyncio.sleep(0.2)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if failures:  # the cause of whatever else failed meanwhile (readers left dormant)
            raise failures[0]


async def quiesce(storage: Storage, truth: Truth) -> None:
    """Wait until every wake has ended: the queues empty and no reader has a marker."""
    queue = FanoutQueues(storage)

    async def quiet() -> bool:
        try:
            if (await queue.depth())[0]:
                return False
            return all([await truth.state(reader) is None for reader in truth.homes])
        except StorageUnavailableError:
            return False

    await eventually(quiet, timeout_s=QUIESCE_TIMEOUT_S, what="every wake to end")


async def check_flags(storage: Storage, truth: Truth) -> None:
    """No follow row is left marked inactive for a reader whose marker is gone (the marks
    are read first: a marker written after them could only precede new marks)."""
    for reader in truth.homes:
        marked = []
        for author in truth.homes:
            row = await get_entity(storage, SUBJECT_FOLLOWERS, author, reader)
            if row is not None and row.get(INACTIVE):
                marked.append(author)
        if marked:
            state = await truth.state(reader)
            assert state is not None, f"{reader}: follows of {marked} still marked inactive"
