"""The chaos harness: a seeded random workload against real processes while things break.

One API process and two (or more) worker processes on one or more Azurites (storage
accounts). Several clients post, delete, follow, unfollow and re-follow at random (seeded)
while the harness breaks things:

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
- every counter equals what it counts, and ``subjectFollowing`` mirrors the truth;
- every queue is empty: nothing is left over and nothing was poisoned;
- every row is on its partition's home account, and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tests.conftest import TEST_SECRET, eventually, program_env
from timeline.errors import StorageUnavailableError
from timeline.model.entities import Post
from timeline.reads.home import HomeTimeline, Position
from timeline.storage.accounts import Storage
from timeline.storage.azurite import Azurite, free_ports
from timeline.storage.counters import count_of
from timeline.storage.names import POSTS, SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING, TABLES
from timeline.storage.placement import hash64
from timeline.storage.queue import FanoutQueues
from timeline.tables.audience import COPIED, MERGED
from timeline.tables.repositories import Repositories

STORAGE_TIMEOUT_S = 2.0
WRITE_DEADLINE_S = 2.0
SWEEP_DELAY_S = 8.0
"""Past the write deadline plus one storage call by more than the longest freeze (3.5 s)."""
VISIBILITY_S = 3
USERS = 8
PLACEMENT_LEASE_S = 1.0
REBALANCE_MARGIN_S = 0.2
"""The fence is the lease plus one storage call plus this."""
CLIENTS = 4
HYBRID_THRESHOLD = 5
"""Of 7 possible followers (about half follow under this load): up at 5, down at 2 or fewer."""
MAX_MERGED = 2
"""So readers who follow several large authors get some as copies (overflow)."""
SETTLE_TIMEOUT_S = 120.0
VARIANTS = {"kill": (2, 2), "pause": (1, 1), "rebalance": (3, 2), "crashloop": (2, 2)}
"""Each variant's accounts, and how many of them the placement starts on."""
CRASHLOOP_WORKERS = 2


@dataclass
class Report:
    """What one run did, for the closing line of ``make chaos``."""

    seed: int
    variant: str
    kills: int = 0
    pauses: int = 0
    requests: Counter[str] = field(default_factory=Counter)
    refused: int = 0
    timeline_rows: int = 0
    live_posts: int = 0
    rebalanced: bool = False
    merged_authors: int = 0
    regrades: Counter[str] = field(default_factory=Counter)
    merge_rows: int = 0
    overflow_rows: int = 0
    poisoned: int = 0

    def line(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "variant": self.variant,
            "kills": self.kills,
            "pauses": self.pauses,
            "requests": dict(self.requests),
            "refused_or_unanswered": self.refused,
            "live_posts": self.live_posts,
            "timeline_rows": self.timeline_rows,
            "rebalanced": self.rebalanced,
            "merged_authors": self.merged_authors,
            "regrades": dict(self.regrades),
            "merge_rows": self.merge_rows,
            "overflow_rows": self.overflow_rows,
            "poisoned": self.poisoned,
        }


