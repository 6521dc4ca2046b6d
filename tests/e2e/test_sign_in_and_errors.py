"""The web client in real headless Chromium: API errors shown for bad input, signing in
with a pasted token, signing out. Every wait polls with ``WebDriverWait``.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

import pytest
from selenium import webdriver

from tests.conftest import unique
from tests.e2e.conftest import request_json, server_errors
from tests.e2e.page import Page, shows_the_api_error

pytestmark = pytest.mark.e2e


def test_bad_input_shows_the_api_error_and_tokens_sign_in_and_out(
    stack: str, browsers: Callable[[str], webdriver.Chrome]
) -> None:
    dave_id = unique("dave")
    dave = Page(browsers("dave"), stack)
    dave.open()

    dave.fill("register-user-id", "not valid!")
    dave.click("register-submit")
    shows_the_api_error(dave, "account-message", "POST", "/users", {"user_id": "not valid!"})
    token = dave.register(dave_id, "Dave")

    dave.fill("compose-text", "   ")  # whitespace only: nothing to post
    assert not dave.element("compose-submit").is_enabled()
    dave.fill("compose-text", "x" * 281)  # past the limit: the form says so and refuses it
    assert dave.text("compose-count") == "-1"
    assert "over" in str(dave.element("compose-count").get_attribute("class"))
    assert not dave.element("compose-submit").is_enabled()
    dave.fill("compose-text", "x" * 280)
    assert dave.text("compose-count") == "0"
    assert dave.element("compose-submit").is_enabled()
    bidi = "a\u202eb"  # a bidi override: the form cannot know, the API refuses it
    dave.driver.execute_script(
        "const area = document.getElementById('compose-text'); area.value = arguments[0];"
        " area.dispatchEvent(new Event('input'));",
        bidi,
    )
    dave.click("compose-submit")
    shows_the_api_error(
        dave, "compose-message", "POST", f"/users/{dave_id}/posts", {"text": bidi}, token
    )

    for target in (unique("nobody"), dave_id, "a/b", "x" * 65):
        dave.hide("follow-message")
        dave.fill("follow-target", target)
        dave.click("follow-submit")
        shows_the_api_error(
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
    shows_the_api_error(dave, "account-message", "POST", "/users", {"user_id": dave_id})

    erin_id = unique("erin")
    status, erin = request_json("POST", f"{stack}/users", {"user_id": erin_id})
    assert status == 201, erin
    forged = f"{erin_id}.9999999999.{'A' * 43}"
    for user, refused in ((erin_id, forged), (dave_id, token)):  # forged; revoked (Dave's)
        dave.hide("account-message")
        dave.fill("token-value", refused)
        assert dave.element("token-user-id").get_attribute("value") == user
        dave.click("token-submit")
        shows_the_api_error(
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
