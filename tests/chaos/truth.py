"""The truth model: what each reader's home timeline, and each live list's timeline, must,
may and must not show, from the tables themselves (posts, follow and membership rows, repost
rows, blocks, mutes, filters and lists), and the check of a timeline read page by page
against it.

Plain posts are exact: the reader's own live posts and those of the authors its follow rows
say it follows, each shown once, without the authors its blocks (either way) and live mutes
hide, and without the entries whose text its live keyword filters name. A followers-only
post is a plain post here: the reader gets it only from an author it follows. Where the
documented rules leave the outcome to timing, the check is the weaker exact property the docs
promise (docs/api.md "Reposts and replies", "Blocks and mutes"):

- a reply of A to B (B neither A nor the reader) reaches the reader only if it followed B
  when a delivery (the post's fan-out, or the backfill of the reader's follow of A) ran, and
  stays after an unfollow of B. So it *must* show when the reader's follow row of B is older,
  by ``FOLLOW_SETTLED_S``, than both the reply and its follow of A (every delivery ran after
  that follow landed); it must *not* show when the reader never asked to follow B; otherwise
  it may;
- a repost's entry may show (it is never required: a reader dormant at the repost, whose
  newest 40 entries showed the post, or whose follow was made after it or with
  ``reposts=false`` since, gets none): only a live repost (its current id) of a live original,
  by a reposter the reader follows (``reposts=false`` keeps entries delivered before) and is
  not, not hidden by the reader's blocks and mutes, each at most once;
- a page never shows one post twice (it keeps the newest entry), yet every post the reader
  must see is shown (by its own entry or a repost's): so a post may show on two pages (its
  original and a newer repost), never twice on one;
- the cap: a post that must show is required only while fewer than the cap of the entries
  that may exist (hidden ones included: they count against the cap) are newer.

A list's timeline (docs/api.md "Lists") is the home rule with its membership rows (the
``subjectFollowers`` rows whose follower is the list's reader ``|{owner}~{list_id}``) in
place of follow rows, and without the owner's own posts: each member's live posts (a
followers-only one only while the owner follows the member), a reply only as above with the
replied-to user's membership, members' live reposts as *may*, all hidden by the owner's
blocks, mutes and filters, within the cap. A home timeline leaves out the posts and reposts
made by the members of its owner's exclusive lists (read time: like a mute with reposts, but
a repost of such a member's post by someone else shows).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace
from typing import Any

from timeline.model.entities import DETACHED, Post
from timeline.model.keys import list_reader, post_row_key
from timeline.storage.accounts import Storage
from timeline.storage.names import POSTS, RELATIONS, SUBJECT_FOLLOWERS
from timeline.tables.activity import STATE, ActivityRepository
from timeline.tables.lists import LISTED
from timeline.tables.relations import BLOCK, BLOCKED_BY, FILTERED, MUTED
from timeline.tables.repositories import Repositories
from timeline.tables.reposts import REPOST
from timeline.tables.rows import edge_page

FOLLOW_SETTLED_S = 20.0
"""How long after its ``since`` a follow row and its index row are surely written: the API's
write deadline (10 s) refuses later writes, and a request that died has its index synced by
the follow's delivery, once its message shows (13 s at most) and within a visibility
timeout even under the chaos."""

MUST, MAY, NO = "must", "may", "no"
LIST_READER = re.compile(r"\|(?P<owner>[A-Za-z0-9_-]{1,64})~(?P<list_id>[0-9a-f]{19})")
"""A list's reader id (``|{owner}~{list_id}``, ``timeline.model.keys.list_reader``)."""
Item = dict[str, Any]
"""A timeline entry as the API serves it (``row_json``)."""


@dataclass(frozen=True)
class Hidden:
    """Authors whose posts (and reposts of them) the reader's relations hide, and reposters
    whose reposts they hide."""

    authors: frozenset[str] = frozenset()
    reposters: frozenset[str] = frozenset()
    phrases: frozenset[str] = frozenset()
    """The reader's live keyword filters (the workload's are single plain words)."""
    excluded: frozenset[str] = frozenset()
    """The members of the reader's exclusive lists: the posts and reposts they make stay
    out of its home (not the reposts of their posts by others)."""

    def hides(self, author: str, reposted_by: str | None = None) -> bool:
        if author in self.authors:
            return True
        if reposted_by is None:
            return author in self.excluded
        return reposted_by in self.reposters or reposted_by in self.excluded

    def filters(self, text: str) -> bool:
        """Whether a filter hides a text: an independent oracle, enough for plain words."""
        return any(re.search(rf"\b{re.escape(p)}\b", text, re.IGNORECASE) for p in self.phrases)


