"""The time an API write's message stays hidden (``Settings.hidden_message_s``): the whole
argument of write-then-release rests on it outlasting every call of the write."""

from __future__ import annotations

import pytest

from timeline.config import Settings
from timeline.errors import ConfigurationError


def test_the_default_outlasts_the_write_deadline_one_call_and_azures_30_s() -> None:
    settings = Settings(storage_timeout_s=5.0)
    assert settings.api_write_deadline_s() == 25.0
    assert settings.hidden_message_s() == 25 + 5 + 30


def test_a_hidden_time_within_the_deadline_and_one_call_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="must exceed"):
        Settings(storage_timeout_s=5.0, api_hidden_message_s=30).hidden_message_s()
    assert Settings(storage_timeout_s=5.0, api_hidden_message_s=31).hidden_message_s() == 31


def test_a_queue_hides_a_message_seven_days_at_most() -> None:
    with pytest.raises(ConfigurationError, match="7 days"):
        Settings(storage_timeout_s=120_000.0).hidden_message_s()
