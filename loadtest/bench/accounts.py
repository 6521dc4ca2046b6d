"""How evenly the placement rule spreads users, and real rows, over several accounts."""

from __future__ import annotations

import statistics
from typing import Any

from loadtest.bench.harness import fresh_storage
from loadtest.bench.sizes import Sizes
from loadtest.seed import Graph, seed
from timeline.storage.accounts import Storage
from timeline.storage.names import TABLES
from timeline.storage.placement import Placement, hash64

ACCOUNTS = 3


def max_over_mean(counts: list[int]) -> float:
    return max(counts) / statistics.mean(counts)


def placed_users(users: int, accounts: int) -> list[int]:
    """Users ``user00000``… (the seeded ids) per account, by the real placement rule."""
    placement = Placement.initial(tuple(f"account{a}" for a in range(accounts)), accounts)
    counts = [0] * accounts
    for user in range(users):
        counts[placement.home(hash64(f"user{user:05d}"))] += 1
    return counts


async def rows_per_account(storage: Storage) -> list[int]:
    """Every row of every partitioned table, counted on each account (key-only scans)."""
    counts = []
    for account in range(len(storage.placement.accounts)):
        rows = 0
        for name in TABLES:
            client = storage.account_table(account, name)
            async for _ in client.list_entities(select=["PartitionKey"]):
                rows += 1
        counts.append(rows)
    return counts


async def accounts(sizes: Sizes) -> dict[str, Any]:
    """The placement of ``balance_users`` user ids over 3 accounts (pure arithmetic), then a
    Zipf graph seeded like ``make loadtest`` (followers, index, posts, fanned-out copies)
    onto 3 Azurites and its rows counted on each."""
    placed = placed_users(sizes.balance_users, ACCOUNTS)
    graph = Graph.zipf(sizes.balance_graph_users, seed=42, top=300)
    async with fresh_storage(ACCOUNTS) as (_, storage):
        await seed(storage, graph, authors=sizes.balance_graph_users // 20, posts_per_author=3)
        rows = await rows_per_account(storage)
    return {
        "accounts_balance_users": placed,
        "accounts_balance_max_over_mean": max_over_mean(placed),
        "accounts_rows": rows,
        "accounts_rows_max_over_mean": max_over_mean(rows),
    }
