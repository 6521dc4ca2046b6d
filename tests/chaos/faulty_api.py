"""The API of the ``apikill`` chaos variant: the service's own API, except that it SIGKILLs
itself, with chance ``CHAOS_API_KILL_CHANCE``, between a write and its message's release
(``timeline.service.outbox``). Test code only: no deployment can switch this on."""

from __future__ import annotations

import os
import random
import signal

from api.main import main
from timeline.service import outbox
from timeline.storage.queue import Reservation

CHANCE = float(os.environ.get("CHAOS_API_KILL_CHANCE", "0"))
_release = outbox.Outbox._release


async def _release_or_die(self: outbox.Outbox, reservation: Reservation) -> None:
    if random.random() < CHANCE:
        os.kill(os.getpid(), signal.SIGKILL)
    await _release(self, reservation)


if __name__ == "__main__":
    outbox.Outbox._release = _release_or_die  # type: ignore[method-assign]
    main()
