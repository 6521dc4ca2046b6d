"""Locked accounts and follow requests in real headless Chromium: the owner locks the account
and renames it in the settings view; a follow becomes "Requested" (withdrawn and asked
again); the owner approves it (the follower then follows, with the backfill) and refuses
another; each checked against what the API then answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from tests.conftest import unique
from tests.e2e.conftest import request_json, server_errors
from tests.e2e.page import Page, shows_the_api_error, timeline_ids
from tests.e2e.test_reposts_replies_relations import register, shown

pytestmark = pytest.mark.e2e


def api_get(stack: str, path: str, token: str | None = None) -> Any:
    status, answer = request_json("GET", f"{stack}{path}", token=token)
    assert status == 200, answer
    return answer


def edges(stack: str, path: str, token: str | None = None) -> list[str]:
    page = api_get(stack, path, token)
    assert page["continuation"] is None
    return [edge["user_id"] for edge in page["items"]]


def shown_requests(page: Page) -> list[str]:
    """The settings view's follow requests, top to bottom, by user id."""
    return list(
        page.driver.execute_script(
            "return Array.from(document.querySelectorAll('#request-list li'))"
            ".map((li) => li.dataset.userId)"
        )
    )


def open_settings(page: Page) -> None:
    """The settings view, read afresh (from home, so the address changes)."""
    if page.visible("settings-view"):
        page.click("home-link")
        page.wait(lambda: page.visible("timeline"), what="the home timeline")
    page.click("settings-link")
    page.wait(lambda: page.visible("settings-view"), what="the settings view")
    page.wait(
        lambda: (
            page.element("settings-display-name").get_attribute("value")
            and not page.element("settings-locked").get_attribute("disabled")
        ),
        what="the profile in the settings",
    )
    page.wait(lambda: page.visible("request-empty") or shown_requests(page), what="the requests")


def answer_request(page: Page, user_id: str, button: str) -> None:
    page.hide("requests-message")
    selector = f'#request-list li[data-user-id="{user_id}"] button[aria-label^="{button}"]'
    page.driver.find_element(By.CSS_SELECTOR, selector).click()


def follow_state(page: Page) -> tuple[str, str]:
    """The profile's follow badge ("" when hidden) and its follow button, once read."""
    button = page.element("profile-follow")
    if not button.is_enabled():
        return "", ""
    badge = page.element("profile-view-relation")
    return (badge.text if badge.is_displayed() else ""), str(button.text)


def test_lock_request_approve_and_refuse(
    stack: str, browsers: Callable[[str], webdriver.Chrome]
) -> None:
    owner_id, fan_id, other_id = unique("olive"), unique("finn"), unique("tess")
    other_token = register(stack, other_id)
    owner = Page(browsers("owner"), stack)
    owner.open()
    owner_token = owner.register(owner_id, "Olive O")
    owner.post("olive's earlier post")
    [earlier] = [p["post_id"] for p in owner.posts()]

    # the owner locks the account and renames it
    open_settings(owner)
    assert owner.element("settings-display-name").get_attribute("value") == "Olive O"
    assert not owner.element("settings-locked").is_selected()
    assert owner.visible("request-empty")
    owner.click("settings-locked")
    owner.wait_message("profile-settings-message", "ok", "Your account is locked")
    assert owner.element("settings-locked").is_selected()
    assert api_get(stack, f"/users/{owner_id}")["locked"] is True
    owner.fill("settings-display-name", "Olive Locked")
    owner.click("name-submit")
    owner.wait_message("profile-settings-message", "ok", "Olive Locked")
    assert api_get(stack, f"/users/{owner_id}")["display_name"] == "Olive Locked"
    assert owner.text("profile-display-name") == "Olive Locked"
    assert shown(owner)[0]["name"] == "Olive Locked"  # on her post too
    owner.fill("settings-display-name", "  ")
    owner.click("name-submit")
    error = shows_the_api_error(
        owner, "profile-settings-message", "PATCH", f"/users/{owner_id}",
        {"display_name": ""}, owner_token,
    )  # fmt: skip
    assert error["code"] == "invalid_display_name"
    assert api_get(stack, f"/users/{owner_id}")["display_name"] == "Olive Locked"

    # a follow is a request: "Requested", withdrawn, asked again, still there after a reload
    fan = Page(browsers("fan"), stack)
    fan.open()
    fan_token = fan.register(fan_id)
    fan.driver.get(f"{stack}/#/u/{owner_id}")
    fan.wait(lambda: fan.text("profile-view-name") == "Olive Locked", what="the new name")
    fan.wait(lambda: fan.visible("profile-view-locked"), what="the lock")
    fan.wait(lambda: follow_state(fan) == ("", "Follow"), what="the follow button")
    fan.click("profile-follow")
    fan.wait_message("profile-message", "ok", f"Requested to follow @{owner_id}")
    fan.wait(lambda: follow_state(fan) == ("Requested", "Withdraw request"), what="Requested")
    requests = f"/users/{owner_id}/follow_requests"
    assert edges(stack, requests, owner_token) == [fan_id]
    assert edges(stack, f"/users/{fan_id}/following") == []
    fan.hide("profile-message")
    fan.click("profile-follow")
    fan.wait_message("profile-message", "ok", "Withdrew the request")
    fan.wait(lambda: follow_state(fan) == ("", "Follow"), what="the request withdrawn")
    assert edges(stack, requests, owner_token) == []
    fan.click("profile-follow")
    fan.wait(lambda: follow_state(fan) == ("Requested", "Withdraw request"), what="asked again")
    fan.reload()
    fan.wait(lambda: follow_state(fan) == ("Requested", "Withdraw request"), what="reloaded")

    # the owner approves: the follow starts, with its backfill
    open_settings(owner)
    assert shown_requests(owner) == [fan_id]
    answer_request(owner, fan_id, "Approve")
    owner.wait_message("requests-message", "ok", f"Approved: @{fan_id} follows you now")
    assert shown_requests(owner) == []
    assert owner.visible("request-empty")
    assert edges(stack, f"/users/{fan_id}/following") == [owner_id]
    assert edges(stack, requests, owner_token) == []
    fan.wait(lambda: earlier in timeline_ids(stack, fan_id, fan_token), what="the backfill")
    fan.reload()
    fan.wait(lambda: follow_state(fan) == ("Following", "Unfollow"), what="Following")
    fan.click("home-link")
    fan.wait(lambda: [p["post_id"] for p in shown(fan)] == [earlier], what="the earlier post")

    # another asks (through the API); the owner refuses, and the request is gone
    status, answer = request_json(
        "PUT", f"{stack}/users/{other_id}/following/{owner_id}", None, other_token
    )
    assert (status, answer) == (202, {"state": "requested"})
    open_settings(owner)
    assert shown_requests(owner) == [other_id]
    answer_request(owner, other_id, "Refuse")
    owner.wait_message("requests-message", "ok", f"Refused @{other_id}'s request")
    assert shown_requests(owner) == []
    assert edges(stack, requests, owner_token) == []
    assert edges(stack, f"/users/{other_id}/following") == []
    open_settings(owner)
    assert shown_requests(owner) == []
    assert owner.script_errors() == []
    assert fan.script_errors() == []
    assert server_errors(stack) == 0
