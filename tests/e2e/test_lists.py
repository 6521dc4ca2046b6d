"""Lists in real headless Chromium: created in the side menu, opened there, a member's posts
in the list's view (followed or not; added there or from a profile), an exclusive list's
followed member kept out of the home view, a member removed, the list renamed and deleted,
and the API's refusal shown as it words it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.conftest import unique
from tests.e2e.conftest import request_json, server_errors
from tests.e2e.page import Page, shows_the_api_error
from tests.e2e.test_reposts_replies_relations import api_post, register

pytestmark = pytest.mark.e2e


def api_lists(stack: str, user_id: str, token: str) -> list[dict[str, Any]]:
    status, page = request_json("GET", f"{stack}/users/{user_id}/lists", token=token)
    assert status == 200, page
    assert page["continuation"] is None
    return list(page["items"])


def api_members(stack: str, user_id: str, token: str, list_id: str) -> list[str]:
    path = f"{stack}/users/{user_id}/lists/{list_id}/members"
    status, page = request_json("GET", path, token=token)
    assert status == 200, page
    return [edge["user_id"] for edge in page["items"]]


def menu(page: Page) -> list[dict[str, Any]]:
    """The side menu's lists, top to bottom, and which one is marked as shown."""
    return list(
        page.driver.execute_script(
            """return Array.from(document.querySelectorAll('#list-menu li')).map((li) => ({
                list_id: li.dataset.listId,
                title: li.querySelector('.menu-link').textContent,
                exclusive: Boolean(li.querySelector('.badge')),
                current: li.querySelector('.menu-link').getAttribute('aria-current') === 'page',
            }))"""
        )
    )


def members(page: Page) -> list[str]:
    return list(
        page.driver.execute_script(
            "return Array.from(document.querySelectorAll('#member-list li'))"
            ".map((li) => li.dataset.userId)"
        )
    )


def ids(page: Page) -> set[str]:
    return {post["post_id"] for post in page.posts()}


def refreshed_until(page: Page, condition: Callable[[], bool], *, what: str) -> None:
    """Click "Refresh" (at most twice a second) until ``condition`` holds: a list has no live
    stream, and its fan-out is asynchronous."""
    clicked = [0.0]

    def check() -> bool:
        if condition():
            return True
        if time.monotonic() - clicked[0] > 0.5:
            page.click("refresh")
            clicked[0] = time.monotonic()
        return False

    page.wait(check, what=what)


def open_list(page: Page, list_id: str) -> None:
    page.driver.find_element(By.CSS_SELECTOR, f'#list-menu li[data-list-id="{list_id}"] a').click()
    page.wait(lambda: page.visible("list-view") and page.ready(), what="the list's view")
    assert not page.visible("compose")
    assert not page.visible("live-status")  # a list has no live stream


def add_member(page: Page, member: str) -> None:
    page.hide("list-message")
    page.fill("member-id", member)
    page.click("member-submit")


