"""The fan-out's settings: when authors are merged at read time, and the protocol's time bounds."""

from __future__ import annotations

from dataclasses import dataclass

from timeline.storage.queue import MessageSender
from timeline.tables.audience import COPIED, MERGED, AuthorMode


@dataclass(frozen=True, slots=True)
class Hybrid:
    """When authors are merged at read time instead of copied (``timeline.tables.audience``)."""

    threshold: int = 0
    """Followers from which an author is merged; below half of it, copied again (0: never
    merged)."""
    max_merged: int = 20
    """Merge rows a reader may hold; past them it gets copies."""
    queue: MessageSender | None = None
    """Where a crossing sends its ``Regrade``."""

    def merge_due(self, mode: AuthorMode, followers: int) -> bool:
        return mode.state == COPIED and bool(self.threshold) and followers >= self.threshold

    def copy_due(self, mode: AuthorMode, followers: int) -> bool:
        return mode.state == MERGED and (not self.threshold or 2 * followers < self.threshold)


@dataclass(frozen=True, slots=True)
class Timing:
    """The time bounds the protocol rests on (docs/guarantees.md says how they relate)."""

    write_deadline_s: float = 300.0
    """A copy is sent within this long of the reads that justified it, or never."""
    sweep_delay_s: float = 335.0
    """When the second pass of a delete or unfollow runs: past the write deadline plus the
    longest a sent write can take (the storage timeout), with margin."""
    account_sweep_s: float = 0.0
    """How often an account's deletion sweeps again (at least ``sweep_delay_s``): past every
    write the API can still land for it (a request accepted on a token another process has
    cached, up to the credentials cache period after the tombstone, lands within the API's
    hidden time)."""
    follow_cooldown_s: float | None = None
    """How recent an unfollow makes a follow pair *toggling* (its purge waits until it has
    been unfollowed this long; its backfill copies only what is missing); None: the sweep
    delay."""

    @property
    def account_every_s(self) -> float:
        return max(self.sweep_delay_s, self.account_sweep_s)

    @property
    def cooldown_s(self) -> float:
        return self.sweep_delay_s if self.follow_cooldown_s is None else self.follow_cooldown_s
