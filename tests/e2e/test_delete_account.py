"""Deleting an account from the settings view, in real headless Chromium: it asks first; then
the tab is signed out, the account is gone (its token refused, its profile a 404, its id
taken), and its post leaves a follower's timeline."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from selenium import webdriver

from tests.conftest import unique
from tests.e2e.conftest import request_json, server_errors
from tests.e2e.page import Page, timeline_ids

pytestmark = pytest.mark.e2e


def test_deleting_an_account_from_the_settings(
    stack: str, browsers: Callable[[str], webdriver.Chrome]
) -> None:
    errors = server_errors(stack)
    fan_id, leaving_id = unique("fan"), unique("leaving")
    status, fan = request_json("POST", f"{stack}/users", {"user_id": fan_id})
    assert status == 201, fan
    page = Page(browsers("leaving"), stack)
    page.open()
    token = page.register(leaving_id)
    status, posted = request_json(
        "POST", f"{stack}/users/{leaving_id}/posts", {"text": "bye"}, token
    )
    assert status == 202, posted
    path = f"{stack}/users/{fan_id}/following/{leaving_id}"
    assert request_json("PUT", path, token=fan["token"])[0] == 204
    page.wait(
        lambda: timeline_ids(stack, fan_id, fan["token"]) == [posted["post_id"]],
        what="the post at the fan's",
    )

    page.click("settings-link")
    page.wait(lambda: page.visible("settings-view"), what="the settings view")
    page.click("account-delete")
    page.wait(lambda: page.visible("account-confirm"), what="the confirmation")
    page.click("account-confirm-cancel")
    assert not page.visible("account-confirm")
    assert request_json("GET", f"{stack}/users/{leaving_id}")[0] == 200

    page.click("account-delete")
    page.click("account-confirm-delete")
    page.wait_message("account-message", "ok", f"Account @{leaving_id} deleted")
    assert page.visible("signed-out")
    assert not page.visible("settings-view")
    assert request_json("GET", f"{stack}/users/{leaving_id}")[0] == 404
    status, refused = request_json("GET", f"{stack}/users/{leaving_id}/timeline", token=token)
    assert status == 401, refused
    assert request_json("POST", f"{stack}/users", {"user_id": leaving_id})[0] == 409
    page.wait(
        lambda: timeline_ids(stack, fan_id, fan["token"]) == [],
        what="the post gone from the fan's timeline",
    )
    assert server_errors(stack) == errors
