"""The invariant checks: once the load stops and the queues drain, the end state is
checked exactly, from the tables themselves: every home timeline's and live list's
partition, the merges, counters and indexes, that every block and mute has both its rows,
and that a deleted list or account left no row."""

from __future__ import annotations

import re
import time
from typing import Any

from fanout_worker.sweeper import GRACE_S
from tests.chaos.cluster import MAX_MERGED
from tests.chaos.report import Report
from tests.chaos.truth import LIST_READER, Expect, Hidden, Truth
from tests.conftest import eventually
from tests.delivery.hybrid_helpers import merge_count
from timeline.errors import StorageUnavailableError
from timeline.model.entities import Post, PostRow, row_json, shown_post_id
from timeline.reads.home import HomeTimeline, Position
from timeline.storage.accounts import Storage
from timeline.storage.names import (
    EXPIRIES,
    POSTS,
    RATE_LIMITS,
    RELATIONS,
    SUBJECT_FOLLOWERS,
    SUBJECT_FOLLOWING,
    TABLES,
    TIMELINES,
    USERS,
)
from timeline.storage.placement import hash64
from timeline.storage.queue import FanoutQueues
from timeline.tables.audience import COPIED, COPY_PREFIX, MERGED, AuthorMode
from timeline.tables.counters import count_of
from timeline.tables.credentials import IDENTITY_ROW_KEY
from timeline.tables.relations import BLOCK, BLOCKED_BY, META_SUFFIX, MUTED
from timeline.tables.repositories import Repositories

SETTLE_TIMEOUT_S = 120.0


async def settle(storage: Storage, report: Report) -> None:
    """Wait until the work queues are empty: every message, second passes included, done."""
    queue = FanoutQueues(storage)

    async def idle() -> bool:
        try:
            return (await queue.depth())[0] == 0
        except StorageUnavailableError:  # a busy machine: the next poll may answer
            return False

    await eventually(idle, timeout_s=SETTLE_TIMEOUT_S, what="the work queue to drain")
    report.poisoned = poisoned = (await queue.depth())[1]
    assert poisoned == 0, f"{poisoned} poisoned: {[m.reason for m in await queue.peek_poison()]}"


async def check_end_state(storage: Storage, truth: Truth, report: Report) -> None:
    """The tables against the truth (``truth.load`` first): home and list pages read straight
    from storage (no blocks, mutes or filters applied), the stored copies, modes, counters,
    indexes."""
    repos = Repositories.on(storage)
    users = sorted(truth.live)
    live = {user: {pid: p.text for pid, p in posts.items()} for user, posts in truth.live.items()}
    follows = {user: set(truth.followers[user]) for user in users}
    report.live_posts = sum(len(posts) for posts in live.values())
    modes = {user: await repos.audience.mode(user) for user in users}
    assert {mode.state for mode in modes.values()} <= {COPIED, MERGED}, "a regrade never ended"
    report.merged_authors = sum(mode.state == MERGED for mode in modes.values())
    home = HomeTimeline(storage, max_merged=MAX_MERGED)
    for reader in users:
        report.timeline_rows += await _check_timeline(storage, home, truth, reader, modes, report)
    for reader in sorted(truth.list_views):
        report.list_rows += await _check_timeline(storage, home, truth, reader, modes, report)
    for user in users:
        following = sorted(truth.following(user))
        indexed = sorted(edge.user_id for edge in await _all(repos.follows.following_page, user))
        assert indexed == following, f"{user}: subjectFollowing disagrees with the truth"
        counts = [
            await count_of(storage, t, user) for t in (POSTS, SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING)
        ]
        assert counts == [len(live[user]), len(follows[user]), len(following)], f"{user}: counters"
    for reader in sorted(truth.list_views):
        members = truth.following(reader)
        report.list_members += len(members)
        indexed = sorted(edge.user_id for edge in await _all(repos.follows.following_page, reader))
        assert indexed == members, f"{reader}: the member index disagrees with the truth"
        count = await count_of(storage, SUBJECT_FOLLOWING, reader)
        assert count == len(members), f"{reader}: member count {count} != {len(members)}"
    report.live_lists = len(truth.list_views)
    report.exclusive_lists = sum(sum(made.values()) for made in truth.lists.values())


