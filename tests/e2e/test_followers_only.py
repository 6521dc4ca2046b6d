"""Followers-only posts in real headless Chromium: the author posts one to followers only
and one to everyone from the compose box; a follower's home timeline and the author's
profile show both, the followers-only one marked "Followers only" with no Repost button, and
a reply to it starts as followers-only too; someone who does not follow the author sees only
the public one on the profile; the author sees both on the profile. Each checked against
what the API then answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from tests.conftest import unique
from tests.e2e.conftest import request_json, server_errors
from tests.e2e.page import Page

pytestmark = pytest.mark.e2e

FRIENDS = ["for friends", "Followers only", False]
"""The followers-only post as shown: its text, its marker, no Repost button."""
ALL = ["for all", None, True]
"""The public post as shown: no marker, a Repost button."""


def shown(page: Page, within: str) -> list[list[Any]]:
    """A list of posts (``#timeline-list``, ``#profile-list``, a post's replies), top to
    bottom: the text, the visibility marker's text (None when it is not shown) and whether it
    has a Repost button."""
    return list(
        page.driver.execute_script(
            """return Array.from(document.querySelectorAll(arguments[0] + ' > li'))
            .map((li) => {
                const marker = li.querySelector(':scope > .post-head > .post-visibility');
                return [
                    li.querySelector(':scope > .post-text').textContent,
                    marker.checkVisibility() ? marker.textContent.trim() : null,
                    li.querySelector(':scope > .post-actions > .post-repost-button') !== null,
                ];
            })""",
            within,
        )
    )


def open_profile(page: Page, user_id: str) -> None:
    page.driver.get(f"{page.base}/#/u/{user_id}")
    page.wait(lambda: page.text("profile-view-id") == f"@{user_id}", what=f"{user_id}'s profile")


def api_posts(page: Page, author: str, token: str) -> dict[str, str]:
    """The author's posts as ``token``'s user reads them: text -> visibility."""
    status, answer = request_json("GET", f"{page.base}/users/{author}/posts", token=token)
    assert status == 200, answer
    assert answer["continuation"] is None
    return {item["text"]: item["visibility"] for item in answer["items"]}


def test_followers_only_posts(stack: str, browsers: Callable[[str], webdriver.Chrome]) -> None:
    author_id, fan_id, stranger_id = unique("ada"), unique("fan"), unique("stranger")
    author = Page(browsers("author"), stack)
    author.open()
    author_token = author.register(author_id)
    fan = Page(browsers("fan"), stack)
    fan.open()
    fan_token = fan.register(fan_id)
    fan.follow(author_id)

    # the compose box sends who sees each post
    assert author.element("compose-visibility").get_attribute("value") == "public"
    author.post("for friends", "Followers only")
    author.post("for all", "Everyone")
    assert api_posts(author, author_id, author_token) == {
        "for friends": "followers",
        "for all": "public",
    }
    author.wait(lambda: shown(author, "#timeline-list") == [ALL, FRIENDS], what="her own posts")
    posts = {post["text"]: post["post_id"] for post in author.posts()}

    # the follower: both arrive, the followers-only one marked and not repostable
    fan.wait(lambda: shown(fan, "#timeline-list") == [ALL, FRIENDS], what="both posts, live")
    status, answer = request_json(
        "POST",
        f"{stack}/users/{fan_id}/reposts",
        {"author": author_id, "post_id": posts["for friends"]},
        fan_token,
    )
    assert (status, answer["error"]["code"]) == (403, "not_repostable")

    # a reply starts as its post: followers-only to a followers-only post
    reply_to_all = fan.in_post(posts["for all"], ".reply-form .reply-visibility")
    assert reply_to_all.get_attribute("value") == "public"
    fan.in_post(posts["for friends"], ".post-actions .post-reply-button").click()
    choice = fan.in_post(posts["for friends"], ".reply-form .reply-visibility")
    assert choice.get_attribute("value") == "followers"
    fan.in_post(posts["for friends"], ".reply-form .reply-text").send_keys("a reply for friends")
    fan.in_post(posts["for friends"], ".reply-form .reply-submit").click()
    fan.wait_message("timeline-message", "ok", f"Replied to @{author_id}")
    replies = f'#timeline-list li[data-post-id="{posts["for friends"]}"] > .replies > .reply-list'
    fan.wait(
        lambda: (
            [text for text, marker, _ in shown(fan, replies) if marker == "Followers only"]
            == ["a reply for friends"]
        ),
        what="the reply, marked, under the post",
    )
    assert api_posts(fan, fan_id, fan_token) == {"a reply for friends": "followers"}

    # the author's profile: both to the follower, the public one only to a non-follower
    open_profile(fan, author_id)
    fan.wait(lambda: shown(fan, "#profile-list") == [ALL, FRIENDS], what="both on her profile")
    stranger = Page(browsers("stranger"), stack)
    stranger.open()
    stranger_token = stranger.register(stranger_id)
    open_profile(stranger, author_id)
    stranger.wait(lambda: shown(stranger, "#profile-list") == [ALL], what="the public post only")
    assert not stranger.visible("profile-more")
    assert api_posts(stranger, author_id, stranger_token) == {"for all": "public"}
    assert "for friends" not in stranger.driver.find_element(By.TAG_NAME, "body").text

    # her own profile shows both
    open_profile(author, author_id)
    author.wait(lambda: shown(author, "#profile-list") == [ALL, FRIENDS], what="both, her own")

    for page in (author, fan, stranger):
        assert page.script_errors() == []
    assert server_errors(stack) == 0
