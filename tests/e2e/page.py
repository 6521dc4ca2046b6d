"""The web client as one browser sees it, by the ids of the page's elements, and the
API's view to compare it with."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.e2e.conftest import browser_log, request_json

TIMEOUT_S = 30.0


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

    def post(self, text: str, visibility: str | None = None) -> None:
        """Post from the compose box; ``visibility`` is the choice as shown ("Followers only")."""
        before = len(self.posts())
        self.fill("compose-text", text)
        if visibility is not None:
            Select(self.element("compose-visibility")).select_by_visible_text(visibility)
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

    def in_post(self, post_id: str, selector: str, within: str = "#timeline-list") -> Any:
        """An element of a shown post (not of a reply inside it)."""
        return self.driver.find_element(
            By.CSS_SELECTOR, f'{within} li[data-post-id="{post_id}"] > {selector}'
        )

    def delete(self, post_id: str) -> None:
        """Delete, and confirm when the post asks."""
        self.in_post(post_id, ".post-head .post-delete").click()
        self.wait(
            lambda: self.in_post(post_id, ".post-confirm").is_displayed(), what="the confirmation"
        )
        self.in_post(post_id, ".post-confirm .post-confirm-delete").click()

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


def timeline_ids(base: str, user_id: str, token: str) -> list[str]:
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


def shows_the_api_error(
    page: Page, element_id: str, method: str, path: str, body: Any = None, token: str | None = None
) -> dict[str, str]:
    """The page's message for what it just sent matches what the API answers to it."""
    status, answer = request_json(method, f"{page.base}{path}", body, token)
    assert 400 <= status < 500, (status, answer)
    error = answer["error"]
    text = page.wait_message(element_id, "error", f"({error['code']})")
    assert error["message"].rstrip(".") in text
    return dict(error)
