"""Reposts and replies: ``storage`` and ``repos`` on an Azurite of each test's own.

These tests queue messages through the service and then run them by hand. On the session's
storage, the session's real worker (``tests.conftest.worker``, started by the flow tests)
would lease the same messages and run them beside the test, outside the interleaving under
test (a repost delivered after an undo's only pass, say)."""

from __future__ import annotations

import pytest

from timeline.storage.accounts import Storage
from timeline.tables.repositories import Repositories


@pytest.fixture
async def storage(own: Storage) -> Storage:
    return own


@pytest.fixture
def repos(storage: Storage) -> Repositories:
    return Repositories.on(storage)
