"""What every handler shares: the repositories, the writer and the settings; the writer's
admission, which starts the write deadline; and the reads several kinds of message make."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.settings import Hybrid, Timing
from timeline.metrics import INACTIVE_SKIPPED
from timeline.model.entities import Page
from timeline.model.keys import TICKS_PER_SECOND, post_id_ticks
from timeline.storage.queue import MessageSender
from timeline.tables.audience import MERGED
from timeline.tables.repositories import Repositories

ADMISSION_SHARE = 0.5
"""New work starts only while the writer's backlog drains within this share of the write
deadline: deep enough for big batches, shallow enough that writes meet their deadline."""


class Context:
    """The dependencies and settings of the handlers, and the reads and waits they share."""

    def __init__(
        self,
        repositories: Repositories,
        writer: PartitionWriter,
        *,
        follower_page_size: int = 1000,
        timing: Timing | None = None,
        hybrid: Hybrid | None = None,
        queue: MessageSender | None = None,
    ) -> None:
        self.repos = repositories
        self.queue = queue
        """Where a handler sends the messages it starts (an account's deletion's)."""
        self.writer = writer
        self.page_size = follower_page_size
        self.timing = timing or Timing()
        self.hybrid = hybrid or Hybrid()
        self._page_rows = 100.0
        """A moving average of rows per delivered page, for admission."""

    def expected_page_rows(self) -> int:
        """What to hold room for while a page is read: twice the recent average page (a page
        reserved at its maximum would crowd real rows out of the backlog and shrink batches)."""
        return max(1, min(self.page_size + 1, round(2 * self._page_rows)))

    def count_page_rows(self, rows: int) -> None:
        """Add a delivered page's rows to the average ``expected_page_rows`` rests on."""
        self._page_rows += (rows - self._page_rows) / 16

    @contextlib.asynccontextmanager
    async def admission(self, rows: int) -> AsyncIterator[float]:
        """Wait until the writer's backlog is short, reserve room for ``rows``, and start the
        clock: yields the deadline of writes justified by reads made from now on."""
        async with self.writer.admission(self.timing.write_deadline_s * ADMISSION_SHARE, rows):
            yield asyncio.get_running_loop().time() + self.timing.write_deadline_s

    async def readers_page(
        self,
        author: str,
        merged: bool,
        cursor: dict[str, str] | None,
        *,
        posted_at: float | None = None,
    ) -> Page[str]:
        """A page of those who may hold copies of the author's posts: every follower, or
        only the overflow readers of a merged author. ``posted_at``: for a new post made
        then, without the followers marked dormant before it (counted); a removal must
        never leave them out."""
        if merged:
            return await self.repos.audience.copy_readers_page(author, self.page_size, cursor)
        if posted_at is not None:
            page, skipped = await self.repos.follows.active_follower_ids_page(
                author, self.page_size, cursor, posted_at
            )
            INACTIVE_SKIPPED.inc(skipped)
            return page
        return await self.repos.follows.follower_ids_page(author, self.page_size, cursor)

    async def never_copied(self, author: str, post_id: str) -> bool:
        """No follower but the author's overflow readers can hold a copy of the post: the
        author has been merged since before it was made (by more than any delivery's write
        deadline and clock skew: every delivery of it read the author merged)."""
        mode = await self.repos.audience.mode(author)
        margin = round(self.timing.sweep_delay_s * TICKS_PER_SECOND)
        return mode.state == MERGED and post_id_ticks(post_id) > mode.since + margin
