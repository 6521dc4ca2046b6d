"""Issue 23 in real headless Chromium: profile pages reached by clicking an author (posts,
followers, following, a follow button), display names, empty states instead of a bare
"Load more", a delete that asks first, the timeline in a phone's first screen, and /docs
grouped by tag with a real example and how to authorise."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from tests.conftest import unique
from tests.e2e.conftest import request_json, server_errors
from tests.e2e.page import Page
from tests.e2e.test_reposts_replies_relations import api_post, register, shown

pytestmark = pytest.mark.e2e


def profile_items(page: Page) -> list[str]:
    """The open profile list: post texts, or user ids of followers / following."""
    return list(
        page.driver.execute_script(
            """return Array.from(document.querySelectorAll('#profile-list > li'))
            .map((li) => li.classList.contains('person') ? li.dataset.userId
                         : li.querySelector('.post-text').textContent)"""
        )
    )


def test_profiles_names_and_empty_states(
    stack: str, browsers: Callable[[str], webdriver.Chrome]
) -> None:
    gina_id, hank_id = unique("gina"), unique("hank")
    hank_token = register(stack, hank_id, "Hank H")
    for text in ("hank one", "hank two"):
        api_post(stack, hank_id, hank_token, text)
    gina = Page(browsers("gina"), stack)
    gina.open()
    gina.register(gina_id, "Gina G")

    # an empty timeline says so, with no bare "Load more"
    gina.wait(lambda: gina.visible("timeline-empty"), what="the empty state")
    assert "Nothing here yet" in gina.text("timeline-empty")
    assert not gina.visible("load-more")

    gina.post("gina's first")
    assert not gina.visible("timeline-empty")
    own = shown(gina)[0]
    gina.wait(lambda: shown(gina)[0]["name"] == "Gina G", what="her display name on her post")
    gina.in_post(own["post_id"], ".post-head .post-author-link").click()  # clickable author
    gina.wait(lambda: gina.visible("profile-view"), what="her profile page")
    assert not gina.visible("timeline")
    gina.wait(lambda: gina.text("profile-view-name") == "Gina G", what="the profile's name")
    assert gina.text("profile-view-id") == f"@{gina_id}"
    gina.wait(lambda: profile_items(gina) == ["gina's first"], what="her posts")
    assert not gina.visible("profile-view-actions")  # no follow button on one's own page
    gina.click("profile-tab-followers")
    gina.wait(lambda: gina.visible("profile-empty"), what="the followers' empty state")
    assert gina.text("profile-empty") == "Nobody follows you yet."

    # hank's page: his posts, a follow button; following him fills the timeline
    gina.driver.get(f"{stack}/#/u/{hank_id}")
    gina.wait(lambda: gina.text("profile-view-name") == "Hank H", what="hank's profile")
    gina.wait(lambda: profile_items(gina) == ["hank two", "hank one"], what="hank's posts")
    follow = gina.element("profile-follow")
    gina.wait(lambda: follow.is_enabled() and follow.text == "Follow", what="the follow button")
    follow.click()
    gina.wait_message("profile-message", "ok", f"Following @{hank_id}")
    gina.wait(lambda: follow.text == "Unfollow", what="the button to say Unfollow")
    gina.wait(lambda: "1 follower" in gina.text("profile-view-counts"), what="the new count")
    gina.click("profile-tab-followers")
    gina.wait(lambda: profile_items(gina) == [gina_id], what="gina among hank's followers")
    gina.click("profile-tab-following")
    gina.wait(lambda: gina.visible("profile-empty"), what="hank follows nobody")
    assert gina.text("profile-empty") == f"@{hank_id} does not follow anyone yet."

    gina.click("home-link")
    gina.wait(
        lambda: [p["name"] for p in shown(gina) if p["author"] == hank_id] == ["Hank H"] * 2,
        what="hank's posts in the timeline, with his name",
    )
    hanks = next(p for p in shown(gina) if p["author"] == hank_id)
    gina.in_post(hanks["post_id"], ".post-head .post-author-link").click()
    gina.wait(lambda: gina.text("profile-view-id") == f"@{hank_id}", what="hank's page again")
    gina.wait(lambda: gina.element("profile-follow").text == "Unfollow", what="the follow state")
    assert gina.script_errors() == []
    assert server_errors(stack) == 0


def test_delete_asks_first(stack: str, browsers: Callable[[str], webdriver.Chrome]) -> None:
    ivy_id = unique("ivy")
    ivy = Page(browsers("ivy"), stack)
    ivy.open()
    ivy.register(ivy_id)
    ivy.post("keep me")
    post_id = ivy.posts()[0]["post_id"]
    ivy.in_post(post_id, ".post-head .post-delete").click()
    ask = ivy.in_post(post_id, ".post-confirm")
    ivy.wait(lambda: ask.is_displayed(), what="the confirmation")
    assert "Delete this post?" in ask.text
    ivy.in_post(post_id, ".post-confirm .post-confirm-cancel").click()
    ivy.wait(lambda: not ask.is_displayed(), what="the confirmation to close")
    assert ivy.texts() == ["keep me"]
    assert request_json("GET", f"{stack}/users/{ivy_id}/posts/{post_id}")[0] == 200
    ivy.delete(post_id)
    ivy.wait(lambda: ivy.texts() == [], what="the post gone once confirmed")
    ivy.wait(
        lambda: request_json("GET", f"{stack}/users/{ivy_id}/posts/{post_id}")[0] == 404,
        what="the delete",
    )


PHONE = {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True}


def test_the_timeline_is_in_a_phones_first_screen(
    stack: str, browsers: Callable[[str], webdriver.Chrome]
) -> None:
    jo_id = unique("jo")
    jo = Page(browsers("jo"), stack)
    jo.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", PHONE)
    jo.open()
    jo.register(jo_id, "Jo")
    jo.post("seen on a phone")
    geometry = jo.driver.execute_script(
        """const box = (id) => document.getElementById(id).getBoundingClientRect();
        const post = document.querySelector('#timeline-list li.post').getBoundingClientRect();
        return {height: window.innerHeight, width: window.innerWidth,
                scroll: document.documentElement.scrollWidth, compose: box('compose').top,
                timeline: box('timeline').top, post: post.top, account: box('account').top};"""
    )
    assert geometry["width"] == PHONE["width"]
    assert geometry["scroll"] <= geometry["width"], geometry  # nothing wider than the phone
    assert geometry["post"] < geometry["height"], geometry  # the newest post in the first screen
    assert geometry["timeline"] < geometry["account"], geometry  # the account card below
    assert jo.element("compose-submit").is_displayed()
    assert jo.script_errors() == []


def test_docs_are_grouped_with_examples_and_say_how_to_authorise(
    stack: str, browsers: Callable[[str], webdriver.Chrome]
) -> None:
    docs = Page(browsers("docs"), stack)
    docs.driver.get(f"{stack}/docs")
    tags = [
        "accounts",
        "posts",
        "follows",
        "timeline",
        "relations",
        "markers",
        "lists",
        "operations",
    ]

    def tag_names() -> list[str]:
        found = docs.driver.find_elements(By.CSS_SELECTOR, ".opblock-tag-section h3 .nostyle")
        return [str(element.text) for element in found]

    docs.wait(lambda: tag_names() == tags, what="the operations grouped by tag")
    info = docs.driver.find_element(By.CSS_SELECTOR, ".information-container").text
    assert "POST /users" in info
    assert "Authorize" in info
    docs.driver.find_element(By.ID, "operations-accounts-get_user").click()
    docs.wait(
        lambda: "alice" in docs.driver.find_element(By.ID, "operations-accounts-get_user").text,
        what="the user id's example",
    )
