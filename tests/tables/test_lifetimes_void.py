"""The sweep's judgement of a void filing: ``void`` files the post's row before it learns a
real post is there (the API's write came first), so the sweep must read the row and leave a
real post, removing only a row that is still void."""

from __future__ import annotations

import time

from fanout_worker.sweeper import GRACE_S, Sweeper
from tests.conftest import unique
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks, post_row_key
from timeline.storage.accounts import Storage
from timeline.storage.names import POSTS
from timeline.tables.repositories import Repositories
from timeline.tables.rows import get_entity

LIFETIME_S = 3600.0
LATER = LIFETIME_S + GRACE_S + 120


async def test_a_real_post_named_by_a_void_filing_stays(own: Storage) -> None:
    repos = Repositories.on(own)
    author = unique("a")
    real = await repos.posts.add(Post(post_id=new_post_id(now_ticks()), author=author, text="hi"))
    assert not await repos.posts.void(author, real.post_id)  # the API's write came first
    voided = new_post_id(now_ticks())
    assert await repos.posts.void(author, voided)
    report = await Sweeper(own, claim_lifetime_s=LIFETIME_S).sweep(now=time.time() + LATER)
    assert await get_entity(own, POSTS, author, post_row_key(real.post_id)) is not None
    assert await get_entity(own, POSTS, author, post_row_key(voided)) is None
    assert report.removed == 1
    assert report.dropped == 2