class Cluster:
    """The processes under test, their logs, and how to break them."""

    def __init__(self, workdir: Path, workers: int, accounts: int = 1, initial: int = 1) -> None:
        self.workdir = workdir
        self.azurites = [Azurite(location=None) for _ in range(accounts)]
        self.azurite = self.azurites[0]
        self.initial = initial
        """Accounts the placement starts on; the others wait for a rebalance."""
        self.port = free_ports(1)[0]
        self.api: asyncio.subprocess.Process | None = None
        self.workers: list[asyncio.subprocess.Process] = []
        self._worker_count = workers
        self._spawned = 0

    @property
    def connection_strings(self) -> str:
        return "\n".join(server.connection_string for server in self.azurites)

    def env(self, accounts: int | None = None) -> dict[str, str]:
        serving = self.azurites[: accounts or len(self.azurites)]
        return program_env(
            storage_connection_strings=" ".join(server.connection_string for server in serving),
            placement_lease_s=PLACEMENT_LEASE_S,
            rebalance_margin_s=REBALANCE_MARGIN_S,
            data_dir=self.workdir,
            auth_secret=TEST_SECRET,
            port=self.port,
            posts_per_minute=0,
            writes_per_minute=0,
            registrations_per_minute=0,
            storage_timeout_s=STORAGE_TIMEOUT_S,
            storage_retries=1,
            worker_idle_sleep_s=0.05,
            worker_visibility_timeout_s=VISIBILITY_S,
            worker_shutdown_grace_s=2,
            worker_write_deadline_s=WRITE_DEADLINE_S,
            worker_sweep_delay_s=SWEEP_DELAY_S,
            worker_arrival_window_s=3,
            worker_retry_base_s=0.1,
            worker_retry_cap_s=2,
            fanout_on_read_followers=HYBRID_THRESHOLD,
            max_merged_authors=MAX_MERGED,
        )

    async def start(self) -> None:
        for server in self.azurites:
            await asyncio.to_thread(server.start)
        init = await self._spawn("timeline.tools.cli", "init.log", "init", accounts=self.initial)
        assert await init.wait() == 0, (self.workdir / "init.log").read_text()
        self.api = await self._spawn("api", "api.log")
        self.workers = [await self._spawn_worker() for _ in range(self._worker_count)]

    def regrades(self) -> Counter[str]:
        """Authors settled as merged or copied, from the workers' logs."""
        settled: Counter[str] = Counter()
        for log in self.workdir.glob("worker-*.log"):
            for line in log.read_text(errors="replace").splitlines():
                if " is now " in line:
                    settled[line.rsplit(" ", 1)[-1]] += 1
        return settled

    async def _spawn_worker(self) -> asyncio.subprocess.Process:
        self._spawned += 1
        return await self._spawn("fanout_worker", f"worker-{self._spawned}.log")

    async def _spawn(
        self, module: str, log: str, *args: str, accounts: int | None = None
    ) -> asyncio.subprocess.Process:
        with (self.workdir / log).open("ab") as sink:
            return await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                module,
                *args,
                env=self.env(accounts),
                stdout=sink,
                stderr=sink,
            )

    async def rebalance(self, rng: random.Random, report: Report) -> None:
        """Add the accounts past ``initial``: one rebalance SIGKILLed midway, then one to
        the end (it resumes from the placement row)."""
        first = await self._spawn(
            "timeline.tools.cli", "rebalance.log", "rebalance", "--steps", "2"
        )
        await asyncio.sleep(rng.uniform(1.0, 2 * (PLACEMENT_LEASE_S + STORAGE_TIMEOUT_S)))
        if first.returncode is None:
            report.kills += 1
            first.kill()
        await first.wait()
        second = await self._spawn(
            "timeline.tools.cli", "rebalance.log", "rebalance", "--steps", "2"
        )
        code = await second.wait()
        assert code == 0, (self.workdir / "rebalance.log").read_text()
        report.rebalanced = True

    async def kill_a_worker(self, rng: random.Random) -> None:
        """SIGKILL one worker (no goodbye) and start a fresh one in its place."""
        index = rng.randrange(len(self.workers))
        victim = self.workers[index]
        with contextlib.suppress(ProcessLookupError):
            victim.kill()
        await victim.wait()
        self.workers[index] = await self._spawn_worker()

    async def pause_storage(self, seconds: float) -> None:
        """Freeze Azurite: calls hang, then time out; what was sent lands when it thaws."""
        self.azurite.signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            self.azurite.signal(signal.SIGCONT)

    async def stop(self) -> None:
        for process in [*self.workers, *([self.api] if self.api else [])]:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        for process in [*self.workers, *([self.api] if self.api else [])]:
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
        for server in self.azurites:
            await asyncio.to_thread(server.stop)

    def crashed(self) -> list[str]:
        """Processes that died on their own (not killed by the harness)."""
        alive = [("api", self.api)] + [("worker", w) for w in self.workers]
        return [name for name, process in alive if process and process.returncode is not None]


