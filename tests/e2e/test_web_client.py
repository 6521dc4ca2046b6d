"""The web client at ``/`` in real headless Chromium against the whole stack.

Two browsers (two profiles, so two localStorages) register two users in the page; one
follows the other, who posts, and the post appears on the follower's page live, without a
reload. Paging ("Load more"), a reload that stays signed in, deleting one's own post,
signing in with a pasted token, signing out, and API errors shown for bad input are covered
too. Every wait polls with ``WebDriverWait``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.conftest import unique
from tests.e2e.conftest import (
    PAGE_SIZE,
    STREAM_LOOKBACK_S,
    browser_log,
    request_json,
    server_errors,
)

pytestmark = pytest.mark.e2e

TIMEOUT_S = 30.0
XSS = '<img src=x onerror="window.__pwned=1">'
"""A post text that would run script if the page rendered text as HTML."""
SCREENSHOT = "web-client.png"


class Page:
    """One browser on the web client, by the ids of the page's elements."""

    def __init__(self, driver: webdriver.Chrome, base: str) -> None:
        self.driver = driver
        self.base = base

    def open(self) -> None:
        self.driver.get(f"{self.base}/")
        self.wait(lambda: self.ready(), what="the page to load")

    def reload(self) -> None:
        self.driver.refresh()
        self.wait(lambda: self.ready(), what="the page to reload")

    def ready(self) -> bool:
        return bool(
            self.driver.execute_script(
                "return document.readyState === 'complete'"
                " && !document.getElementById('timeline').hasAttribute('aria-busy')"
            )
        )

    def wait(self, condition: Callable[[], Any], *, what: str, timeout_s: float = TIMEOUT_S) -> Any:
        return WebDriverWait(self.driver, timeout_s, poll_frequency=0.1).until(
            lambda _driver: condition(), message=f"timed out waiting for {what}"
        )

    def element(self, element_id: str) -> Any:
        return self.driver.find_element(By.ID, element_id)

    def fill(self, element_id: str, text: str) -> None:
        field = self.element(element_id)
        field.clear()
        if text:
            field.send_keys(text)

    def click(self, element_id: str) -> None:
        self.element(element_id).click()

    def visible(self, element_id: str) -> bool:
        return bool(self.element(element_id).is_displayed())

    def text(self, element_id: str) -> str:
        return str(self.element(element_id).text)

    def message(self, element_id: str) -> tuple[str | None, str]:
        """A message area's kind ("error", "ok", "info") and text; (None, "") when hidden."""
        element = self.element(element_id)
        if not element.is_displayed():
            return None, ""
        return element.get_attribute("data-kind"), str(element.text)

    def wait_message(self, element_id: str, kind: str, containing: str = "") -> str:
        def shown() -> str | None:
            shown_kind, text = self.message(element_id)
            return text if shown_kind == kind and containing in text else None

        return str(self.wait(shown, what=f"a {kind} message {containing!r} in #{element_id}"))

    def hide(self, element_id: str) -> None:
        """Hide a message area, so the next message there is surely a new one."""
        self.driver.execute_script(f"document.getElementById('{element_id}').hidden = true")

    def signed_in_as(self) -> str | None:
        return self.text("current-user").removeprefix("@") if self.visible("whoami") else None

    def register(self, user_id: str, display_name: str = "") -> str:
        """Register in the page; the new token (as the page shows it)."""
        self.fill("register-user-id", user_id)
        self.fill("register-display-name", display_name)
        self.click("register-submit")
        self.wait(lambda: self.signed_in_as() == user_id, what=f"{user_id} signed in")
        return str(self.element("current-token").get_attribute("value"))

    def post(self, text: str) -> None:
        before = len(self.posts())
        self.fill("compose-text", text)
        self.click("compose-submit")
        self.wait_message("compose-message", "ok", "Posted")
        self.wait(lambda: len(self.posts()) > before, what="the new post on the author's page")

    def follow(self, target: str) -> None:
        self.fill("follow-target", target)
        self.click("follow-submit")
        self.wait_message("follow-message", "ok", f"Following @{target}")
        self.wait(
            lambda: self.driver.find_elements(
                By.CSS_SELECTOR, f'#following-list li[data-user-id="{target}"]'
            ),
            what=f"{target} in the following list",
        )

    def posts(self) -> list[dict[str, Any]]:
        """The timeline as shown, top to bottom."""
        return list(
            self.driver.execute_script(
                """return Array.from(document.querySelectorAll('#timeline-list li.post'))
                .map((li) => ({
                    post_id: li.dataset.postId,
                    author: li.querySelector('.post-author').textContent.replace(/^@/, ''),
                    text: li.querySelector('.post-text').textContent,
                    time: li.querySelector('.post-time').textContent,
                    own: !li.querySelector('.post-delete').hidden,
                }))"""
            )
        )

    def texts(self) -> list[str]:
        return [post["text"] for post in self.posts()]

    def delete(self, post_id: str) -> None:
        self.driver.find_element(
            By.CSS_SELECTOR, f'#timeline-list li[data-post-id="{post_id}"] .post-delete'
        ).click()

    def live_state(self) -> str:
        return str(self.element("live-status").get_attribute("data-state"))

    def load_all(self) -> None:
        """Click "Load more" until the timeline's end."""
        for _ in range(10):
            if not self.visible("load-more"):
                return
            count = len(self.posts())
            self.click("load-more")

            def more_or_end(count: int = count) -> bool:
                return len(self.posts()) > count or not self.visible("load-more")

            self.wait(more_or_end, what="the next page")
        raise AssertionError("still more to load after 10 pages")

    def screenshot(self, path: Path) -> None:
        """A PNG of the whole page once at most the newest arrival is still highlighted."""
        self.wait(
            lambda: self.driver.execute_script(
                "return document.querySelectorAll('li.post.fresh').length <= 1"
                " && document.getAnimations().length === 0"
            ),
            what="the older arrivals' highlight to fade",
        )
        height = self.driver.execute_script(
            "return Math.ceil(document.querySelector('main').getBoundingClientRect().bottom)"
        )
        self.driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1280, "height": int(height), "deviceScaleFactor": 1, "mobile": False},
        )
        self.driver.save_screenshot(str(path))
        self.driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})

    def script_errors(self) -> list[str]:
        """Severe console entries other than the browser's note of each 4xx answer."""
        return [
            entry["message"]
            for entry in browser_log(self.driver)
            if entry["level"] == "SEVERE" and "Failed to load resource" not in entry["message"]
        ]


