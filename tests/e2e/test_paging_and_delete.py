"""The web client in real headless Chromium: paging ("Load more"), a reload that stays
signed in, and deleting one's own post. Every wait polls with ``WebDriverWait``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from selenium import webdriver

from tests.conftest import unique
from tests.e2e.conftest import PAGE_SIZE, request_json, server_errors
from tests.e2e.page import Page, timeline_ids

pytestmark = pytest.mark.e2e


def test_paging_reload_and_delete(stack: str, browsers: Callable[[str], webdriver.Chrome]) -> None:
    carol_id = unique("carol")
    carol = Page(browsers("carol"), stack)
    carol.open()
    token = carol.register(carol_id)
    texts = [f"post {n}" for n in range(1, PAGE_SIZE + 3)]
    for text in texts:
        carol.post(text)
    newest_first = texts[::-1]
    assert carol.texts() == newest_first

    carol.wait(
        lambda: len(timeline_ids(stack, carol_id, token)) == len(texts),
        what="every post in carol's home timeline",
    )
    carol.reload()
    assert carol.signed_in_as() == carol_id  # the token survived the reload
    carol.wait(lambda: len(carol.posts()) == PAGE_SIZE, what="the first page")
    assert carol.texts() == newest_first[:PAGE_SIZE]
    assert carol.visible("load-more")
    carol.load_all()
    assert carol.texts() == newest_first
    assert not carol.visible("load-more")

    doomed = carol.posts()[0]
    carol.delete(doomed["post_id"])
    carol.wait(lambda: doomed["post_id"] not in [p["post_id"] for p in carol.posts()],
               what="the deleted post gone")  # fmt: skip
    carol.wait_message("timeline-message", "ok", "Post deleted")
    carol.wait(
        lambda: doomed["post_id"] not in timeline_ids(stack, carol_id, token),
        what="the delete to reach carol's home timeline",
    )
    carol.reload()
    carol.wait(lambda: len(carol.posts()) == PAGE_SIZE, what="the first page again")
    carol.load_all()
    assert carol.texts() == newest_first[1:]
    status, _ = request_json("GET", f"{stack}/users/{carol_id}/posts/{doomed['post_id']}")
    assert status == 404
    assert carol.script_errors() == []
    assert server_errors(stack) == 0
