"""The chaos harness: a seeded random workload against real processes while things break.

One API process and two (or more) worker processes on one or more Azurites (storage
accounts). Several clients post, delete, follow, unfollow and re-follow, make and delete
lists and add and remove their members at random (seeded) while the harness breaks things:

- ``kill``: two accounts; workers are SIGKILLed (and restarted);
- ``pause``: one account, which is frozen (SIGSTOP) for a few seconds at a time, or a
  worker is killed;
- ``rebalance``: data on two accounts, a third is added and ``timeline rebalance`` runs
  under the load, is SIGKILLed once midway and run again, while workers are killed;
- ``crashloop``: two accounts, three workers with the default prefetch and concurrency; one
  of them is SIGKILLed every 0.5-1.5 s (an OOM-kill loop) and restarted, so leases of a few
  seconds keep ending with no outcome and nothing may be poisoned for it.

Then everything is left to settle and the end state is checked exactly, from the tables
themselves:

- every home timeline, paged as readers page it (merged with the large authors its owner
  follows; the threshold is low, so authors cross it both ways under the load), holds
  exactly the live posts of its owner and of the authors its owner follows (in
  ``subjectFollowers``, the truth), each once, newest first, with the post's text;
- the stored copies of every author a reader does not merge are exactly those posts; every
  author has settled as copied or merged, and a merged author's every follower has a merge
  row or an overflow row; every reader's merge-row count equals its merge rows;
- every live list's partition, paged the same way, holds exactly its members' live posts
  (the replies by the home rule with the membership for the follow), and its merges,
  overflow rows and copies are checked as a home timeline's;
- every counter equals what it counts, and ``subjectFollowing`` mirrors the truth (a list's
  partition of it: its members);
- no row anywhere names a deleted list (its memberships, timeline and member index);
- every queue is empty: nothing is left over and nothing was poisoned;
- every row is on its partition's home account, and nowhere else.

Readers read their home timelines through the API on seeded schedules (``workload``): some
all along, some stop and come back once dormant (the inactive period is 3 s), some never
read. Once the queues drain, every reader's timeline read through the API (every page)
equals the truth (``readers``), dormant ones first (the read wakes them), without the posts
and reposts made by the members of its exclusive lists; so does every live list's timeline
read by its owner (lists are read mid-run too), and every author's page read by each user
and anonymously (followers-only posts only for the author and its followers); the reads go
on, each checked, until every wake has ended; then no follow row is left marked inactive, and
the checks above run.

The fault injection is in ``cluster``, the workload in ``workload``, the end-state checks in
``invariants``; ``run`` ties them together.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import aiohttp

from tests.chaos.cluster import (
    API_KILL_CHANCE,
    CRASHLOOP_WORKERS,
    STORAGE_TIMEOUT_S,
    TIMELINE_CAP,
    VARIANTS,
    Cluster,
    break_things,
)
from tests.chaos.invariants import (
    check_deleted_accounts,
    check_deleted_lists,
    check_end_state,
    check_placement,
    check_relation_pairs,
    deleted_accounts,
    settle,
)
from tests.chaos.readers import check_author_pages, check_flags, check_reads, quiesce, reading
from tests.chaos.report import Report
from tests.chaos.truth import Truth
from tests.chaos.workload import CLIENTS, Clients
from tests.conftest import eventually
from timeline.storage.accounts import Storage

__all__ = ["Report", "run"]


async def run(
    seed: int,
    variant: str,
    duration_s: float,
    workdir: Path,
    workers: int = 2,
    report: Report | None = None,
) -> Report:
    """One seeded run; raises AssertionError with the first broken invariant (``report``,
    if given, holds what was seen up to then)."""
    rng = random.Random(seed)
    report = report or Report(seed, variant)
    accounts, initial = VARIANTS[variant]
    workers = CRASHLOOP_WORKERS if variant == "crashloop" else workers
    cluster = Cluster(workdir, workers, accounts, initial)
    if variant == "apikill":
        cluster.api_kill_chance = API_KILL_CHANCE
    await cluster.start()
    peek = Storage(cluster.connection_strings)
    await peek.open()
    try:
        timeout = aiohttp.ClientTimeout(total=STORAGE_TIMEOUT_S * 3)
        base = f"http://127.0.0.1:{cluster.port}"
        async with aiohttp.ClientSession(base, timeout=timeout) as session:
            await eventually(lambda: _ready(session), timeout_s=30, what="the API")
            clients = Clients(session, rng, report)
            await clients.register_all()
            truth = Truth(peek, sorted(clients.tokens), TIMELINE_CAP)  # for dormancy states
            until = asyncio.get_running_loop().time() + duration_s
            async with asyncio.TaskGroup() as group:
                for _ in range(CLIENTS):
                    group.create_task(clients.act(until))
                group.create_task(clients.read_loop(until, truth.state))
                group.create_task(break_things(cluster, rng, report, variant, until))
                if variant == "rebalance":
                    group.create_task(cluster.rebalance(rng, report))
            assert not cluster.crashed(), f"processes died on their own: {cluster.crashed()}"
            await eventually(lambda: _ready(session), timeout_s=30, what="the API")
            async with Storage(cluster.connection_strings) as storage:
                await settle(storage, report)
                await eventually(  # the short mutes end before the truth is taken
                    lambda: _past(clients.short_expiry), timeout_s=30, what="short mutes"
                )
                deleted = await deleted_accounts(storage, sorted(clients.tokens))
                report.deleted_accounts = len(deleted)
                users = sorted(set(clients.tokens) - set(deleted))
                asked = clients.asked_to_follow | clients.asked_to_add
                truth = Truth(storage, users, TIMELINE_CAP, asked, clients.reply_targets)
                await truth.load()
                report.detached_replies = truth.detached_replies()
                states = [await truth.state(reader) for reader in truth.homes]
                report.dormant_at_end = states.count("dormant")
                await check_reads(clients, truth)
                await check_author_pages(clients, truth)
                async with reading(clients, truth):
                    await quiesce(storage, truth)
                    await check_flags(storage, truth)
                    await check_end_state(storage, truth, report)
                    await check_deleted_lists(storage, truth)
                    await check_deleted_accounts(storage, deleted)
                    await check_relation_pairs(storage)
                await check_placement(storage)
        report.regrades = cluster.regrades()
        report.repost_entries = truth.seen.repost_entries
        report.replies_shown = truth.seen.replies
        report.optional_replies_shown = truth.seen.optional_replies
        report.private_on_pages = truth.seen.private_on_pages
        report.list_entries = truth.seen.list_entries
        report.exclusive_hidden = truth.exclusive_hidden
    finally:
        await peek.close()
        await cluster.stop()
    return report


async def _past(moment: float) -> bool:
    return time.time() > moment


async def _ready(session: aiohttp.ClientSession) -> bool:
    try:
        async with session.get("/readyz") as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False