def test_lists_in_the_side_menu(stack: str, browsers: Callable[[str], webdriver.Chrome]) -> None:
    owner_id, friend_id, stranger_id = unique("owner"), unique("friend"), unique("stranger")
    friend_token = register(stack, friend_id)
    stranger_token = register(stack, stranger_id)
    friend_post = api_post(stack, friend_id, friend_token, "friend says hi")
    page = Page(browsers("owner"), stack)
    page.open()
    token = page.register(owner_id)
    page.wait(lambda: page.visible("lists-empty"), what="no lists yet")
    page.follow(friend_id)
    page.wait(lambda: ids(page) == {friend_post}, what="the friend's post at home")

    # a new list: in the side menu, and opened, empty
    page.fill("new-list-title", "Close friends")
    page.click("list-create")
    page.wait_message("lists-message", "ok", "“Close friends” created")
    [made] = api_lists(stack, owner_id, token)
    list_id = made["list_id"]
    assert (made["title"], made["exclusive"]) == ("Close friends", False)
    shown = {"list_id": list_id, "title": "Close friends", "exclusive": False, "current": True}
    page.wait(lambda: menu(page) == [shown], what="the list in the side menu, marked")
    page.wait(lambda: page.visible("list-view") and page.ready(), what="the list's view")
    assert page.text("timeline-title") == "Close friends"
    assert not page.visible("compose")
    assert not page.visible("lists-empty")
    page.wait(
        lambda: page.visible("member-empty") and page.visible("timeline-empty-list"),
        what="an empty list",
    )

    # a member not followed: their new post reaches the list's view (not the home timeline)
    add_member(page, stranger_id)
    page.wait_message("list-message", "ok", f"Added @{stranger_id}")
    page.wait(lambda: members(page) == [stranger_id], what="the member listed")
    stranger_post = api_post(stack, stranger_id, stranger_token, "stranger in the list")
    refreshed_until(page, lambda: ids(page) == {stranger_post}, what="the member's post")

    # a followed member, added from their profile: their post is backfilled into the list
    page.driver.find_element(
        By.CSS_SELECTOR, f'#following-list li[data-user-id="{friend_id}"] a'
    ).click()
    page.wait(lambda: page.visible("profile-lists"), what="Add to list on the friend's profile")
    assert Select(page.element("profile-list-choice")).first_selected_option.text == "Close friends"
    page.click("profile-add-to-list")
    page.wait_message("profile-message", "ok", f"Added @{friend_id} to “Close friends”")
    open_list(page, list_id)
    page.wait(lambda: members(page) == [friend_id, stranger_id], what="both members listed")
    both = {stranger_post, friend_post}
    refreshed_until(page, lambda: ids(page) == both, what="the friend's post backfilled")
    assert api_members(stack, owner_id, token, list_id) == [friend_id, stranger_id]

    # exclusive: the friend's post leaves the home view (read again on the way back to it)
    page.click("list-exclusive")
    page.wait_message("list-message", "ok", "Exclusive")
    assert api_lists(stack, owner_id, token)[0]["exclusive"] is True
    page.wait(lambda: menu(page)[0]["exclusive"], what="the menu's exclusive badge")
    page.click("menu-home")

    def home_read() -> bool:
        return page.visible("compose") and page.ready() and page.visible("timeline-empty-home")

    page.wait(home_read, what="the home timeline read again")
    assert not page.visible("list-view")
    assert ids(page) == set()
    assert page.visible("timeline-empty")
    assert not menu(page)[0]["current"]

    # removing a member: their post leaves the list's view at once
    open_list(page, list_id)
    page.wait(lambda: ids(page) == both, what="the list's posts")
    page.wait(lambda: members(page) == [friend_id, stranger_id], what="the members")
    remove = f'#member-list li[data-user-id="{stranger_id}"] button'
    page.driver.find_element(By.CSS_SELECTOR, remove).click()
    page.wait_message("list-message", "ok", f"Removed @{stranger_id}")
    assert members(page) == [friend_id]
    assert ids(page) == {friend_post}
    assert api_members(stack, owner_id, token, list_id) == [friend_id]

    # renaming: the menu and the view say so
    page.fill("list-rename-title", "Besties")
    page.click("list-rename-submit")
    page.wait_message("list-message", "ok", "“Besties”")
    page.wait(lambda: menu(page)[0]["title"] == "Besties", what="the new title in the menu")
    assert page.text("list-view-title") == page.text("timeline-title") == "Besties"

    # a reload stays on the list
    page.reload()
    page.wait(lambda: page.visible("list-view") and ids(page) == {friend_post}, what="the list")
    page.wait(lambda: page.text("timeline-title") == "Besties", what="its title")
    page.wait(lambda: members(page) == [friend_id], what="its member")
    assert menu(page)[0]["current"]

    # an unknown user: the API's own error, and no member added
    ghost = unique("ghost")
    add_member(page, ghost)
    path = f"/users/{owner_id}/lists/{list_id}/members/{ghost}"
    error = shows_the_api_error(page, "list-message", "PUT", path, token=token)
    assert error["code"] == "user_not_found"
    assert members(page) == [friend_id]

    # deleting asks first; then the list is gone from the menu, and its exclusive member's
    # post is back at home
    page.click("list-delete")
    page.wait(lambda: page.visible("list-confirm"), what="the confirmation")
    page.click("list-confirm-cancel")
    assert not page.visible("list-confirm")
    page.click("list-delete")
    page.click("list-confirm-delete")
    page.wait_message("lists-message", "ok", "“Besties” deleted")
    page.wait(lambda: page.visible("compose") and not page.visible("list-view"), what="home")
    assert menu(page) == []
    assert page.visible("lists-empty")
    assert api_lists(stack, owner_id, token) == []
    page.wait(lambda: ids(page) == {friend_post}, what="the friend's post back home")
    assert page.script_errors() == []
    assert server_errors(stack) == 0
