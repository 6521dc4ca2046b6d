"""Upgrading a deployment from before the background queues: its ``fanout-<k>`` queues exist
but no ``fanout-<k>-low``. docs/overload.md says a send or receive that finds one missing
creates it; the new worker must keep running and serve the queue once it exists."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from fanout_worker.worker import Worker
from tests.conftest import api_client, eventually, make_settings, running_worker, unique
from tests.helpers import Api
from timeline.config import Settings
from timeline.storage.accounts import Storage
from timeline.storage.azurite import Azurite

MISSING = "fanout-0-low did not exist"


async def _before_issue_18(settings: Settings) -> None:
    async with Storage(settings.connection_string(), settings.storage_options()) as storage:
        await storage.create_all()
        await storage.background_queue(0).delete_queue()


async def test_worker_survives_a_missing_low_queue(
    private_azurite: Azurite, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(private_azurite.connection_string, tmp_path, worker_receivers=8)
    await _before_issue_18(settings)
    caplog.set_level(logging.INFO, logger="timeline.storage.queue")
    worker = Worker(settings, settings.connection_string())
    task = asyncio.create_task(worker.async_run())
    try:
        await eventually(lambda: _logged(caplog), what="a receive on fanout-0-low")
        # Several background receivers share one list of lanes; one removes the missing lane
        # while another, past its loop check, indexes the now-empty list.
        done, _ = await asyncio.wait({task}, timeout=3)
        assert not done, f"the worker exited: {task.exception()!r}"
    finally:
        worker.stop()
        await asyncio.gather(task, return_exceptions=True)


async def test_backfill_after_upgrade_without_low_queue_is_delivered(
    private_azurite: Azurite, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(private_azurite.connection_string, tmp_path, worker_receivers=2)
    await _before_issue_18(settings)
    caplog.set_level(logging.INFO, logger="timeline.storage.queue")
    async with api_client(settings) as client, running_worker(settings):
        api = Api(client)
        author, follower = unique("a"), unique("f")
        author_token = await api.register(author)
        follower_token = await api.register(follower)
        post = await api.post(author, author_token, "posted before the follow")
        await eventually(lambda: _logged(caplog), what="a receive on fanout-0-low")
        await api.follow(follower, follower_token, author)  # sends the backfill: creates it

        async def backfilled() -> bool:
            page = await api.timeline(follower, follower_token)
            return any(item["post_id"] == post["post_id"] for item in page["items"])

        await eventually(backfilled, timeout_s=20, what="the backfill of the followed author")


async def _logged(caplog: pytest.LogCaptureFixture) -> bool:
    return MISSING in caplog.text
