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


HOLD_MARKER_PUT = """
(() => {
  // Holds this page's first marker PUT until the test releases it, and counts the requests
  // in flight (the stream aside) until each one's body is read and what it led to started.
  const real = window.fetch.bind(window);
  const state = { held: false, open: 0, conflicts: 0 };
  const gate = new Promise((resolve) => { state.release = resolve; });
  window.__markerTest = state;
  const settled = () => setTimeout(() => { state.open -= 1; }, 0);
  window.fetch = async (input, init = {}) => {
    const url = String(input);
    if (url.includes("/timeline/stream")) return real(input, init);
    state.open += 1;
    try {
      if ((init.method || "GET") === "PUT" && url.includes("/markers/home") && !state.held) {
        state.held = true;
        await gate;
      }
      const response = await real(input, init);
      if (response.status === 409) state.conflicts += 1;
      for (const name of ["json", "text"]) {
        const read = response[name].bind(response);
        response[name] = async () => { try { return await read(); } finally { settled(); } };
      }
      return response;
    } catch (error) {
      settled();
      throw error;
    }
  };
})();
"""


def test_a_conflict_never_moves_the_marker_back(
    stack: str, browsers: Callable[[str], webdriver.Chrome]
) -> None:
    """The page's marker write loses to another device's newer one (409): it keeps that
    marker rather than writing its own, older, position over it."""
    erin_id = unique("erin")
    erin = Page(browsers("erin"), stack)
    erin.open()
    token = erin.register(erin_id)
    erin.post("seen")
    erin.wait(lambda: len(timeline_ids(stack, erin_id, token)) == 1, what="the post delivered")
    erin.reload()
    erin.wait(lambda: _marker(stack, erin_id, token)["version"] == 1, what="the first marker")

    status, _ = request_json("POST", f"{stack}/users/{erin_id}/posts", {"text": "mid"}, token)
    assert status == 202
    erin.wait(lambda: len(timeline_ids(stack, erin_id, token)) == 2, what="'mid' delivered")
    erin.driver.execute_cdp_cmd(
        "Page.addScriptToEvaluateOnNewDocument", {"source": HOLD_MARKER_PUT}
    )
    erin.reload()  # the page's newest is 'mid'; its marker write waits
    state = "return window.__markerTest"
    erin.wait(lambda: erin.driver.execute_script(state)["held"], what="the page's marker PUT")

    status, _ = request_json("POST", f"{stack}/users/{erin_id}/posts", {"text": "new"}, token)
    assert status == 202
    erin.wait(lambda: len(timeline_ids(stack, erin_id, token)) == 3, what="'new' delivered")
    newest = _newest(stack, erin_id, token)
    body = {"position": newest, "version": 1}
    status, answer = request_json(  # another device, which has read 'new', writes first
        "PUT", f"{stack}/users/{erin_id}/markers/home", body, token
    )
    assert (status, answer) == (200, {"position": newest, "version": 2})

    erin.driver.execute_script("window.__markerTest.release()")
    erin.wait(
        lambda: erin.driver.execute_script(
            "const s = window.__markerTest; return s.conflicts === 1 && s.open === 0"
        ),
        what="the page's 409 handled",
    )
    assert _marker(stack, erin_id, token) == {"position": newest, "version": 2}
    assert erin.script_errors() == []
    assert server_errors(stack) == 0
