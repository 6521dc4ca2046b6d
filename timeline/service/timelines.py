"""Reading timelines: a user's home timeline (paged or live) and an author's own posts, with
the continuations and positions that page them and the ``since`` that bounds them."""

from __future__ import annotations

import re
from dataclasses import replace

from timeline.errors import InvalidInputError
from timeline.model.entities import FOLLOWERS, Page
from timeline.model.keys import USER_ID_PATTERN, validate_user_id
from timeline.model.tokens import POSITION_KEY, TokenSigner
from timeline.reads.hidden import Thinning, visible_rows
from timeline.reads.home import HomeTimeline, Position
from timeline.reads.live import TimelineWatch
from timeline.reads.private import may_see
from timeline.service.accounts import require_self, require_user
from timeline.service.paging import PageOut, Pager
from timeline.tables.follows import FollowsRepository
from timeline.tables.posts import PostsRepository
from timeline.tables.relations import RelationsRepository
from timeline.tables.rows import FIRST_POST_KEY, META
from timeline.tables.users import UsersRepository

_USER_ID = re.compile(USER_ID_PATTERN.replace("$", r"\Z"))
MAX_STREAM_ENTRIES = 1000
"""The most entries one poll of a stream sends when timelines are not capped."""
SERVED = "n"
"""In a home timeline's continuation: entries served so far (pages stop at the cap)."""
AFTER = "a"
"""In a home timeline's continuation: the last row key served (or the merge bound)."""
LISTED = "m"
"""In a home timeline's continuation: the authors the first page merged, comma-separated."""
DORMANT = "d"
"""In a home timeline's continuation: the pages are a dormant reader's (``Position.dormant``)."""
UNTIL = "u"
"""In a newer-than read's continuation: the row key its pages stop at (its ``since``)."""


