"""The web client at ``/`` in real headless Chromium against the whole stack: posts
reach an open page live, without a reload.

Two browsers (two profiles, so two localStorages) register two users in the page; one
follows the other, who posts, and the post appears on the follower's page live, without a
reload, also after a lost connection. A follow's backfill appears in its place; the page's
event-stream parser copes with any chunking. Every wait polls with ``WebDriverWait``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from selenium import webdriver

from tests.conftest import unique
from tests.e2e.conftest import STREAM_LOOKBACK_S, request_json, server_errors
from tests.e2e.page import Page, timeline_ids

pytestmark = pytest.mark.e2e

XSS = '<img src=x onerror="window.__pwned=1">'
"""A post text that would run script if the page rendered text as HTML."""
SCREENSHOT = "web-client.png"


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
    reader.wait(lambda: len(timeline_ids(stack, reader_id, token)) == 1, what="own post stored")
    reader.reload()  # a page opened on a timeline that has something: its stream has a position
    reader.wait(lambda: reader.texts() == ["my own post"], what="the first page")
    reader.wait(lambda: reader.live_state() == "live", what="the live connection")
    reader.follow(author)
    reader.wait(
        lambda: reader.texts() == ["my own post", XSS, "an older post"],
        what="the followed author's posts on the open page, in timeline order",
    )
    assert reader.driver.execute_script("return window.__pwned === undefined")
