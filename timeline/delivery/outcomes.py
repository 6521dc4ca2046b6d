"""What handling a message leads to: the worker deletes it or rewrites it (a handler that
raises is the worker's to retry, ``fanout_worker.settling``)."""

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


Outcome = Done | Continue
DONE = Done()
