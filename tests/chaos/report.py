"""What one chaos run did."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


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
    reads: Counter[str] = field(default_factory=Counter)
    """Home timeline reads through the API, by the reader's stored state just before."""
    dormant_at_end: int = 0
    """Readers found dormant once the load stopped and the queues drained."""
    repost_rows: int = 0
    """Repost entries stored in the readers' partitions at the end (each checked)."""
    repost_entries: int = 0
    """Repost entries the end-state reads showed (each checked as allowed)."""
    replies_shown: int = 0
    optional_replies_shown: int = 0
    """Replies shown whose delivery depended on timing (allowed either way)."""
    private_on_pages: int = 0
    """Followers-only posts the end-state author pages showed (to the author or a follower)."""
    list_reads: int = 0
    """List timeline reads through the API, mid-run and at the end (each checked as a home
    read is)."""
    deleted_accounts: int = 0
    """Accounts deleted in the run (by their tombstones): each is checked to leave no row."""
    detached_replies: int = 0
    """Live replies to an account deleted since (``reply_author`` ``~``) at the end."""
    live_lists: int = 0
    exclusive_lists: int = 0
    list_members: int = 0
    """Memberships of the live lists at the end."""
    list_rows: int = 0
    """Rows stored in the live lists' partitions at the end (each checked)."""
    list_entries: int = 0
    """Entries the end-state list reads showed (each checked)."""
    deleted_with_entries: int = 0
    """Lists deleted while their timeline showed entries (read just before the deletion)."""
    exclusive_hidden: int = 0
    """Live posts of followed authors the readers' exclusive lists kept out of their homes."""

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
            "reads": dict(self.reads),
            "dormant_at_end": self.dormant_at_end,
            "repost_rows": self.repost_rows,
            "repost_entries": self.repost_entries,
            "replies_shown": self.replies_shown,
            "optional_replies_shown": self.optional_replies_shown,
            "private_on_pages": self.private_on_pages,
            "list_reads": self.list_reads,
            "live_lists": self.live_lists,
            "deleted_accounts": self.deleted_accounts,
            "detached_replies": self.detached_replies,
            "exclusive_lists": self.exclusive_lists,
            "list_members": self.list_members,
            "list_rows": self.list_rows,
            "list_entries": self.list_entries,
            "deleted_with_entries": self.deleted_with_entries,
            "exclusive_hidden": self.exclusive_hidden,
        }
