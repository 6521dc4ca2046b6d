"""Seed a realistic social graph straight into storage, fast and deterministic.

Follower counts follow a Zipf law (a few accounts with thousands of followers, most with a
handful); the top authors already have posts, fanned out into their followers' timelines,
except for the accounts with at least ``TIMELINE_FANOUT_ON_READ_FOLLOWERS`` followers: those
are seeded as a finished ``Regrade`` leaves them (merged, with a merge row in each follower's
timeline), so home timeline reads of their followers merge their posts.
Everything is an idempotent upsert, so seeding again with the same seed changes nothing.
Bearer tokens are minted with the stack's secret (no storage read), one per user.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tqdm import tqdm

from loadtest.bench.harness import write_rows
from timeline.config import Settings
from timeline.model.entities import Post, User
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.tokens import TokenSigner
from timeline.storage.accounts import Storage
from timeline.storage.names import POSTS, SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING, TIMELINES, USERS
from timeline.tables.audience import MERGE_COUNT_ROW, MERGE_PREFIX, MERGED, MODE_ROW
from timeline.tables.counters import shard_key
from timeline.tables.secret import auth_secret


@dataclass(frozen=True)
class Graph:
    users: list[str]
    followers: dict[str, list[str]]

    @classmethod
    def zipf(cls, count: int, *, seed: int, top: int = 3000, exponent: float = 1.1) -> Graph:
        """User of rank r gets about ``top / r**exponent`` followers, chosen at random."""
        rng = random.Random(seed)
        users = [f"user{i:05d}" for i in range(count)]
        followers = {}
        for rank, user in enumerate(users, start=1):
            wanted = min(count - 1, max(1, round(top / rank**exponent)))
            others = rng.sample(users, wanted + 1)
            followers[user] = sorted(set(others) - {user})[:wanted]
        return cls(users, followers)

    def following(self) -> dict[str, list[str]]:
        result: dict[str, list[str]] = {user: [] for user in self.users}
        for subject, fans in self.followers.items():
            for fan in fans:
                result[fan].append(subject)
        return result


async def seed(
    storage: Storage,
    graph: Graph,
    *,
    authors: int,
    posts_per_author: int,
    large: AbstractSet[str] = frozenset(),
) -> None:
    now = datetime.now(UTC)
    following = graph.following()
    with_posts = set(graph.users[:authors])
    users = [User(u, u, now).to_entity() for u in graph.users]
    await write_rows(storage, USERS, users, "seed: users", in_flight=32)
    await write_rows(
        storage,
        SUBJECT_FOLLOWERS,
        [
            {"PartitionKey": s, "RowKey": f, "since": now}
            for s, fs in graph.followers.items()
            for f in fs
        ]
        + [_count_row(s, len(fs)) for s, fs in graph.followers.items()],
        "seed: followers",
    )
    await write_rows(
        storage,
        SUBJECT_FOLLOWING,
        [
            {"PartitionKey": f, "RowKey": s, "since": now, "active": True}
            for f, ss in following.items()
            for s in ss
        ]
        + [_count_row(f, len(ss)) for f, ss in following.items()],
        "seed: following",
        in_flight=32,
    )
    await write_rows(
        storage, POSTS, [_count_row(a, posts_per_author) for a in with_posts], "seed: counts"
    )
    base = now_ticks() - 10**10  # a few minutes ago: older than anything the test posts
    posts = [
        Post(new_post_id(base + (a * posts_per_author + i) * 10), author, f"seeded post {i}")
        for a, author in enumerate(graph.users[:authors])
        for i in range(posts_per_author)
    ]
    await write_rows(storage, POSTS, [p.to_entity(p.author) for p in posts], "seed: posts")
    copies: list[dict[str, Any]] = [
        post.to_entity(owner)
        for post in posts
        for owner in [post.author, *([] if post.author in large else graph.followers[post.author])]
    ]
    await write_rows(storage, TIMELINES, copies, "seed: timelines", in_flight=32)
    await _seed_merged(storage, graph, large, base)


async def _seed_merged(storage: Storage, graph: Graph, large: AbstractSet[str], since: int) -> None:
    """Large authors' mode rows, and each follower's merge rows and their count."""
    modes = [
        {"PartitionKey": a, "RowKey": MODE_ROW, "state": MERGED, "token": "", "since": str(since)}
        for a in large
    ]
    await write_rows(storage, SUBJECT_FOLLOWERS, modes, "seed: large authors")
    merged: dict[str, list[str]] = {}
    for author in sorted(large):
        for fan in graph.followers[author]:
            merged.setdefault(fan, []).append(author)
    rows = [
        {"PartitionKey": fan, "RowKey": MERGE_PREFIX + author}
        for fan, authors in merged.items()
        for author in authors
    ] + [{"PartitionKey": fan, "RowKey": MERGE_COUNT_ROW, "n": len(a)} for fan, a in merged.items()]
    await write_rows(storage, TIMELINES, rows, "seed: merge rows", in_flight=32)


def large_authors(graph: Graph, threshold: int, max_merged: int) -> set[str]:
    """The accounts at or above the threshold (none when it is 0), at most ``max_merged``, so
    every reader merges them all."""
    if not threshold:
        return set()
    ranked = sorted(graph.users, key=lambda user: -len(graph.followers[user]))
    return {user for user in ranked[:max_merged] if len(graph.followers[user]) >= threshold}


def with_full_readers(
    graph: Graph,
    count: int,
    *,
    authors: int,
    posts_per_author: int,
    large: AbstractSet[str],
    rows: int,
) -> tuple[Graph, list[str]]:
    """``count`` more users (``full000``...) who follow enough of the top plain (copied, not
    merged) authors to hold ``rows`` posts in their timelines: their first page is a full one,
    the page the API's read cost is quoted for."""
    plain = [user for user in graph.users[:authors] if user not in large]
    needed = -(-rows // posts_per_author) if count else 0
    if needed > len(plain):
        raise SystemExit(f"seed: {len(plain)} plain authors with posts, {needed} needed")
    readers = [f"full{i:03d}" for i in range(count)]
    followed = set(plain[:needed])
    followers = {
        user: fans + readers if user in followed else fans for user, fans in graph.followers.items()
    }
    return Graph(graph.users + readers, followers | {r: [] for r in readers}), readers


def _count_row(partition: str, count: int) -> dict[str, Any]:
    """The partition's count, on one counter shard, as the service keeps it beside the rows
    it counts."""
    return {"PartitionKey": partition, "RowKey": shard_key(0), "n": count}


def mint_tokens(settings: Settings, secret: bytes, users: list[str]) -> dict[str, str]:
    signer = TokenSigner(secret, token_ttl_s=settings.token_ttl_s)
    return {
        user: signer.mint_bearer(user) for user in tqdm(users, desc="seed: tokens", leave=False)
    }


async def main_async(args: argparse.Namespace) -> None:
    settings = Settings()
    graph = Graph.zipf(args.users, seed=args.seed)
    large = large_authors(graph, settings.fanout_on_read_followers, settings.max_merged_authors)
    graph, full_readers = with_full_readers(
        graph, args.full_readers, authors=args.authors, posts_per_author=args.posts,
        large=large, rows=args.full_rows,
    )  # fmt: skip
    # a 30 s timeout, as the bench's own client, and more retries: on a machine busy with
    # other people's tests an EGT of 100 rows can take over 5 s, and Azurite closes idle
    # keep-alive connections after 5 s ("Cannot write to closing transport" three times)
    options = replace(settings.storage_options(), timeout_s=30, retries=6)
    async with Storage(settings.connection_string(), options) as storage:
        await storage.create_all()
        await seed(storage, graph, authors=args.authors, posts_per_author=args.posts, large=large)
        secret = await auth_secret(storage, settings.auth_secret)
    args.tokens.parent.mkdir(parents=True, exist_ok=True)
    args.tokens.write_text(json.dumps(mint_tokens(settings, secret, graph.users)))
    merged_readers = sorted({fan for author in large for fan in graph.followers[author]})
    hybrid = {
        "large_authors": sorted(large),
        "merged_readers": merged_readers,
        "full_readers": full_readers,
    }
    args.tokens.with_name("hybrid.json").write_text(json.dumps(hybrid))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=5000)
    parser.add_argument("--authors", type=int, default=200, help="top users with seeded posts")
    parser.add_argument("--posts", type=int, default=3, help="seeded posts per author")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--full-readers", type=int, default=10,
        help="extra users whose home timelines hold more than a page (the probe's full pages)",
    )  # fmt: skip
    parser.add_argument(
        "--full-rows", type=int, default=260, help="posts at least in each one's timeline"
    )
    parser.add_argument("--tokens", type=Path, default=Path("loadtest/results/tokens.json"))
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
