"""Issue 22 in real headless Chromium: repost and undo, reply and a post's replies, mute
and block from a post, each checked against what the API then answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from tests.conftest import unique
from tests.e2e.conftest import request_json, server_errors
from tests.e2e.page import Page, timeline_ids

pytestmark = pytest.mark.e2e


def register(stack: str, user_id: str, name: str = "") -> str:
    body = {"user_id": user_id, **({"display_name": name} if name else {})}
    status, answer = request_json("POST", f"{stack}/users", body)
    assert status == 201, answer
    return str(answer["token"])


def api_post(stack: str, user_id: str, token: str, text: str, **extra: Any) -> str:
    status, answer = request_json(
        "POST", f"{stack}/users/{user_id}/posts", {"text": text, **extra}, token
    )
    assert status == 202, answer
    return str(answer["post_id"])


def api_follow(stack: str, user_id: str, token: str, target: str) -> None:
    status, answer = request_json("PUT", f"{stack}/users/{user_id}/following/{target}", None, token)
    assert status == 204, answer


def home(stack: str, user_id: str, token: str) -> list[dict[str, Any]]:
    status, page = request_json("GET", f"{stack}/users/{user_id}/timeline", token=token)
    assert status == 200, page
    return list(page["items"])


def shown(page: Page) -> list[dict[str, Any]]:
    """The timeline's entries as shown: id, author, reposter and the author's shown name."""
    return list(
        page.driver.execute_script(
            """return Array.from(document.querySelectorAll('#timeline-list li.post'))
            .map((li) => ({
                post_id: li.dataset.postId,
                author: li.dataset.author,
                reposted_by: li.querySelector('.post-repost').hidden
                    ? null : li.querySelector('.post-reposter').textContent.replace(/^@/, ''),
                name: li.querySelector('.post-name').textContent,
            }))"""
        )
    )


def test_repost_undo_reply_and_replies(
    stack: str, browsers: Callable[[str], webdriver.Chrome]
) -> None:
    alice_id, bob_id, carol_id = unique("alice"), unique("bob"), unique("carol")
    alice_token = register(stack, alice_id, "Alice A")
    carol_token = register(stack, carol_id)
    original = api_post(stack, alice_id, alice_token, "an original post")
    bob = Page(browsers("bob"), stack)
    bob.open()
    bob_token = bob.register(bob_id, "Bob B")
    api_follow(stack, bob_id, bob_token, alice_id)
    api_follow(stack, carol_id, carol_token, bob_id)  # carol sees bob's reposts, not alice
    bob.wait(lambda: original in timeline_ids(stack, bob_id, bob_token), what="the backfill")
    bob.reload()
    bob.wait(lambda: [p["post_id"] for p in shown(bob)] == [original], what="alice's post")
    bob.wait(lambda: shown(bob)[0]["name"] == "Alice A", what="alice's display name")

    plain = api_post(stack, bob_id, bob_token, "bob's own, newer than alice's")
    bob.wait(lambda: plain in [p["post_id"] for p in shown(bob)], what="bob's post live")
    repost = bob.in_post(original, ".post-actions .post-repost-button")
    assert repost.text == "Repost"
    repost.click()
    bob.wait(lambda: repost.text == "Undo repost", what="the repost to be made")
    bob.wait(
        lambda: (
            [(e["post_id"], e.get("reposted_by")) for e in home(stack, carol_id, carol_token)]
            == [(original, bob_id), (plain, None)]
        ),
        what="bob's repost in carol's timeline",
    )
    carol = Page(browsers("carol"), stack)
    carol.open()
    carol.driver.execute_script(
        "localStorage.setItem('timeline.session', JSON.stringify(arguments[0]))",
        {"user_id": carol_id, "token": carol_token},
    )
    carol.reload()
    carol.wait(
        lambda: (
            [(e["post_id"], e["reposted_by"]) for e in shown(carol)]
            == [(original, bob_id), (plain, None)]
        ),
        what="the repost on carol's page where it was reposted (on top), saying who reposted it",
    )

    repost.click()
    bob.wait(lambda: repost.text == "Repost", what="the repost undone")
    bob.wait(
        lambda: [e["post_id"] for e in home(stack, carol_id, carol_token)] == [plain],
        what="the repost gone from carol's",
    )

    bob.in_post(original, ".post-actions .post-reply-button").click()
    reply_text = bob.in_post(original, ".reply-form .reply-text")
    reply_text.send_keys("a reply from bob")
    bob.in_post(original, ".reply-form .reply-submit").click()
    bob.wait_message("timeline-message", "ok", f"Replied to @{alice_id}")
    replies = bob.in_post(original, ".replies")
    bob.wait(lambda: "a reply from bob" in replies.text, what="the reply under the post")
    status, page = request_json("GET", f"{stack}/users/{alice_id}/posts/{original}/replies")
    assert status == 200
    assert [item["text"] for item in page["items"]] == ["a reply from bob"]
    assert page["items"][0]["reply_to"] == {"author": alice_id, "post_id": original}

    # another reader opens the replies; a post without any says so
    carol.in_post(original, ".post-actions .post-replies-button").click()
    carol_replies = carol.in_post(original, ".replies")
    carol.wait(lambda: "a reply from bob" in carol_replies.text, what="the replies, expanded")
    lonely = api_post(stack, bob_id, bob_token, "nobody answers this")
    bob.wait(lambda: lonely in [p["post_id"] for p in shown(bob)], what="bob's new post live")
    bob.in_post(lonely, ".post-actions .post-replies-button").click()
    empty = bob.in_post(lonely, ".replies .replies-empty")
    bob.wait(lambda: empty.is_displayed(), what="'No replies yet.'")
    assert bob.script_errors() == []
    assert carol.script_errors() == []
    assert server_errors(stack) == 0


def test_mute_and_block_from_a_post(
    stack: str, browsers: Callable[[str], webdriver.Chrome]
) -> None:
    dana_id, erin_id, frank_id = unique("dana"), unique("erin"), unique("frank")
    erin_token = register(stack, erin_id)
    frank_token = register(stack, frank_id)
    dana = Page(browsers("dana"), stack)
    dana.open()
    dana_token = dana.register(dana_id)
    erin_post = api_post(stack, erin_id, erin_token, "erin speaks")
    frank_post = api_post(stack, frank_id, frank_token, "frank speaks")
    dana.follow(erin_id)
    dana.follow(frank_id)
    api_follow(stack, frank_id, frank_token, dana_id)
    both = {erin_post, frank_post}
    dana.wait(lambda: {p["post_id"] for p in shown(dana)} == both, what="both posts")

    def menu(post_id: str, action: str) -> None:
        dana.in_post(post_id, ".post-actions .post-more summary").click()
        dana.in_post(post_id, f".post-actions .post-more .{action}").click()

    menu(erin_post, "post-mute")
    dana.wait_message("timeline-message", "ok", f"Muted @{erin_id}")
    dana.wait(lambda: [p["post_id"] for p in shown(dana)] == [frank_post], what="erin hidden")
    assert [e["post_id"] for e in home(stack, dana_id, dana_token)] == [frank_post]

    # unmute on erin's profile page: her post is back at once
    dana.driver.get(f"{stack}/#/u/{erin_id}")
    dana.wait(lambda: dana.element("profile-mute").text == "Unmute", what="the mute shown")
    dana.click("profile-mute")
    dana.wait_message("profile-message", "ok", f"Unmuted @{erin_id}")
    dana.click("home-link")
    dana.wait(lambda: {p["post_id"] for p in shown(dana)} == both, what="erin's post back")

    dana.hide("timeline-message")
    menu(frank_post, "post-block")
    dana.wait_message("timeline-message", "ok", f"Blocked @{frank_id}")
    dana.wait(lambda: [p["post_id"] for p in shown(dana)] == [erin_post], what="frank hidden")
    dana.wait(
        lambda: (
            not dana.driver.find_elements(
                By.CSS_SELECTOR, f'#following-list li[data-user-id="{frank_id}"]'
            )
        ),
        what="frank gone from the following list",
    )
    status, answer = request_json(
        "PUT", f"{stack}/users/{frank_id}/following/{dana_id}", None, frank_token
    )
    assert (status, answer["error"]["code"]) == (403, "blocked")
    dana.reload()
    dana.wait(lambda: [p["post_id"] for p in shown(dana)] == [erin_post], what="still hidden")
    assert dana.script_errors() == []
    assert server_errors(stack) == 0
