"""The operator's views of the admin command: ``timeline stats`` and ``timeline poison``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from timeline.model.entities import PROFILE_ROW_KEY
from timeline.model.keys import list_owner
from timeline.storage.accounts import Storage
from timeline.storage.calls import query_page
from timeline.storage.names import (
    POSTS,
    SUBJECT_FOLLOWERS,
    SUBJECT_FOLLOWING,
    TABLES,
    TIMELINES,
    USERS,
)
from timeline.storage.queue import FanoutQueues, Lane, PoisonedMessage
from timeline.tables.follows import is_follow_row
from timeline.tables.users import UsersRepository

_POST_ROW = re.compile(r"\d{19}_[0-9a-f]{26}\Z")
_PEEK = 32
"""A queue shows at most this many of its visible messages without leasing them."""
NOUNS = {
    USERS: "users",
    POSTS: "posts",
    TIMELINES: "timeline entries",
    SUBJECT_FOLLOWERS: "follows",
    SUBJECT_FOLLOWING: "follows",
}
"""What a table's rows are to its readers; tables not named here hold internal rows only."""
LEGEND = (
    "internal rows: counters, idempotency keys, undone reposts, activity stamps, "
    "ended follows and their ~unfollowed- rows, the reverse rows of mutes, "
    "rate-limit windows and the expiries index"
)


def is_content(table: str, row: dict[str, object]) -> bool:
    """True for a row people see (a profile, a post, a timeline entry, a live follow)."""
    key = str(row["RowKey"])
    if table == USERS:
        return key == PROFILE_ROW_KEY
    if table in (POSTS, TIMELINES):
        return bool(_POST_ROW.match(key))
    if table == SUBJECT_FOLLOWERS:
        return is_follow_row(key)
    if table == SUBJECT_FOLLOWING:  # the index keeps an ended follow, not active
        return bool(row.get("active")) and list_owner(str(row["PartitionKey"])) is None
    return False


@dataclass
class Count:
    content: int = 0
    internal: int = 0
    by_account: list[int] = field(default_factory=list)


async def count_table(storage: Storage, table: str) -> Count:
    """Every row of ``table`` on every account, people's and internal apart (a full scan,
    fine for an admin command)."""
    count = Count()
    for account in range(len(storage.account_ids)):
        client = storage.account_table(account, table)
        rows, continuation = 0, None
        while True:
            async with storage.guard():
                page = await query_page(
                    client, "", {}, select=["PartitionKey", "RowKey", "active"], limit=1000,
                    continuation=continuation,
                )  # fmt: skip
            for row in page.items:
                if is_content(table, row):
                    count.content += 1
                else:
                    count.internal += 1
            rows += len(page.items)
            continuation = page.continuation
            if continuation is None:
                break
        count.by_account.append(rows)
    return count


async def lane_line(lane: Lane, account: int) -> str:
    """A work queue's messages, those workers can take now apart from the rest."""
    total = await lane.depth()
    ready = len(await lane.peek(_PEEK))
    shown = f"{ready}+" if ready == _PEEK else str(ready)
    later = max(0, total - ready)
    return (
        f"queue {lane.name} (account {account}): {total} message(s): {shown} ready now, "
        f"{'about ' if ready == _PEEK else ''}{later} delayed or leased"
    )


async def stats_lines(storage: Storage) -> list[str]:
    placement = storage.placement
    lines = [
        f"placement: version {placement.version}, {len(placement.accounts)} account(s)",
        "queues (approximate): 'ready now' is work a worker can take at once; 'delayed or "
        "leased' is second passes and retries waiting for their time, and messages a worker "
        "is working on",
    ]
    for shard in FanoutQueues(storage).shards:
        account = placement.queue_accounts[shard.shard]
        for lane in shard.lanes:
            lines.append(await lane_line(lane, account))
        poison = await shard.poison_depth()
        lines.append(f"queue fanout-{shard.shard}-poison (account {account}): {poison}")
    lines.append(f"tables ({LEGEND}):")
    for table in TABLES:
        count = await count_table(storage, table)
        noun = NOUNS.get(table)
        people = f"{count.content} {noun}, " if noun else ""
        split = " + ".join(map(str, count.by_account))
        lines.append(
            f"table {table}: {people}{count.internal} internal row(s) ({split} rows by account)"
        )
    deleting = await UsersRepository(storage).deletions()
    shown = ", ".join(deleting[:10]) + (", ..." if len(deleting) > 10 else "")
    lines.append(f"account deletions in progress: {len(deleting)}" + (f" ({shown})" * bool(shown)))
    return lines


POISON_HEADER = "ID\tWORK-ID\tDELIVERIES\tREASON\tMESSAGE"
"""ID: the poison message's own id (what drop and requeue take); WORK-ID: its id as work."""
_REASON_CHARS = 120
_CONTENT_CHARS = 160


def one_line(text: str, limit: int) -> str:
    """``text`` with its whitespace runs (newlines, tabs) as single spaces, cut at ``limit``."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def poison_lines(messages: list[PoisonedMessage]) -> list[str]:
    if not messages:
        return ["no poison messages"]
    return [POISON_HEADER] + [
        f"{message.poison_id}\t{message.message_id}\t{message.dequeue_count}\t"
        f"{one_line(message.reason, _REASON_CHARS)}\t{one_line(message.content, _CONTENT_CHARS)}"
        for message in messages
    ]
