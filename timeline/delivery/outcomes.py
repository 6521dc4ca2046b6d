"""What handling a message leads to: the worker deletes it, rewrites it, or retries it."""

from __future__ import annotations

from dataclasses import dataclass

from timeline.model.messages import FanoutMessage


@dataclass(frozen=True, slots=True)
class Done:
    """Everything this message asked for is done: delete it."""


@dataclass(frozen=True, slots=True)
class Continue:
    """Rewrite the message as ``message`` and let it come back after ``delay_s``."""

    message: FanoutMessage
    delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Defer:
    """Not now: storage answered with a retryable error (unavailable, busy or contended);
    retry with backoff."""

    reason: str


Outcome = Done | Continue | Defer
DONE = Done()
