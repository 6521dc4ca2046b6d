"""The completion of one unit of work's writes, however many the writer batches them into."""

from __future__ import annotations

import asyncio


class Tracker:
    """Counts the outstanding writes of one unit of work (one message's share of a fan-out).

    It resolves only once its producer has said it is done adding (``wait``) and every write
    added has committed: early rows may commit while later ones are still being added."""

    def __init__(self) -> None:
        self._pending = 0
        self._sealed = False
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def add(self) -> None:
        self._pending += 1

    def settle(self, error: BaseException | None = None) -> None:
        if self._done.done():
            return
        if error is not None:
            self._done.set_exception(error)
            return
        self._pending -= 1
        self._resolve_if_complete()

    async def wait(self) -> None:
        """Seal the tracker (nothing more will be added), then return when every write has
        committed; raise the first failure."""
        self._sealed = True
        self._resolve_if_complete()
        await self._done

    def _resolve_if_complete(self) -> None:
        if self._sealed and self._pending == 0 and not self._done.done():
            self._done.set_result(None)
