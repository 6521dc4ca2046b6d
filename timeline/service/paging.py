"""Pages as clients see them: a checked limit in, JSON items and opaque signed tokens out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from timeline.errors import InvalidInputError
from timeline.model.entities import Page, Post, PostRow, row_json
from timeline.model.tokens import TokenSigner

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PageOut:
    """A page as clients see it: JSON items, an opaque continuation and, for lists of posts,
    the signed position of the page's newest item (what ``since`` takes)."""

    items: list[dict[str, Any]]
    continuation: str | None
    newest: str | None = None


class Pager:
    """Checks a requested page size and signs (and verifies) the tokens of every listing; a
    token carries its listing's scope, so it cannot be replayed against another listing."""

    def __init__(self, signer: TokenSigner, page_size: int) -> None:
        self._signer = signer
        self._page_size = page_size

    def limit(self, limit: int | None) -> int:
        if limit is None:
            return self._page_size
        if not 1 <= limit <= self._page_size:
            raise InvalidInputError(
                f"limit must be between 1 and {self._page_size}", code="invalid_limit"
            )
        return limit

    async def listing(
        self,
        scope: str,
        fetch: Callable[[int, dict[str, str] | None], Awaitable[Page[T]]],
        to_json: Callable[[T], dict[str, Any]],
        limit: int | None,
        continuation: str | None,
    ) -> PageOut:
        """One page of a listing: the limit checked, the token read, ``fetch`` called, the
        items and the next token written."""
        page = await fetch(self.limit(limit), self.continuation(scope, continuation))
        return self.page_out(scope, page, to_json)

    def continuation(self, scope: str, continuation: str | None) -> dict[str, str] | None:
        return (
            None if continuation is None else self._signer.decode_continuation(scope, continuation)
        )

    def posts_out(self, scope: str, page: Page[Post]) -> PageOut:
        """A page of posts, with the position of its newest item."""
        out = self.page_out(scope, page, Post.to_json)
        if page.items:
            newest = self._signer.encode_position(scope, page.items[0].row_key)
            out = replace(out, newest=newest)
        return out

    def rows_out(self, scope: str, page: Page[PostRow]) -> PageOut:
        """``posts_out`` for a page of rows (``timeline.reads.home``): the same JSON."""
        out = self.page_out(scope, page, row_json)
        if page.items:
            newest = self._signer.encode_position(scope, page.items[0]["RowKey"])
            out = replace(out, newest=newest)
        return out

    def page_out(
        self, scope: str, page: Page[T], to_json: Callable[[T], dict[str, Any]]
    ) -> PageOut:
        token = page.continuation
        return PageOut(
            items=[to_json(item) for item in page.items],
            continuation=None if token is None else self._signer.encode_continuation(scope, token),
        )
