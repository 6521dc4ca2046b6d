"""Fixtures of the API tests."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.helpers import Api


@pytest.fixture
def api(client: TestClient[Any, Any]) -> Api:
    """The test client, with the calls most tests make."""
    return Api(client)
