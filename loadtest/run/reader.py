"""The probe's reads of one user's first page: raw (the storage queries the API makes for it)
and through the API (``GET /users/{user}/timeline``). See ``loadtest.run.probe``."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
from azure.data.tables.aio import TableClient

from timeline.model.entities import POST_SELECT
from timeline.reads.home import MIN_AUTHOR_ROWS
from timeline.storage.accounts import Storage
from timeline.storage.calls import query_page
from timeline.storage.names import POSTS, SUBJECT_FOLLOWING, TIMELINES
from timeline.tables.audience import merge_row_author
from timeline.tables.rows import FIRST_POST_KEY, META

HEAD = "PartitionKey eq @pk and RowKey lt @meta"
"""``timeline.reads.home``'s first-page query of the reader's partition (merge rows and posts)."""
AFTER = "PartitionKey eq @pk and RowKey gt @after and RowKey lt @meta"
"""``timeline.reads.home``'s query of a merged author's ``posts`` partition."""
KEYS_PER_FILTER = 14
"""``FollowsRepository.following_among``: one query per 14 subjects."""


async def query(client: TableClient, text: str, parameters: dict[str, Any], **kw: Any) -> list[Any]:
    """One storage query, every entity of its first page deserialized (as the API does)."""
    pager = client.query_entities(text, parameters=parameters, **kw).by_page()
    try:
        page = await pager.__anext__()
    except StopAsyncIteration:
        return []
    return [entity async for entity in page]


class Reader:
    def __init__(
        self,
        storage: Storage,
        session: aiohttp.ClientSession,
        base: str,
        tokens: dict[str, str],
        *,
        limit: int,
        max_merged: int,
    ) -> None:
        self.storage, self.session, self.base, self.tokens = storage, session, base, tokens
        self.limit, self.max_merged = limit, max_merged
        self.merged: dict[str, tuple[str, ...]] = {}
        """Each reader's merge list, from its warm-up head query (the API's guess)."""

    async def head(self, owner: str) -> list[Any]:
        return await query(
            self.storage.reader(TIMELINES, owner), HEAD, {"pk": owner, "meta": META},
            select=POST_SELECT, results_per_page=self.limit + self.max_merged + 1,
        )  # fmt: skip

    async def warm(self, owner: str) -> None:
        rows = await self.head(owner)
        listed = (merge_row_author(row["RowKey"]) for row in rows)
        self.merged[owner] = tuple(author for author in listed if author is not None)
        await self.api(owner)

    async def warm_full(self, owner: str) -> None:
        """A full-page reader's first reads; both must hold a whole page, or the figures
        quoted for a page of ``limit`` would be for a smaller one."""
        rows = len(await self._full(owner))
        items = len(orjson.loads(await self.get(owner))["items"])
        if rows != self.limit or items != self.limit:
            raise RuntimeError(f"{owner}: {rows} rows raw, {items} items by the API")

    async def raw(self, owner: str) -> None:
        """Within the storage timeout, as the API's ``Storage.guard`` bounds each call."""
        async with asyncio.timeout(self.storage.options.timeout_s):
            await self._raw(owner)

    async def full(self, owner: str) -> None:
        """A full page's one query, within the storage timeout."""
        async with asyncio.timeout(self.storage.options.timeout_s):
            await self._full(owner)

    async def _full(self, owner: str) -> list[Any]:
        """The newest ``limit`` rows of the reader's partition, with the API's ``$select``,
        through the API's own query call (``timeline.storage.calls.query_page``, the lean
        path)."""
        page = await query_page(
            self.storage.reader(TIMELINES, owner), HEAD, {"pk": owner, "meta": META},
            select=POST_SELECT, limit=self.limit, continuation=None,
        )  # fmt: skip
        return list(page.items)

    async def _raw(self, owner: str) -> None:
        authors = self.merged.get(owner, ())
        if not authors:
            await self.head(owner)
            return
        rows = min(self.limit, max(MIN_AUTHOR_ROWS, -(-self.limit // (len(authors) + 1))))
        posts = [self.author_posts(author, rows) for author in authors]
        wanted = sorted(authors)
        checks = [
            self.following(owner, wanted[i : i + KEYS_PER_FILTER])
            for i in range(0, len(wanted), KEYS_PER_FILTER)
        ]
        await asyncio.gather(self.head(owner), *posts, *checks)

    async def author_posts(self, author: str, rows: int) -> list[Any]:
        parameters = {"pk": author, "meta": META, "after": FIRST_POST_KEY}
        return await query(
            self.storage.reader(POSTS, author), AFTER, parameters,
            select=[*POST_SELECT, "void"], results_per_page=rows,
        )  # fmt: skip

    async def following(self, owner: str, subjects: list[str]) -> list[Any]:
        keys = " or ".join(f"RowKey eq @s{i}" for i in range(len(subjects)))
        parameters = {"pk": owner, **{f"s{i}": s for i, s in enumerate(subjects)}}
        return await query(
            self.storage.reader(SUBJECT_FOLLOWING, owner), f"PartitionKey eq @pk and ( {keys} )",
            parameters, select=["RowKey", "active"], results_per_page=1000,
        )  # fmt: skip

    async def api(self, owner: str) -> None:
        await self.get(owner)

    async def get(self, owner: str) -> bytes:
        """The page through HTTP, its body read in full (as Locust times it, unparsed)."""
        url = f"{self.base}/users/{owner}/timeline"
        headers = {"Authorization": f"Bearer {self.tokens[owner]}"}
        async with self.session.get(url, headers=headers) as response:
            body = await response.read()
            if response.status != 200:
                raise RuntimeError(f"GET {url}: {response.status}")
        return body
