"""Which work goes first when the worker is busy: user-facing before background.

A message's priority travels with the task that handles it (a context variable, copied into
every task it starts), so the writer's lanes and the storage limiter see it without every
call passing it along. Anything that never set one (the API, tools) is ``HIGH``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from enum import IntEnum


class Priority(IntEnum):
    HIGH = 0
    """Every page of a post's fan-out, a delete's first page, an unfollow's first purge:
    someone is waiting."""
    LOW = 1
    """Backfills, a delete's later pages, second passes, regrades: nobody watches them."""


_CURRENT: ContextVar[Priority] = ContextVar("priority", default=Priority.HIGH)


def current() -> Priority:
    return _CURRENT.get()


@contextlib.contextmanager
def running_as(priority: Priority) -> Iterator[None]:
    """Run the block (and every task it starts) at ``priority``."""
    token = _CURRENT.set(priority)
    try:
        yield
    finally:
        _CURRENT.reset(token)
