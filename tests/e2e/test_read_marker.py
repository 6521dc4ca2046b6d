"""The read marker in real headless Chromium: the first page moves the marker to its newest
post, and the next visit shows "You were here" above that post, below what came since."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from selenium import webdriver

from tests.conftest import unique
from tests.e2e.conftest import request_json, server_errors
from tests.e2e.page import Page, timeline_ids

pytestmark = pytest.mark.e2e


def _marker(stack: str, user: str, token: str) -> dict[str, Any]:
    status, body = request_json("GET", f"{stack}/users/{user}/markers/home", token=token)
    assert status == 200, body
    marker: dict[str, Any] = body
    return marker


def _newest(stack: str, user: str, token: str) -> str:
    status, page = request_json("GET", f"{stack}/users/{user}/timeline", token=token)
    assert status == 200, page
    return str(page["newest"])


def _line_above(page: Page) -> str | None:
    """The text of the post the "You were here" line sits in (None: no line)."""
    return page.driver.execute_script(  # type: ignore[no-any-return]
        """const line = document.getElementById('you-were-here');
        return line ? line.closest('li.post').querySelector('.post-text').textContent : null;"""
    )


def test_you_were_here(stack: str, browsers: Callable[[str], webdriver.Chrome]) -> None:
    dana_id = unique("dana")
    dana = Page(browsers("dana"), stack)
    dana.open()
    token = dana.register(dana_id)
    for text in ("seen 1", "seen 2"):
        dana.post(text)
    dana.wait(lambda: len(timeline_ids(stack, dana_id, token)) == 2, what="both posts delivered")
    dana.reload()
    dana.wait(lambda: _marker(stack, dana_id, token)["version"] == 1, what="the first marker")
    assert _marker(stack, dana_id, token)["position"] == _newest(stack, dana_id, token)
    assert _line_above(dana) is None, "nothing is new on a first visit"

    for text in ("new 1", "new 2", "new 3"):  # from another device, while the page is away
        status, _ = request_json("POST", f"{stack}/users/{dana_id}/posts", {"text": text}, token)
        assert status == 202
    dana.wait(lambda: len(timeline_ids(stack, dana_id, token)) == 5, what="new posts delivered")
    dana.reload()
    dana.wait(lambda: _line_above(dana) == "seen 2", what="'You were here' above 'seen 2'")
    assert dana.texts() == ["new 3", "new 2", "new 1", "seen 2", "seen 1"]
    dana.wait(lambda: _marker(stack, dana_id, token)["version"] == 2, what="the marker moved on")
    assert _marker(stack, dana_id, token)["position"] == _newest(stack, dana_id, token)
    assert dana.script_errors() == []
    assert server_errors(stack) == 0
