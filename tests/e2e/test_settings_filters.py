"""Keyword filters in the settings view, in real headless Chromium: adding one hides the
matching posts from the home timeline, removing it shows them again, an end is shown and
sent, and the API's refusal is shown as it words it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.conftest import unique
from tests.e2e.conftest import request_json, server_errors
from tests.e2e.page import Page, shows_the_api_error

pytestmark = pytest.mark.e2e


def register(stack: str, user_id: str) -> str:
    status, answer = request_json("POST", f"{stack}/users", {"user_id": user_id})
    assert status == 201, answer
    return str(answer["token"])


def api_post(stack: str, user_id: str, token: str, text: str) -> str:
    status, answer = request_json("POST", f"{stack}/users/{user_id}/posts", {"text": text}, token)
    assert status == 202, answer
    return str(answer["post_id"])


def api_filters(stack: str, user_id: str, token: str) -> list[dict[str, Any]]:
    status, page = request_json("GET", f"{stack}/users/{user_id}/filters", token=token)
    assert status == 200, page
    assert page["continuation"] is None
    return list(page["items"])


def shown_filters(page: Page) -> list[dict[str, str]]:
    """The settings view's filters, top to bottom: id, phrase and the end shown."""
    return list(
        page.driver.execute_script(
            """return Array.from(document.querySelectorAll('#filter-list li')).map((li) => ({
                filter_id: li.dataset.filterId,
                phrase: li.querySelector('.filter-phrase').textContent,
                end: li.querySelector('.filter-end').textContent.trim(),
            }))"""
        )
    )


def open_settings(page: Page) -> None:
    page.click("settings-link")
    page.wait(lambda: page.visible("settings-view"), what="the settings view")
    page.wait(lambda: page.visible("filter-empty") or shown_filters(page), what="the filters")
    assert not page.visible("timeline")


def go_home(page: Page) -> None:
    page.click("home-link")
    page.wait(lambda: page.visible("timeline"), what="the home timeline")
    assert not page.visible("settings-view")


def add_filter(page: Page, phrase: str, duration: str = "until I remove it") -> None:
    page.hide("settings-message")
    page.fill("filter-phrase", phrase)
    Select(page.element("filter-for")).select_by_visible_text(duration)
    page.click("filter-submit")


def test_keyword_filters_in_settings(
    stack: str, browsers: Callable[[str], webdriver.Chrome]
) -> None:
    author_id, reader_id = unique("author"), unique("reader")
    author_token = register(stack, author_id)
    cat = api_post(stack, author_id, author_token, "the cat sat")
    dog = api_post(stack, author_id, author_token, "a dog ran")
    reader = Page(browsers("reader"), stack)
    reader.open()
    reader_token = reader.register(reader_id)
    reader.follow(author_id)
    both = {cat, dog}
    reader.wait(lambda: {p["post_id"] for p in reader.posts()} == both, what="both posts")

    open_settings(reader)
    assert reader.visible("filter-empty")
    add_filter(reader, "CAT")
    reader.wait_message("settings-message", "ok", "Filter added")
    [added] = api_filters(stack, reader_id, reader_token)
    assert (added["phrase"], added["expires_at"]) == ("CAT", None)
    assert shown_filters(reader) == [{"filter_id": added["filter_id"], "phrase": "CAT", "end": ""}]
    assert not reader.visible("filter-empty")
    go_home(reader)
    reader.wait(lambda: reader.texts() == ["a dog ran"], what="the cat post hidden")

    # a filter with an end: the page sends it an hour ahead and shows it
    open_settings(reader)
    before = datetime.now(UTC)
    add_filter(reader, "ran", "1 hour")
    reader.wait_message("settings-message", "ok", "Filter added")
    # the list comes by filter id (a random free slot), not by age: find it by its phrase
    [ending] = [f for f in api_filters(stack, reader_id, reader_token) if f["phrase"] == "ran"]
    end = datetime.fromisoformat(ending["expires_at"])
    assert before + timedelta(minutes=59) < end < datetime.now(UTC) + timedelta(minutes=61)
    reader.wait(lambda: len(shown_filters(reader)) == 2, what="the second filter listed")
    shown = {f["phrase"]: f["end"] for f in shown_filters(reader)}
    assert shown["CAT"] == ""
    assert shown["ran"].startswith("until ")
    go_home(reader)
    reader.wait(
        lambda: reader.texts() == [] and reader.visible("timeline-empty"), what="both hidden"
    )

    # removing them: each post is back at once
    open_settings(reader)
    reader.wait(lambda: len(shown_filters(reader)) == 2, what="both filters listed again")
    remove = f'#filter-list li[data-filter-id="{ending["filter_id"]}"] button'
    reader.driver.find_element(By.CSS_SELECTOR, remove).click()
    reader.wait_message("settings-message", "ok", "removed")
    assert [f["phrase"] for f in shown_filters(reader)] == ["CAT"]
    go_home(reader)
    reader.wait(lambda: reader.texts() == ["a dog ran"], what="the dog post back")
    open_settings(reader)
    reader.hide("settings-message")
    remove = f'#filter-list li[data-filter-id="{added["filter_id"]}"] button'
    reader.driver.find_element(By.CSS_SELECTOR, remove).click()
    reader.wait_message("settings-message", "ok", "removed")
    assert reader.visible("filter-empty")
    assert api_filters(stack, reader_id, reader_token) == []
    go_home(reader)
    reader.wait(lambda: {p["post_id"] for p in reader.posts()} == both, what="the cat post back")

    # a blank phrase: the API's own error, and nothing added
    open_settings(reader)
    add_filter(reader, "   ")
    path = f"/users/{reader_id}/filters"
    error = shows_the_api_error(
        reader, "settings-message", "POST", path, {"phrase": ""}, reader_token
    )
    assert error["code"] == "invalid_phrase"
    assert shown_filters(reader) == []
    assert api_filters(stack, reader_id, reader_token) == []
    assert reader.script_errors() == []
    assert server_errors(stack) == 0
