"""One stack per data folder: ``timeline run`` holds an exclusive lock on ``STACK_LOCK`` in
the folder while it runs, with its pid in the file (then its children's). The lock is the
kernel's (``flock``), so a stack that stopped leaves no stale lock behind, only a file the next
one takes over. The children inherit the locked descriptor: while an Azurite, API or worker of
a killed stack (SIGKILL) still runs, the folder stays locked and the message names them."""

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
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = self.path.open("a+")
        except OSError as error:
            raise ConfigurationError(
                f"cannot write the stack's lock in {self.path.parent} ({error.strerror}): "
                "give the stack a writable folder with TIMELINE_DATA_DIR"
            ) from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            lines = handle.read().splitlines()
            handle.close()
            raise ConfigurationError(self._held(lines)) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._handle = handle

    def _held(self, lines: list[str]) -> str:
        """Who holds the lock: the running stack, or the children its killed supervisor
        left behind."""
        folder, holder = self.path.parent, (lines[0].strip() if lines else "") or "unknown"
        children = lines[1].strip() if len(lines) > 1 else ""
        if holder.isdigit() and not _alive(int(holder)) and children:
            return (
                f"the processes of a stack whose supervisor (pid {holder}) was killed still "
                f"run in {folder} (pids {children}): stop them with `kill {children}`, or give "
                "this one another folder with TIMELINE_DATA_DIR"
            )
        return (
            f"a stack is already running in {folder} (pid {holder}): stop it with Ctrl-C in "
            f"its terminal or `kill {holder}`, or give this one another folder with "
            "TIMELINE_DATA_DIR"
        )

    def fileno(self) -> int:
        """The locked descriptor, for the children to inherit (``pass_fds``)."""
        assert self._handle is not None, "acquire() first"
        return self._handle.fileno()

    def record_children(self, pids: list[int]) -> None:
        """Add the children's pids (the second line), for the message above."""
        assert self._handle is not None, "acquire() first"
        self._handle.write(" ".join(map(str, pids)) + "\n")
        self._handle.flush()

    def release(self) -> None:
        """Empty the pid file while still holding the lock, then let go (the file stays:
        removing it could let two stacks lock two different files)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.truncate(0)
            handle.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