def _timeline_ids(base: str, user_id: str, token: str) -> list[str]:
    """The user's whole home timeline from the API, page by page."""
    ids: list[str] = []
    continuation: str | None = None
    for _ in range(50):
        query = f"?continuation={quote(continuation)}" if continuation else ""
        status, page = request_json("GET", f"{base}/users/{user_id}/timeline{query}", token=token)
        assert status == 200, page
        ids += [item["post_id"] for item in page["items"]]
        continuation = page["continuation"]
        if continuation is None:
            return ids
    raise AssertionError("timeline longer than 50 pages")


def _shows_the_api_error(
    page: Page, element_id: str, method: str, path: str, body: Any = None, token: str | None = None
) -> dict[str, str]:
    """The page's message for what it just sent matches what the API answers to it."""
    status, answer = request_json(method, f"{page.base}{path}", body, token)
    assert 400 <= status < 500, (status, answer)
    error = answer["error"]
    text = page.wait_message(element_id, "error", f"({error['code']})")
    assert error["message"].rstrip(".") in text
    return dict(error)


def test_a_post_arrives_live_on_a_followers_page(
    stack: str, browsers: Callable[[str], webdriver.Chrome], output_dir: Path
) -> None:
    alice_id, bob_id = unique("alice"), unique("bob")
    alice, bob = Page(browsers("alice"), stack), Page(browsers("bob"), stack)
    alice.open()
    bob.open()
    alice.register(alice_id, "Alice")
    bob.register(bob_id, "Bob")
    bob.wait_message("account-message", "ok", f"Welcome, @{bob_id}")
    assert bob.texts() == []

    bob.post("Hello, I'm Bob. Following Alice now.")
    bob.follow(alice_id)
    bob.wait(lambda: bob.live_state() == "live", what="bob's live connection")
    bob.driver.execute_script("window.e2eSamePage = true")

    first = f"Hello from Alice! ({secrets.token_hex(2)})"
    alice.post(first)
    bob.wait(lambda: first in bob.texts(), what="alice's post on bob's page")
    second = "A second post: it goes on top of the first."
    alice.post(second)
    bob.wait(lambda: bob.texts()[:2] == [second, first], what="the second post on top")

    # a lost connection: the page reconnects from the last event id; the entries the server
    # sends again are not shown twice
    bob.driver.execute_script("window.timelineClient.dropLiveConnection()")
    bob.wait(lambda: bob.live_state() != "live", what="bob's page to notice the lost stream")
    bob.wait(lambda: bob.live_state() == "live", what="bob's page to reconnect")
    third = "Third post, after Bob's page reconnected."
    alice.post(third)
    bob.wait(lambda: bob.texts()[:3] == [third, second, first], what="the third post on top")
    ids = [post["post_id"] for post in bob.posts()]
    assert len(ids) == len(set(ids)) == 4

    assert bob.driver.execute_script("return window.e2eSamePage === true"), "bob's page reloaded"
    shown = {post["text"]: post for post in bob.posts()}
    assert shown[first]["author"] == alice_id
    assert not shown[first]["own"]  # no delete button on someone else's post
    assert shown["Hello, I'm Bob. Following Alice now."]["own"]
    assert shown[first]["time"] == "just now"
    assert alice.texts()[:3] == [third, second, first]
    assert all(post["own"] for post in alice.posts())

    bob.wait(lambda: "1 following" in bob.text("profile-counts"), what="bob's counts")
    bob.screenshot(output_dir / SCREENSHOT)
    assert bob.script_errors() == []
    assert alice.script_errors() == []
    assert server_errors(stack) == 0


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
        lambda: len(_timeline_ids(stack, carol_id, token)) == len(texts),
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
        lambda: doomed["post_id"] not in _timeline_ids(stack, carol_id, token),
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


