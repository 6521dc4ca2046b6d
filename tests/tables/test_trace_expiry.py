"""Removal traces end their life without a trim, and a sweep never deletes a trace
written after it read (a purge again between its query and its deletes)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import unique
from tests.helpers import put_copies, trace_keys
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables import timelines as timelines_module
from timeline.tables import traces
from timeline.tables.repositories import Repositories
from timeline.tables.rows import get_entity, partition_page
from timeline.tables.traces import trace_key


async def _remove(repos: Repositories, owner: str, post: Post) -> int:
    tag = await repos.timelines.etag_of(owner, post.row_key)
    assert tag is not None
    return await repos.timelines.remove_unchanged(owner, [(post.row_key, tag)])


async def test_the_trim_keeps_a_trace_rewritten_after_its_read(
    storage: Storage, repos: Repositories, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = unique("reader")
    post = Post(new_post_id(now_ticks()), "friend", "p")
    await put_copies(storage, owner, [post])
    await _remove(repos, owner, post)
    monkeypatch.setattr(traces, "TRACE_LIFETIME_S", -5.0)  # every trace counts as expired
    real = partition_page

    async def read_then_race(*args: Any, **kwargs: Any) -> Any:
        page = await real(*args, **kwargs)
        monkeypatch.setattr(traces, "TRACE_LIFETIME_S", 3600.0)  # the purge's own sweep
        await put_copies(storage, owner, [post])  # copied again (re-follow) ...
        await _remove(repos, owner, post)  # ... and purged again: its trace rewritten
        monkeypatch.setattr(traces, "TRACE_LIFETIME_S", -5.0)
        return page

    monkeypatch.setattr(timelines_module, "partition_page", read_then_race)
    await repos.timelines.trim(owner, keep=800)
    trace = await get_entity(storage, TIMELINES, owner, trace_key(post.row_key), select=["RowKey"])
    assert trace is not None, "the trim deleted a trace written after its read"


async def test_a_purge_sweeps_expired_traces_of_an_untrimmed_timeline(
    storage: Storage, repos: Repositories, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = unique("reader")
    posts = [Post(new_post_id(now_ticks() + i), "friend", str(i)) for i in range(3)]
    await put_copies(storage, owner, posts)
    for post in posts[:2]:
        await _remove(repos, owner, post)
    assert len(await trace_keys(storage, TIMELINES, owner)) == 2
    monkeypatch.setattr(traces, "TRACE_LIFETIME_S", -5.0)  # every trace counts as expired
    await _remove(repos, owner, posts[2])  # no trim runs
    assert set(await trace_keys(storage, TIMELINES, owner)) <= {trace_key(posts[2].row_key)}
