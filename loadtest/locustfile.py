"""Timeline users: mostly reading (as on every timeline service), sometimes posting and
following. Tokens come from ``loadtest/results/tokens.json``, written by ``loadtest.seed``,
with ``hybrid.json`` beside it: readers who follow large authors report their timeline reads
as merged, so their latency shows next to plain reads; the probe's full-page readers are left
out. With ``TIMELINE_LOADTEST_REQUEST_LOG``
set, every request's start time, name and response time are written there as CSV when
Locust quits (``loadtest.run`` lines them up with its probe's reads and the worker's
activity)."""

from __future__ import annotations

import csv
import json
import os
import random
from pathlib import Path
from typing import Any

from locust import FastHttpUser, between, events, task

_TOKENS_FILE = Path(os.environ.get("TIMELINE_LOADTEST_TOKENS", "loadtest/results/tokens.json"))
TOKENS: dict[str, str] = json.loads(_TOKENS_FILE.read_text())
_HYBRID_FILE = _TOKENS_FILE.with_name("hybrid.json")
_HYBRID: dict[str, list[str]] = (
    json.loads(_HYBRID_FILE.read_text()) if _HYBRID_FILE.exists() else {}
)
MERGED_READERS = set(_HYBRID.get("merged_readers", []))
USERS = sorted(set(TOKENS) - set(_HYBRID.get("full_readers", [])))
"""Everyone but the probe's full-page readers, so Locust's reads stay the seeded graph's."""

_REQUEST_LOG = os.environ.get("TIMELINE_LOADTEST_REQUEST_LOG")
_requests: list[tuple[float, str, float]] = []


@events.request.add_listener  # type: ignore[untyped-decorator]
def _record(name: str, response_time: float, start_time: float, **_: Any) -> None:
    _requests.append((start_time, name, response_time))


@events.quitting.add_listener  # type: ignore[untyped-decorator]
def _write_log(**_: Any) -> None:
    if _REQUEST_LOG:
        with open(_REQUEST_LOG, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["start", "name", "ms"])
            writer.writerows(_requests)


class TimelineUser(FastHttpUser):
    wait_time = between(0.5, 2.0)

    def on_start(self) -> None:
        self.me = random.choice(USERS)
        self.headers = {"Authorization": f"Bearer {TOKENS[self.me]}"}
        self.continuation: str | None = None
        self.kind = "timeline (merged)" if self.me in MERGED_READERS else "timeline"

    @task(10)
    def home_timeline(self) -> None:
        with self.client.get(
            f"/users/{self.me}/timeline", headers=self.headers, name=f"read: {self.kind}",
            catch_response=True,
        ) as response:  # fmt: skip
            if response.status_code == 200:
                self.continuation = response.json()["continuation"]

    @task(3)
    def next_page(self) -> None:
        if not self.continuation:
            return
        self.client.get(
            f"/users/{self.me}/timeline", params={"continuation": self.continuation},
            headers=self.headers, name=f"read: {self.kind} next page",
        )  # fmt: skip
        self.continuation = None

    @task(3)
    def profile(self) -> None:
        self.client.get(f"/users/{random.choice(USERS)}", name="read: profile")

    @task(3)
    def their_posts(self) -> None:
        # popular accounts are read more often: bias towards low user numbers
        author = USERS[min(len(USERS) - 1, int(random.paretovariate(1.2)) - 1)]
        self.client.get(f"/users/{author}/posts", params={"limit": "50"}, name="read: posts")

    @task(2)
    def post(self) -> None:
        self.client.post(
            f"/users/{self.me}/posts", json={"text": f"load test post {random.random()}"},
            headers=self.headers, name="write: post",
        )  # fmt: skip

    @task(1)
    def follow(self) -> None:
        target = random.choice(USERS)
        if target != self.me:
            self.client.put(
                f"/users/{self.me}/following/{target}", headers=self.headers, name="write: follow"
            )

    @task(1)
    def unfollow(self) -> None:
        self.client.delete(
            f"/users/{self.me}/following/{random.choice(USERS)}", headers=self.headers,
            name="write: unfollow",
        )  # fmt: skip