class Clients:
    """Users acting at random through the API; every request is retried like a real client
    would, with the same idempotency key, and may end unanswered (then storage decides)."""

    def __init__(self, session: aiohttp.ClientSession, rng: random.Random, report: Report):
        self._session = session
        self._rng = rng
        self._report = report
        self.tokens: dict[str, str] = {}

    async def register_all(self) -> None:
        for index in range(USERS):
            user = f"user{index}"
            response = await self._request("POST", "/users", json={"user_id": user})
            assert response is not None, "registration failed even after retries"
            self.tokens[user] = response["token"]

    async def act(self, until: float) -> None:
        """Follows outnumber unfollows in the first half and the other way round in the
        second, so authors cross the hybrid threshold up, then back down."""
        loop = asyncio.get_running_loop()
        halfway = until - (until - loop.time()) / 2
        while loop.time() < until:
            await self._one_action(growing=loop.time() < halfway)

    async def _one_action(self, *, growing: bool) -> None:
        rng, users = self._rng, sorted(self.tokens)
        user, other = rng.sample(users, 2)
        roll = rng.random()
        follow_share = 0.3 if growing else 0.1
        if roll < 0.4:
            await self._act(
                "post", "POST", f"/users/{user}/posts", user, {"text": f"t{rng.random()}"}
            )
        elif roll < 0.55:
            await self._delete_one(user)
        elif roll < 0.55 + follow_share:
            await self._act("follow", "PUT", f"/users/{user}/following/{other}", user)
        elif roll < 0.95:
            await self._act("unfollow", "DELETE", f"/users/{user}/following/{other}", user)
        else:
            await self._act("unfollow", "DELETE", f"/users/{user}/following/{other}", user)
            await self._act("follow", "PUT", f"/users/{user}/following/{other}", user)

    async def _delete_one(self, user: str) -> None:
        page = await self._request("GET", f"/users/{user}/posts?limit=20")
        if page and page["items"]:
            post = self._rng.choice(page["items"])["post_id"]
            await self._act("delete", "DELETE", f"/users/{user}/posts/{post}", user)

    async def _act(
        self, kind: str, method: str, path: str, user: str, body: dict[str, str] | None = None
    ) -> None:
        self._report.requests[kind] += 1
        headers = {
            "Authorization": f"Bearer {self.tokens[user]}",
            "Idempotency-Key": f"{kind}-{self._rng.random()}",
        }
        await self._request(method, path, json=body, headers=headers)

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON answer (or {} for 204), or None when every attempt failed or was refused."""
        for _ in range(4):
            try:
                async with self._session.request(method, path, **kwargs) as response:
                    if response.status in (200, 201, 202):
                        return await response.json()
                    if response.status == 204:
                        return {}
                    if response.status == 404:
                        return None  # a post deleted by another client meanwhile
                    assert response.status == 503, f"{method} {path}: {response.status}"
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.2)
        self._report.refused += 1
        return None


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
    await cluster.start()
    try:
        timeout = aiohttp.ClientTimeout(total=STORAGE_TIMEOUT_S * 3)
        base = f"http://127.0.0.1:{cluster.port}"
        async with aiohttp.ClientSession(base, timeout=timeout) as session:
            await eventually(lambda: _ready(session), timeout_s=30, what="the API")
            clients = Clients(session, rng, report)
            await clients.register_all()
            until = asyncio.get_running_loop().time() + duration_s
            async with asyncio.TaskGroup() as group:
                for _ in range(CLIENTS):
                    group.create_task(clients.act(until))
                group.create_task(_break_things(cluster, rng, report, variant, until))
                if variant == "rebalance":
                    group.create_task(cluster.rebalance(rng, report))
        assert not cluster.crashed(), f"processes died on their own: {cluster.crashed()}"
        async with Storage(cluster.connection_strings) as storage:
            await _settle(storage, report)
            await _check(storage, sorted(clients.tokens), report)
            await _check_placement(storage)
        report.regrades = cluster.regrades()
    finally:
        await cluster.stop()
    return report


async def _ready(session: aiohttp.ClientSession) -> bool:
    try:
        async with session.get("/readyz") as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


async def _break_things(
    cluster: Cluster, rng: random.Random, report: Report, variant: str, until: float
) -> None:
    loop = asyncio.get_running_loop()
    interval = (0.5, 1.5) if variant == "crashloop" else (0.5, 2.5)
    while loop.time() < until - 1:
        await asyncio.sleep(rng.uniform(*interval))
        if variant == "pause" and rng.random() < 0.5:
            report.pauses += 1
            await cluster.pause_storage(rng.uniform(1.0, 3.5))
        else:
            report.kills += 1
            await cluster.kill_a_worker(rng)


async def _settle(storage: Storage, report: Report) -> None:
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


async def _check(storage: Storage, users: list[str], report: Report) -> None:
    repos = Repositories.on(storage)
    live = {user: await _all_posts(repos, user) for user in users}
    follows = {
        user: {edge.user_id for edge in await _all(repos.follows.followers_page, user)}
        for user in users
    }
    report.live_posts = sum(len(posts) for posts in live.values())
    modes = {user: await repos.audience.mode(user) for user in users}
    assert {mode.state for mode in modes.values()} <= {COPIED, MERGED}, "a regrade never ended"
    report.merged_authors = sum(mode.state == MERGED for mode in modes.values())
    home = HomeTimeline(storage, max_merged=MAX_MERGED)
    for reader in users:
        authors = [reader, *(a for a in users if reader in follows[a])]
        expected = {pid: text for author in authors for pid, text in live[author].items()}
        served = await _home(home, reader)
        assert len({post.post_id for post in served}) == len(served), f"{reader}: a repeat"
        assert [post.row_key for post in served] == sorted(post.row_key for post in served)
        assert {post.post_id: post.text for post in served} == expected, f"{reader}: home"
        listed = set(await repos.audience.merged_authors(reader))
        stale = {author for author in listed if modes[author].state != MERGED}
        assert not stale, f"{reader} has merge rows of authors that are copied: {stale}"
        assert listed <= set(authors), f"{reader} merges authors it does not follow"
        assert len(listed) == await repos.audience.merge_count(reader), f"{reader}: merge count"
        report.merge_rows += len(listed)
        rows = [row for row in await _all(repos.timelines.page, reader) if row.author not in listed]
        report.timeline_rows += len(rows)
        actual = {post.post_id: post.text for post in rows}
        unmerged = {pid: text for pid, text in expected.items() if _author(live, pid) not in listed}
        missing, extra = unmerged.keys() - actual.keys(), actual.keys() - unmerged.keys()
        assert (missing, extra) == (set(), set()), f"{reader}: missing {missing}, stale {extra}"
        assert actual == unmerged, f"{reader}: a copy differs from its post"
        for author in authors[1:]:
            if modes[author].state == MERGED and author not in listed:
                overflow = await repos.audience.copy_etag(author, reader)
                assert overflow is not None, f"{reader} follows merged {author} without a row"
                report.overflow_rows += 1
    for user in users:
        following = sorted(a for a in users if user in follows[a])
        indexed = sorted(edge.user_id for edge in await _all(repos.follows.following_page, user))
        assert indexed == following, f"{user}: subjectFollowing disagrees with the truth"
        counts = [
            await count_of(storage, t, user) for t in (POSTS, SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING)
        ]
        assert counts == [len(live[user]), len(follows[user]), len(following)], f"{user}: counters"


async def _check_placement(storage: Storage) -> None:
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


async def _home(home: HomeTimeline, reader: str) -> list[Post]:
    """The whole home timeline, paged 7 at a time as a client would."""
    posts: list[Post] = []
    position: Position | None = Position()
    while position is not None:
        page, position = await home.page(reader, 7, position)
        posts.extend(page)
    return posts


def _author(live: dict[str, dict[str, str]], post_id: str) -> str:
    return next(author for author, posts in live.items() if post_id in posts)


async def _all_posts(repos: Repositories, author: str) -> dict[str, str]:
    return {post.post_id: post.text for post in await _all(repos.posts.page, author)}