def test_bad_input_shows_the_api_error_and_tokens_sign_in_and_out(
    stack: str, browsers: Callable[[str], webdriver.Chrome]
) -> None:
    dave_id = unique("dave")
    dave = Page(browsers("dave"), stack)
    dave.open()

    dave.fill("register-user-id", "not valid!")
    dave.click("register-submit")
    _shows_the_api_error(dave, "account-message", "POST", "/users", {"user_id": "not valid!"})
    token = dave.register(dave_id, "Dave")

    dave.fill("compose-text", "   ")  # whitespace only: the API refuses it
    dave.click("compose-submit")
    _shows_the_api_error(
        dave, "compose-message", "POST", f"/users/{dave_id}/posts", {"text": "   "}, token
    )
    dave.hide("compose-message")
    dave.fill("compose-text", "x" * 281)
    assert dave.text("compose-count") == "-1"
    dave.click("compose-submit")
    _shows_the_api_error(
        dave, "compose-message", "POST", f"/users/{dave_id}/posts", {"text": "x" * 281}, token
    )

    for target in (unique("nobody"), dave_id, "a/b", "x" * 65):
        dave.hide("follow-message")
        dave.fill("follow-target", target)
        dave.click("follow-submit")
        _shows_the_api_error(
            dave, "follow-message", "PUT",
            f"/users/{dave_id}/following/{quote(target, safe='')}", None, token,
        )  # fmt: skip

    dave.click("sign-out")
    dave.wait(lambda: dave.visible("register-form"), what="the signed-out view")
    dave.reload()
    assert dave.signed_in_as() is None  # signing out forgot the token
    status, answer = request_json("GET", f"{stack}/users/{dave_id}/timeline", token=token)
    assert (status, answer["error"]["code"]) == (401, "revoked_token")  # ... and revoked it

    dave.hide("account-message")
    dave.fill("register-user-id", dave_id)
    dave.click("register-submit")
    _shows_the_api_error(dave, "account-message", "POST", "/users", {"user_id": dave_id})

    erin_id = unique("erin")
    status, erin = request_json("POST", f"{stack}/users", {"user_id": erin_id})
    assert status == 201, erin
    forged = f"{erin_id}.9999999999.{'A' * 43}"
    for user, refused in ((erin_id, forged), (dave_id, token)):  # forged; revoked (Dave's)
        dave.hide("account-message")
        dave.fill("token-value", refused)
        assert dave.element("token-user-id").get_attribute("value") == user
        dave.click("token-submit")
        _shows_the_api_error(
            dave, "account-message", "GET", f"/users/{user}/timeline?limit=1", None, refused
        )
    dave.fill("token-value", erin["token"])
    assert dave.element("token-user-id").get_attribute("value") == erin_id
    dave.click("token-submit")
    dave.wait(lambda: dave.signed_in_as() == erin_id, what="signed in with the token")
    dave.reload()
    assert dave.signed_in_as() == erin_id
    assert dave.script_errors() == []
    assert server_errors(stack) == 0