async def _check_timeline(
    storage: Storage,
    home: HomeTimeline,
    truth: Truth,
    reader: str,
    modes: dict[str, AuthorMode],
    report: Report,
) -> int:
    """One reader's partition (a user's, or a live list's) against the truth: its pages, its
    merges, its copies; the rows copied (those of the authors it does not merge)."""
    repos = Repositories.on(storage)
    live = {user: {pid: p.text for pid, p in posts.items()} for user, posts in truth.live.items()}
    followed = [author for author in truth.sources(reader) if author != reader]
    stored = truth.expect(reader, Hidden(), stored=True)  # what a page shows before the filters
    pages = await _home(home, reader)
    keys = [row["RowKey"] for page in pages for row in page]
    assert keys == sorted(keys), f"{reader}: pages out of order"
    try:
        truth.check(reader, [[row_json(row) for row in page] for page in pages], stored)
    except AssertionError as error:
        shown = {shown_post_id(row) for page in pages for row in page}
        absent = [_author(live, pid) for pid in stored.must.keys() - shown]
        raise AssertionError(f"{error}; {await _diagnose(storage, reader, absent)}") from None
    listed = set(await repos.audience.merged_authors(reader))
    stale = {author for author in listed if modes[author].state != MERGED}
    assert not stale, f"{reader} has merge rows of authors that are copied: {stale}"
    assert listed <= {reader, *followed}, f"{reader} merges authors it does not follow"
    assert len(listed) == await merge_count(storage, reader), f"{reader}: merge count"
    report.merge_rows += len(listed)
    rows = [row for row in await _all(repos.timelines.page, reader) if row.author not in listed]
    _check_copies(reader, rows, stored, listed, live)
    report.repost_rows += sum(1 for row in rows if row.original)
    for author in followed:
        if modes[author].state == MERGED and author not in listed:
            overflow = await repos.audience.copy_etag(author, reader)
            assert overflow is not None, f"{reader} follows merged {author} without a row"
            report.overflow_rows += 1
    return len(rows)


async def deleted_accounts(storage: Storage, users: list[str]) -> list[str]:
    """The users whose account storage says is deleted (its tombstone)."""
    repos = Repositories.on(storage)
    return [user for user in users if await repos.users.deleted(user)]


async def check_deleted_accounts(storage: Storage, deleted: list[str]) -> None:
    """No row anywhere names a deleted account but its tombstone, beside the rows that end
    by themselves (``expiries``, ``rateLimits``; docs/guarantees.md, "Account deletion")."""
    for user in deleted:
        named = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(user)}(?![A-Za-z0-9_])")
        strays: list[tuple[str, str, str]] = []
        for account in range(len(storage.account_ids)):
            for table in TABLES:
                if table in (EXPIRIES, RATE_LIMITS):
                    continue
                client = storage.account_table(account, table)
                async with storage.guard():
                    rows = [row async for row in client.list_entities()]
                for row in rows:
                    keys = (str(row["PartitionKey"]), str(row["RowKey"]))
                    if (table, *keys) == (USERS, user, IDENTITY_ROW_KEY):
                        continue
                    texts = [*keys, *(v for v in row.values() if isinstance(v, str))]
                    if any(named.search(text) for text in texts):
                        strays.append((table, *keys))
        assert not strays, f"rows of deleted account {user} remain: {strays[:20]}"


async def check_relation_pairs(storage: Storage) -> None:
    """Every block has its "blocked by" row, every mute its reverse row with the same end,
    and no such row stands without its relation. Only the sweep may have parted an ended
    mute's rows: a relation whose end has passed may lack its reverse row (never hold one
    that differs), and a reverse row may outlive its relation once its end is ``GRACE_S``
    past (the sweep takes the two one by one, and goes on while this lists the tables)."""
    now = time.time()
    relations: dict[tuple[str, str, str], float | None] = {}
    reverses: dict[tuple[str, str, str], float | None] = {}
    for account in range(len(storage.account_ids)):
        client = storage.account_table(account, RELATIONS)
        async with storage.guard():
            async for row in client.list_entities():
                pk, rk = str(row["PartitionKey"]), str(row["RowKey"])
                ends = row.get("expires_at")
                ends = None if ends is None else float(ends)
                if pk.endswith(META_SUFFIX):
                    reverses[("mute", rk, pk.removesuffix(META_SUFFIX))] = ends
                elif rk.startswith(BLOCKED_BY):
                    reverses[("block", rk[2:], pk)] = None
                elif rk.startswith((BLOCK, MUTED)):
                    kind = "block" if rk.startswith(BLOCK) else "mute"
                    relations[(kind, pk, rk[2:])] = ends
    listed = time.time()  # a sweep during the listing may take a pair whole
    wrong = [
        (*pair, "relation", ends, reverses.get(pair, "missing"))
        for pair, ends in relations.items()
        if reverses.get(pair, "missing") != ends
        and (ends is None or ends > now or pair in reverses)
    ]
    wrong += [
        (*pair, "reverse row", ends, "missing")
        for pair, ends in reverses.items()
        if pair not in relations and (ends is None or ends + GRACE_S > listed)
    ]
    assert not wrong, f"block or mute rows without their pair: {sorted(wrong, key=str)[:20]}"


