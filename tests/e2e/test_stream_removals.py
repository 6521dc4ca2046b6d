"""The web client takes posts away: a ``delete`` event removes a post from the page at once
(a delete, an unfollow's purge), and "Refresh" drops a post deleted while the page had no
live connection. Real headless Chromium against the whole stack."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.conftest import unique
from tests.e2e.conftest import request_json, server_errors

pytestmark = pytest.mark.e2e

TIMEOUT_S = 30.0


class Reader:
    """One browser showing a reader's timeline."""

    def __init__(self, driver: webdriver.Chrome, base: str) -> None:
        self.driver = driver
        self.base = base

    def wait(self, condition: Callable[[], Any], what: str) -> None:
        WebDriverWait(self.driver, TIMEOUT_S, poll_frequency=0.1).until(
            lambda _driver: condition(), message=f"timed out waiting for {what}"
        )

    def register(self, user_id: str) -> str:
        self.driver.get(f"{self.base}/")
        self.driver.find_element(By.ID, "register-user-id").send_keys(user_id)
        self.driver.find_element(By.ID, "register-submit").click()
        self.wait(lambda: self.live_state() == "live", f"{user_id}'s live connection")
        token = self.driver.find_element(By.ID, "current-token").get_attribute("value")
        return str(token)

    def live_state(self) -> str:
        return str(self.driver.find_element(By.ID, "live-status").get_attribute("data-state"))

    def shown(self) -> list[str]:
        return list(
            self.driver.execute_script(
                "return Array.from(document.querySelectorAll('#timeline-list li.post'))"
                ".map((li) => li.dataset.postId)"
            )
        )


def _api(stack: str, method: str, path: str, token: str, body: Any = None) -> Any:
    status, answer = request_json(method, f"{stack}{path}", body, token)
    assert status < 300, (status, answer)
    return answer


def test_deleted_and_unfollowed_posts_leave_the_page(
    stack: str, browsers: Callable[[str], webdriver.Chrome]
) -> None:
    reader_id, alice, carol = unique("reader"), unique("alice"), unique("carol")
    tokens = {
        user: request_json("POST", f"{stack}/users", {"user_id": user})[1]["token"]
        for user in (alice, carol)
    }
    page = Reader(browsers("reader"), stack)
    token = page.register(reader_id)
    for subject in (alice, carol):
        _api(stack, "PUT", f"/users/{reader_id}/following/{subject}", token)
    page.driver.execute_script("window.e2eSamePage = true")

    def post(author: str, text: str) -> str:
        return str(
            _api(stack, "POST", f"/users/{author}/posts", tokens[author], {"text": text})["post_id"]
        )

    doomed, kept, purged = post(alice, "doomed"), post(alice, "kept"), post(carol, "purged")
    page.wait(lambda: {doomed, kept, purged} <= set(page.shown()), "three posts, live")

    _api(stack, "DELETE", f"/users/{alice}/posts/{doomed}", tokens[alice])
    page.wait(lambda: doomed not in page.shown(), "the deleted post to leave the page")
    _api(stack, "DELETE", f"/users/{reader_id}/following/{carol}", token)
    page.wait(lambda: purged not in page.shown(), "the unfollowed author's post to leave")
    assert page.shown() == [kept]
    assert page.driver.execute_script("return window.e2eSamePage === true"), "the page reloaded"

    # no live connection: "Refresh" finds the post gone and takes it away
    late = post(alice, "deleted while the page was not listening")
    page.wait(lambda: late in page.shown(), "the next post, live")
    page.driver.execute_script("window.timelineClient.stopLiveUpdates()")
    _api(stack, "DELETE", f"/users/{alice}/posts/{late}", tokens[alice])

    def refreshed_without_it() -> bool:
        page.driver.find_element(By.ID, "refresh").click()
        return late not in page.shown()

    page.wait(refreshed_without_it, "Refresh to drop the deleted post")
    assert page.shown() == [kept]
    assert server_errors(stack) == 0


# The first-page reads a test holds: each GET of the timeline without ``since`` resolves
# only once ``window.e2eRelease()`` is called (its answer was read before that).
_HOLD_FIRST_PAGE = """
const real = window.fetch;
let release;
const released = new Promise((resolve) => { release = resolve; });
window.e2eRelease = release;
window.e2eHeld = 0;
window.fetch = async (path, options) => {
  const response = await real(path, options);
  const url = String(path);
  if (url.includes('/timeline') && !url.includes('since=') && !url.includes('/stream')) {
    window.e2eHeld += 1;
    await released;
  }
  return response;
};
"""


def test_a_post_deleted_during_a_refresh_stays_gone(
    stack: str, browsers: Callable[[str], webdriver.Chrome]
) -> None:
    """The refresh's first page was read before the delete: merging it must not bring back
    the post the ``delete`` event took away meanwhile."""
    reader_id, alice = unique("reader"), unique("alice")
    alice_token = request_json("POST", f"{stack}/users", {"user_id": alice})[1]["token"]
    page = Reader(browsers("reader"), stack)
    token = page.register(reader_id)
    _api(stack, "PUT", f"/users/{reader_id}/following/{alice}", token)
    made = _api(stack, "POST", f"/users/{alice}/posts", alice_token, {"text": "doomed"})
    doomed = str(made["post_id"])
    page.wait(lambda: doomed in page.shown(), "the post, live")

    page.driver.execute_script(_HOLD_FIRST_PAGE)
    page.driver.find_element(By.ID, "refresh").click()
    page.wait(lambda: page.driver.execute_script("return window.e2eHeld") >= 1, "the read")
    _api(stack, "DELETE", f"/users/{alice}/posts/{doomed}", alice_token)
    page.wait(lambda: doomed not in page.shown(), "the delete event")
    page.driver.execute_script("window.e2eRelease()")

    def refreshed() -> bool:
        message = page.driver.find_element(By.ID, "timeline-message").text
        return "new" in message or "Up to date" in message

    page.wait(refreshed, "the refresh to finish")
    assert doomed not in page.shown()
    assert server_errors(stack) == 0
