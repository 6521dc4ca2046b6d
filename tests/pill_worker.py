"""A real fan-out worker (``python -m tests.pill_worker``) that dies like a poison pill:
its processor ends the process with ``os._exit(137)`` (as an OOM kill would) whenever it
starts a message of the author named by ``PILL_AUTHOR``. Test code only."""

from __future__ import annotations

import os

from fanout_worker.main import main
from timeline.delivery.outcomes import Outcome
from timeline.delivery.processor import FanoutProcessor
from timeline.model.messages import FanoutMessage


def _install_pill(author: str) -> None:
    handle = FanoutProcessor.handle

    async def deadly(self: FanoutProcessor, message: FanoutMessage) -> Outcome:
        if getattr(message, "author", None) == author:
            os._exit(137)
        return await handle(self, message)

    FanoutProcessor.handle = deadly  # type: ignore[method-assign]


if __name__ == "__main__":
    _install_pill(os.environ["PILL_AUTHOR"])
    main()