class Timelines:
    """Home timelines (at most ``timeline_cap`` entries deep when capped) and author posts."""

    def __init__(
        self,
        users: UsersRepository,
        posts: PostsRepository,
        home: HomeTimeline,
        signer: TokenSigner,
        pager: Pager,
        *,
        timeline_cap: int = 0,
        relations: RelationsRepository | None = None,
        follows: FollowsRepository | None = None,
    ) -> None:
        self._relations = relations or RelationsRepository(home.storage)
        self._follows = follows or FollowsRepository(home.storage)
        self._thinning = Thinning()
        self._users = users
        self._posts = posts
        self._home = home
        self._lists = home.for_lists()
        self._signer = signer
        self._pager = pager
        self._cap = timeline_cap

    async def home(
        self,
        actor: str,
        owner: str,
        limit: int | None,
        continuation: str | None,
        since: str | None = None,
    ) -> PageOut:
        """The owner's timeline merged with the large authors it follows (``timeline.reads.home``),
        without what its blocks, mutes and filters hide (``timeline.reads.hidden``); the
        continuation counts what was read, so no page reads past the cap. With ``since``, only
        what is newer than that position, paged down to it."""
        require_self(actor, owner)
        return await self._page(owner, None, limit, continuation, since)

    async def list_timeline(
        self,
        owner: str,
        reader: str,
        limit: int | None,
        continuation: str | None,
        since: str | None = None,
    ) -> PageOut:
        """A page of one of the owner's lists (its ``reader``, checked by the caller): as a
        home page, filtered by the owner's relations, with no exclusive lists left out."""
        return await self._page(owner, reader, limit, continuation, since)

    async def _page(
        self,
        owner: str,
        reader: str | None,
        limit: int | None,
        continuation: str | None,
        since: str | None,
    ) -> PageOut:
        scope = f"timeline:{reader or owner}"
        position, served = _home_position(self._pager.continuation(scope, continuation))
        position = self._newer_than(scope, position, since)
        wanted = self._pager.limit(limit)
        if self._cap:
            wanted = min(wanted, self._cap - served)
            if wanted <= 0:
                return PageOut(items=[], continuation=None)
        home = self._home if reader is None else self._lists
        page = await visible_rows(
            home,
            self._relations,
            owner,
            wanted,
            position,
            self._thinning,
            self._follows,
            reader=reader,
        )
        rows, following = page.rows, page.following
        served += page.read  # hidden entries count too: pages never read past the cap
        if following is None or (self._cap and served >= self._cap):
            return self._pager.rows_out(scope, Page(rows, None))
        token = {
            AFTER: following.after,
            LISTED: ",".join(following.listed or ()),
            SERVED: str(served),
        }
        if following.until != META:
            token[UNTIL] = following.until
        if following.dormant:
            token[DORMANT] = "1"
        return self._pager.rows_out(scope, Page(rows, token))

    async def watch(
        self,
        actor: str,
        owner: str,
        since: str | None,
        *,
        lookback_s: float,
        since_name: str = "since",
    ) -> TimelineWatch:
        """What a live stream of the owner's timeline sends: entries newer than the position
        ``since`` names (a ``Last-Event-ID``), or, without one, those that land from now.
        The catch-up of an old position sends at most a timeline's worth (the cap)."""
        require_self(actor, owner)
        await self._home.touch(owner)
        most = self._cap or MAX_STREAM_ENTRIES
        watch = TimelineWatch(self._home, owner, lookback_s=lookback_s, max_entries=most)
        position = None
        if since is not None:
            scope = f"timeline:{owner}"
            position = self._signer.decode_position(scope, since, name=since_name)
        await watch.open(position)
        return watch

    def position_token(self, owner: str, row_key: str) -> str:
        """What a stream event's id carries: the same signed position as a page's newest."""
        return self._signer.encode_position(f"timeline:{owner}", row_key)

    async def author_posts(
        self,
        author: str,
        limit: int | None,
        continuation: str | None,
        since: str | None = None,
        *,
        reader: str | None = None,
    ) -> PageOut:
        """A user's own posts, newest first; with ``since``, only those newer than it. A
        ``reader`` (None: anonymous) who neither is nor follows the author does not get its
        followers-only posts: such a page may be short."""
        scope = f"posts:{validate_user_id(author)}"
        token = self._pager.continuation(scope, continuation)
        until = token.pop(UNTIL, None) if token else None
        until = self._since(scope, since, until) or META
        page = await self._posts.page(author, self._pager.limit(limit), token or None, until)
        private = [post for post in page.items if post.followers_only]
        if private and not await may_see(self._follows, reader, author, FOLLOWERS):
            page = Page([post for post in page.items if not post.followers_only], page.continuation)
        if not page.items and not (continuation or since):
            await require_user(self._users, author)
        if page.continuation is not None and until != META:
            page = Page(page.items, {**page.continuation, UNTIL: until})
        return self._pager.posts_out(scope, page)

    def _newer_than(self, scope: str, position: Position, since: str | None) -> Position:
        """``position`` bounded by ``since``, which must agree with a continuation's bound."""
        given = position.until if position.until != META else None
        until = self._since(scope, since, given)
        return position if until is None else replace(position, until=until)

    def _since(self, scope: str, since: str | None, carried: str | None) -> str | None:
        """The row key a newer-than read stops at: from ``since``, or carried on by the
        continuation (a client that repeats ``since`` with a continuation must repeat it
        unchanged)."""
        if since is None:
            return carried
        until = self._signer.decode_position(scope, since)
        if carried is not None and carried != until:
            raise InvalidInputError(
                "this continuation belongs to a read with another 'since'", code="invalid_since"
            )
        return until


def _home_position(token: dict[str, str] | None) -> tuple[Position, int]:
    """The position and served count of a home timeline continuation."""
    if token is None:
        return Position(), 0
    served = token.get(SERVED, "")
    after = token.get(AFTER, "")
    listed = tuple(author for author in token.get(LISTED, "").split(",") if author)
    until = token.get(UNTIL, META)
    valid = (
        (after == FIRST_POST_KEY or POSITION_KEY.match(after))
        and all(map(_USER_ID.match, listed))
        and (until == META or POSITION_KEY.match(until))
        and token.get(DORMANT, "1") == "1"
    )
    position = Position(after, listed, until=until, dormant=DORMANT in token)
    if not valid or not served.isdigit():
        raise InvalidInputError("the continuation token is malformed", code="invalid_continuation")
    return position, int(served)
