"""A post shown once per page *after* the reader's blocks and mutes filter it (found by the
chaos test): a hidden repost's entry never takes its post along (a page thinned by
filtering shows a post once: ``test_reposts_meet_filters``)."""

from __future__ import annotations

from tests.delivery.helpers import unlimited_service
from tests.delivery.hybrid_helpers import HYBRID, add_post, new_users
from tests.helpers import put_copies
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.reads.home import HomeTimeline
from timeline.storage.accounts import Storage
from timeline.tables.repositories import Repositories


def _repost(original: Post, reposter: str, ticks: int) -> Post:
    """A repost's entry as the reposts work writes it (keyed by the repost's id)."""
    return Post(
        new_post_id(ticks),
        original.author,
        original.text,
        reposted_by=reposter,
        original=original.post_id,
    )


async def test_a_muted_reposters_entry_does_not_hide_the_original(
    storage: Storage, repos: Repositories
) -> None:
    reader, author, reposter = await new_users(repos, "reader", "author", "reposter")
    base = now_ticks()
    original = await add_post(repos, author, base - 10_000)
    await put_copies(storage, reader, [original, _repost(original, reposter, base)])
    service = unlimited_service(storage, home=HomeTimeline(storage, max_merged=HYBRID.max_merged))
    await service.relations.mute(reader, reader, reposter, None, True)  # their reposts too
    page = await service.timelines.home(reader, reader, 10, None)
    assert [(item["post_id"], item.get("reposted_by")) for item in page.items] == [
        (original.post_id, None)
    ]