async def check_deleted_lists(storage: Storage, truth: Truth) -> None:
    """No row anywhere names a list that is gone (once the deletions' second passes ran):
    no membership or overflow row in a member's ``subjectFollowers`` partition, no
    ``timelines`` or ``subjectFollowing`` partition of its reader, nor any other row."""
    live = set(truth.list_views)
    strays: list[tuple[str, str, str]] = []
    for account in range(len(storage.account_ids)):
        for table in TABLES:
            client = storage.account_table(account, table)
            async with storage.guard():
                rows = [
                    (str(row["PartitionKey"]), str(row["RowKey"]))
                    async for row in client.list_entities(select=["PartitionKey", "RowKey"])
                ]
            for partition, row_key in rows:
                for key in (partition, row_key.removeprefix(COPY_PREFIX)):
                    found = LIST_READER.search(key)
                    if found is not None and found[0] not in live:
                        strays.append((table, partition, row_key))
    assert not strays, f"rows of deleted lists remain: {strays[:20]}"


def _check_copies(
    reader: str,
    rows: list[Post],
    stored: Expect,
    listed: set[str],
    live: dict[str, dict[str, str]],
) -> None:
    """The reader's stored copies of the authors it does not merge: every post it must see,
    only posts it may see (each once, with its text), and only live reposts' entries at the
    live repost's key."""
    plain = [row for row in rows if not row.original]
    actual = {post.post_id: post.text for post in plain}
    assert len(actual) == len(plain), f"{reader}: a post copied twice"
    must = {p: t for p, t in stored.must.items() if _author(live, p) not in listed}
    missing = must.keys() - actual.keys()
    extra = actual.keys() - must.keys() - stored.may.keys()
    assert (missing, extra) == (set(), set()), f"{reader}: missing {missing}, stale {extra}"
    assert all(actual[p] == live[_author(live, p)][p] for p in actual), f"{reader}: a copy differs"
    for row in rows:
        if row.original:
            pair = (row.original, row.reposted_by or "")
            assert stored.repost_keys.get(pair) == row.row_key, f"{reader}: stale repost {pair}"
            assert stored.reposts[pair] == row.text, f"{reader}: repost {pair}'s text differs"


async def check_placement(storage: Storage) -> None:
    """The placement is settled on every account, and every row is on its home only."""
    placement = await storage.confirmed_placement()
    assert placement.settled, "a rebalance was left unfinished"
    assert placement.accounts == storage.account_ids, "not every account is in use"
    for account in range(len(storage.account_ids)):
        for table in TABLES:
            client = storage.account_table(account, table)
            async with storage.guard():
                keys = {entity["PartitionKey"] async for entity in client.list_entities()}
            strays = [key for key in keys if placement.home(hash64(key)) != account]
            assert not strays, f"{table} rows of {strays} on account {account}, not their home"


async def _all(fetch: Any, key: str) -> list[Any]:
    items: list[Any] = []
    continuation = None
    while True:
        page = await fetch(key, 1000, continuation)
        items.extend(page.items)
        continuation = page.continuation
        if continuation is None:
            return items


async def _home(home: HomeTimeline, reader: str) -> list[list[PostRow]]:
    """The whole home timeline, paged 7 at a time as a client would."""
    pages: list[list[PostRow]] = []
    position: Position | None = Position()
    while position is not None:
        page, position = await home.rows(reader, 7, position)
        pages.append(page)
    return pages


def _author(live: dict[str, dict[str, str]], post_id: str) -> str:
    return next(author for author, posts in live.items() if post_id in posts)


async def _diagnose(storage: Storage, reader: str, authors: list[str]) -> str:
    """What storage shows about a reader whose home timeline is wrong: its head rows, and
    its rows in the missing posts' authors' follower lists."""
    heads = [
        dict(entity)
        async for entity in storage.table(TIMELINES, reader).query_entities(
            "PartitionKey eq @pk and RowKey lt @first", parameters={"pk": reader, "first": "0"}
        )
    ]
    rows = []
    for author in authors:
        client = storage.table(SUBJECT_FOLLOWERS, author)
        entity = await client.get_entity(author, reader)
        rows.append(dict(entity))
    return f"heads={heads} follow_rows={rows}"
