"""Shared set-up for the storage tests: a placement table one process cannot reach.

No fault at the HTTP transport (``tests/faults.py``) can stand in for it: a front would
hit every process behind it, and a process not behind it names a different account (an
account is named by its table endpoint), so the two could not share a placement; and the
placement is read on the control connections, which carry no ``trace_configs`` hooks.
"""

from __future__ import annotations

from typing import Any

from azure.core.exceptions import ServiceRequestError
from azure.data.tables.aio import TableClient


class UnreachableTable:
    """A table client whose every call fails as an unreachable account would (e.g. the
    placement table of a placement home this process cannot reach any more)."""

    def __init__(self, client: TableClient) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        if name == "close":
            return self._client.close

        def unreachable(*_args: Any, **_kwargs: Any) -> Any:
            raise ServiceRequestError("injected: the account is unreachable")

        return unreachable