@dataclass
class Expect:
    """One reader's expectation: posts it must see, plain posts it may see (replies whose
    delivery depended on timing, posts past the cap), repost entries it may see."""

    must: dict[str, str] = field(default_factory=dict)
    may: dict[str, str] = field(default_factory=dict)
    reposts: dict[tuple[str, str], str] = field(default_factory=dict)
    """(original post id, reposter) to the original's text."""
    repost_keys: dict[tuple[str, str], str] = field(default_factory=dict)
    """(original post id, reposter) to the row key of the live repost's entry."""


@dataclass
class Seen:
    """What the reads showed, for the report."""

    repost_entries: int = 0
    replies: int = 0
    optional_replies: int = 0
    private_on_pages: int = 0
    """Followers-only posts an author's page showed (to the author or a follower)."""
    list_entries: int = 0
    """Entries the list reads showed."""


class Truth:
    """Each reader's home timeline, and each live list's timeline, as the tables say it must
    be (``Expect``)."""

    def __init__(
        self,
        storage: Storage,
        users: list[str],
        cap: int,
        asked_to_follow: set[tuple[str, str]] | None = None,
        reply_targets: dict[str, str] | None = None,
    ) -> None:
        self._repos = Repositories.on(storage)
        self._storage = storage
        self._users = users
        self._cap = cap
        self._asked = asked_to_follow or set()
        self._reply_targets = reply_targets or {}
        """A reply's text to the user it answers (a reply to a deleted account no longer
        says whom it answered)."""
        self.live: dict[str, dict[str, Post]] = {}
        self.followers: dict[str, dict[str, float]] = {}
        """Author to follower (users only) to the follow row's ``since`` (epoch seconds)."""
        self.members: dict[str, dict[str, float]] = {}
        """A list's reader to member to the membership row's ``since``: every membership row
        found, the deleted lists' too (``lists`` says which are live)."""
        self.lists: dict[str, dict[str, bool]] = {}
        """Owner to its live lists' ids to whether each is exclusive (its ``l-`` rows)."""
        self.reposts: dict[str, dict[str, str]] = {}
        """Reposter to original post id to the live repost's id."""
        self.hidden: dict[str, Hidden] = {}
        self.homes: dict[str, Expect] = {}
        self.list_views: dict[str, Expect] = {}
        """A live list's reader to what its owner must and may see in it."""
        self.exclusive_hidden = 0
        """Live posts of followed authors that the readers' exclusive lists keep out of home."""
        self.seen = Seen()

    async def load(self) -> None:
        for user in self._users:
            posts = await self._repos.posts.newest(user, 10_000)
            self.live[user] = {post.post_id: post for post in posts}
            self.followers[user] = await self._followers(user)
            self.reposts[user] = await self._reposts(user)
            self.hidden[user], self.lists[user] = await self._relations(user, time.time())
        for user in self._users:
            excluded = frozenset(
                member
                for list_id, exclusive in self.lists[user].items()
                if exclusive
                for member in self.members.get(list_reader(user, list_id), {})
            )
            self.hidden[user] = replace(self.hidden[user], excluded=excluded)
            followed = set(self.following(user))
            self.exclusive_hidden += sum(len(self.live[a]) for a in excluded & followed)
        self.homes = {reader: self.expect(reader, self.hidden[reader]) for reader in self._users}
        self.list_views = {
            reader: self.expect(reader, replace(self.hidden[owner], excluded=frozenset()))
            for owner, lists in self.lists.items()
            for reader in (list_reader(owner, list_id) for list_id in lists)
        }

    def author_of(self, post_id: str) -> str | None:
        return next((a for a, posts in self.live.items() if post_id in posts), None)

    def following(self, reader: str) -> list[str]:
        """The users ``reader`` follows (a list's reader: its members)."""
        if LIST_READER.fullmatch(reader):
            return sorted(self.members.get(reader, {}))
        return [a for a in self._users if reader in self.followers[a]]

    def sources(self, reader: str) -> dict[str, float]:
        """Whose posts reach ``reader``'s timeline, to the ``since`` of the row that makes
        them: a user's own (0) and its follows', or a list's members'."""
        if LIST_READER.fullmatch(reader):
            return dict(self.members.get(reader, {}))
        return {reader: 0.0} | {a: self.followers[a][reader] for a in self.following(reader)}

    def expect(self, reader: str, hidden: Hidden, *, stored: bool = False) -> Expect:
        """What ``reader`` (a user, or a list's reader) must and may see through ``hidden``
        (the owner's relations; Hidden() with ``stored``: what its partition holds, before a
        read hides anything)."""
        sources = self.sources(reader)
        listed = LIST_READER.fullmatch(reader)
        owner = listed["owner"] if listed else reader
        expect = Expect()
        candidates: list[tuple[str, str | None]] = []  # (row key, post id it must show)
        for author, since_author in sources.items():
            followed = author == owner or owner in self.followers[author]
            unseen = bool(listed) and not stored and not followed  # its followers-only posts
            for post in self.live[author].values():
                hides = (author != reader and hidden.hides(author)) or hidden.filters(post.text)
                hides = hides or (unseen and post.followers_only)
                shown = None if hides else post.post_id
                if shown is not None:
                    rule = self._reply_rule(reader, author, post, since_author, sources)
                    if rule == MUST:
                        expect.must[shown] = post.text
                    else:
                        if rule == MAY:
                            expect.may[shown] = post.text
                        shown = None
                candidates.append((post.row_key, shown))
        for reposter in sources:
            if reposter == reader:
                continue
            for original, repost_id in self.reposts[reposter].items():
                origin = self.author_of(original)
                if origin is None:
                    continue  # the original was deleted: its reposts go with it
                key = post_row_key(repost_id)
                candidates.append((key, None))
                text = self.live[origin][original].text
                if not hidden.hides(origin, reposter) and not hidden.filters(text):
                    expect.reposts[(original, reposter)] = self.live[origin][original].text
                    expect.repost_keys[(original, reposter)] = key
        if self._cap:
            for _, post_id in sorted(candidates)[self._cap :]:
                if post_id is not None:  # past the cap: may have been trimmed
                    expect.may[post_id] = expect.must.pop(post_id)
        return expect

    def detached_replies(self) -> int:
        """Live replies to an account deleted since."""
        return sum(
            post.reply_author == DETACHED for posts in self.live.values() for post in posts.values()
        )

    def _reply_rule(
        self, reader: str, author: str, post: Post, since_author: float, sources: dict[str, float]
    ) -> str:
        """Whether a post of a followed author (or the reader's own; a list's member's) must,
        may or must not show, by the reply rule (``sources``: the reader's follows, or the
        list's members, with their rows' ``since``)."""
        target = post.reply_author
        if target is None or reader in (author, target) or target == author:
            return MUST
        if target == DETACHED:  # answers a deleted account: kept where a delivery put it
            gone = self._reply_targets.get(post.text)
            return MAY if (reader, gone) in self._asked else NO
        if (reader, target) not in self._asked:
            return NO
        since_target = sources.get(target)
        delivered_after = max(post.created_at.timestamp(), since_author)
        if since_target is not None and since_target + FOLLOW_SETTLED_S < delivered_after:
            return MUST
        return MAY

    async def state(self, reader: str) -> str | None:
        """The reader's dormancy state as stored (``dormant``, ``waking``, or None)."""
        head = await ActivityRepository(self._storage).head(reader)
        return None if head.marker is None else str(head.marker.get(STATE))

    async def _followers(self, author: str) -> dict[str, float]:
        """The author's followers as its ``subjectFollowers`` rows say (the truth); the rows
        of lists' readers are memberships, kept in ``members`` instead."""
        found: dict[str, float] = {}
        continuation = None
        while True:
            page = await edge_page(self._storage, SUBJECT_FOLLOWERS, author, 1000, continuation)
            for edge in page.items:
                if LIST_READER.fullmatch(edge.user_id):
                    self.members.setdefault(edge.user_id, {})[author] = edge.since.timestamp()
                else:
                    found[edge.user_id] = edge.since.timestamp()
            continuation = page.continuation
            if continuation is None:
                return found

    async def _reposts(self, reposter: str) -> dict[str, str]:
        """The reposter's live reposts, from its repost rows (void ones are undone)."""
        client = self._storage.table(POSTS, reposter)
        async with self._storage.guard():
            rows = [
                row
                async for row in client.query_entities(
                    "PartitionKey eq @pk and RowKey gt @low and RowKey lt @high",
                    parameters={"pk": reposter, "low": REPOST, "high": REPOST[:-1] + "."},
                )
            ]
        return {
            row["RowKey"][len(REPOST) :]: row["repost_id"] for row in rows if not row.get("void")
        }

    async def _relations(self, reader: str, now: float) -> tuple[Hidden, dict[str, bool]]:
        """What the reader's relation rows hide at ``now`` (docs/api.md "Blocks and mutes"),
        but its exclusive lists' members; and its lists (id to ``exclusive``)."""
        client = self._storage.table(RELATIONS, reader)
        authors: set[str] = set()
        reposters: set[str] = set()
        phrases: set[str] = set()
        lists: dict[str, bool] = {}
        async with self._storage.guard():
            rows = [
                row
                async for row in client.query_entities(
                    "PartitionKey eq @pk", parameters={"pk": reader}
                )
            ]
        for row in rows:
            prefix, other = row["RowKey"][:2], row["RowKey"][2:]
            if prefix in (BLOCK, BLOCKED_BY):
                authors.add(other)
                reposters.add(other)
            elif prefix == MUTED and (row.get("expires_at") is None or now < row["expires_at"]):
                authors.add(other)
                if row.get("reposts", True):
                    reposters.add(other)
            elif prefix == FILTERED and (row.get("expires_at") is None or now < row["expires_at"]):
                phrases.add(str(row["phrase"]))
            elif prefix == LISTED:
                lists[str(row["list_id"])] = bool(row.get("exclusive"))
        return Hidden(frozenset(authors), frozenset(reposters), frozenset(phrases)), lists

    def check(self, reader: str, pages: list[list[Item]], expect: Expect) -> None:
        """The pages of a read (newest first) against ``expect``."""
        plain: set[str] = set()
        reposts: set[tuple[str, str]] = set()
        total = 0
        for number, page in enumerate(pages):
            ids = [item["post_id"] for item in page]
            assert len(set(ids)) == len(ids), f"{reader}: a post twice in page {number}: {ids}"
            total += len(page)
            for item in page:
                self._check_item(reader, item, expect, plain, reposts)
        shown = plain | {post_id for post_id, _ in reposts}
        missing = sorted(expect.must.keys() - shown)
        assert not missing, (
            f"{reader}: home misses {[(m, self.author_of(m)) for m in missing]}; "
            f"pages={[[_brief(i) for i in page] for page in pages]}"
        )
        assert not self._cap or total <= self._cap, f"{reader}: {total} entries past the cap"

    def _check_item(
        self,
        reader: str,
        item: Item,
        expect: Expect,
        plain: set[str],
        reposts: set[tuple[str, str]],
    ) -> None:
        post_id, reposter = item["post_id"], item.get("reposted_by")
        if reposter is None:
            assert post_id not in plain, f"{reader}: {post_id} served twice"
            plain.add(post_id)
            text = expect.must.get(post_id, expect.may.get(post_id))
            assert text is not None, f"{reader}: extra {_brief(item)}"
            assert text == item["text"], f"{reader}: {post_id}'s text differs"
            if item.get("reply_to"):
                self.seen.replies += 1
                self.seen.optional_replies += post_id in expect.may
            return
        pair = (post_id, reposter)
        assert pair not in reposts, f"{reader}: repost {pair} served twice"
        reposts.add(pair)
        text = expect.reposts.get(pair)
        assert text is not None, f"{reader}: a repost entry not allowed {_brief(item)}"
        assert text == item["text"], f"{reader}: repost {pair}'s text differs"
        self.seen.repost_entries += 1


def _brief(item: Item) -> str:
    by = item.get("reposted_by")
    return f"{item['author']}/{item['post_id'][:16]}" + (f"<-{by}" if by else "")
