"""One stack per data folder: ``timeline run`` holds an exclusive lock on ``STACK_LOCK`` in
the folder while it runs, with its pid in the file. The lock is the kernel's (``flock``), so
a stack that was killed leaves no stale lock behind, only a file the next one takes over."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from timeline.errors import ConfigurationError

STACK_LOCK = "stack.pid"


class StackLock:
    """Held from before anything starts until the stack has stopped."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / STACK_LOCK
        self._handle: IO[str] | None = None

    def acquire(self) -> None:
        """Take the lock, or raise naming the stack that holds it and how to stop it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise ConfigurationError(
                f"a stack is already running in {self.path.parent} (pid {holder}): stop it "
                f"with Ctrl-C in its terminal or `kill {holder}`, or give this one another "
                "folder with TIMELINE_DATA_DIR"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._handle = handle

    def release(self) -> None:
        """Empty the pid file while still holding the lock, then let go (the file stays:
        removing it could let two stacks lock two different files)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.truncate(0)
            handle.close()