def test_the_event_stream_parser(stack: str, browsers: Callable[[str], webdriver.Chrome]) -> None:
    """The page's SSE parser on chunks split anywhere (inside a field, between CR and LF),
    with comments, a retry field, multi-line data, an event without a type, and CRLF."""
    page = Page(browsers("parser"), stack)
    page.open()
    chunks = [
        "retry: 2000\n\n", ": heartbeat\n\n",
        'event: post\nid: a1\ndata: {"x"', ":1}\n\n",
        "event: post\r\nid: a2\r", "\ndata: line1\r\ndata:line2\r\n\r\n",
        "data: no type\n\nid", ": a3\nevent: post\ndata: {}\n", "\n", "data: unfinished\n",
    ]  # fmt: skip
    events = page.driver.execute_script(
        """const events = [];
        const parser = new window.timelineClient.SseParser((event) => events.push(event));
        for (const chunk of arguments[0]) parser.push(chunk);
        return events;""",
        chunks,
    )
    assert events == [
        {"type": "post", "id": "a1", "data": '{"x":1}'},
        {"type": "post", "id": "a2", "data": "line1\nline2"},
        {"type": "message", "id": "a2", "data": "no type"},
        {"type": "post", "id": "a3", "data": "{}"},
    ]


def test_a_followed_authors_existing_posts_appear_without_a_reload(
    stack: str, browsers: Callable[[str], webdriver.Chrome]
) -> None:
    """A follow's backfill lands below the newest post shown, older than the stream's
    look-back: the page still shows it in its place."""
    author = unique("author")
    status, body = request_json("POST", f"{stack}/users", {"user_id": author})
    assert status == 201
    for text in ("an older post", XSS):
        assert (
            request_json("POST", f"{stack}/users/{author}/posts", {"text": text}, body["token"])[0]
            == 202
        )
    posted = time.monotonic()

    reader_id = unique("reader")
    reader = Page(browsers("reader"), stack)
    reader.open()
    token = reader.register(reader_id)
    reader.wait(
        lambda: time.monotonic() - posted > 2 * STREAM_LOOKBACK_S,
        what="the author's posts to be older than the stream's look-back",
    )
    reader.post("my own post")
    reader.wait(lambda: len(_timeline_ids(stack, reader_id, token)) == 1, what="own post stored")
    reader.reload()  # a page opened on a timeline that has something: its stream has a position
    reader.wait(lambda: reader.texts() == ["my own post"], what="the first page")
    reader.wait(lambda: reader.live_state() == "live", what="the live connection")
    reader.follow(author)
    reader.wait(
        lambda: reader.texts() == ["my own post", XSS, "an older post"],
        what="the followed author's posts on the open page, in timeline order",
    )
    assert reader.driver.execute_script("return window.__pwned === undefined")
