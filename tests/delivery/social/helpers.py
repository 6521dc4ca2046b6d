"""Helpers shared by the reposts and replies tests."""

from __future__ import annotations

from timeline.storage.accounts import Storage
from timeline.storage.calls import query_page
from timeline.storage.names import POSTS


async def posts_keys(storage: Storage, partition: str, prefix: str) -> list[str]:
    """The row keys in a ``posts`` partition that start with ``prefix`` (index and repost
    rows: ``~rpof-``, ``~rp-``, ``~re-``)."""
    page = await query_page(
        storage.reader(POSTS, partition),
        "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high",
        {"pk": partition, "low": prefix, "high": prefix[:-1] + "."},
        select=["RowKey"],
        limit=1000,
        continuation=None,
    )
    return [str(row["RowKey"]) for row in page.items]
