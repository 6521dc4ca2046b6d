"""The names of the tables and queues, in one place."""

from __future__ import annotations

USERS = "users"
POSTS = "posts"
TIMELINES = "timelines"
SUBJECT_FOLLOWERS = "subjectFollowers"
SUBJECT_FOLLOWING = "subjectFollowing"
RATE_LIMITS = "rateLimits"
RELATIONS = "relations"
"""Blocks and mutes, in the partition of the user whose list they are
(``timeline.tables.relations``)."""
EXPIRIES = "expiries"
"""The time index of auxiliary rows to remove once they can no longer matter
(``timeline.tables.expiries``)."""
TABLES = (
    USERS,
    POSTS,
    TIMELINES,
    SUBJECT_FOLLOWERS,
    SUBJECT_FOLLOWING,
    RATE_LIMITS,
    EXPIRIES,
    RELATIONS,
)
"""Tables whose partitions are spread over the accounts by ``timeline.storage.placement``."""
META_TABLE = "timelineMeta"
"""Service-wide rows (the auth secret) on the placement home, beside ``placement``; on every
account, the row naming the placement home it belongs to."""


def work_queue_name(shard: int) -> str:
    return f"fanout-{shard}"


def poison_queue_name(shard: int) -> str:
    return f"fanout-{shard}-poison"


def background_queue_name(shard: int) -> str:
    """The shard's queue of background work (``fanout-<k>`` holds the user-facing work)."""
    return f"fanout-{shard}-low"
