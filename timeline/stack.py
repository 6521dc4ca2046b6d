"""``make run``: embedded Azurite (unless storage is configured), then the API and one worker.

Children run in their own sessions so a terminal's Ctrl-C reaches only this supervisor, which
then stops the API and the worker first and Azurite last (it flushes its files on SIGTERM).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
from types import FrameType

from timeline.azurite import Azurite
from timeline.config import CONNECTION_FILE, Settings
from timeline.storage import Storage

log = logging.getLogger(__name__)

SERVICES = ("api", "fanout_worker")


async def init_storage(connection_string: str, settings: Settings) -> None:
    async with Storage(connection_string, settings.storage_options()) as storage:
        await storage.create_all()


class Stack:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._stop = threading.Event()
        self._children: list[subprocess.Popen[bytes]] = []
        self._azurite: Azurite | None = None

    def _request_stop(self, signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        self._stop.set()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._request_stop)
        signal.signal(signal.SIGINT, self._request_stop)
        try:
            return self._run()
        finally:
            self._shutdown()

    def _run(self) -> int:
        settings = self._settings
        env = dict(os.environ)
        if settings.uses_embedded_azurite:
            self._azurite = Azurite(
                location=settings.data_dir / "azurite", ports=settings.azurite_ports
            )
            connection_string = self._azurite.start()
            env["TIMELINE_STORAGE_CONNECTION_STRING"] = connection_string
            self._publish(connection_string)
        else:
            connection_string = settings.connection_string()
        settings.secret_bytes()  # create it once, before two children race for it
        asyncio.run(init_storage(connection_string, settings))
        for module in SERVICES:
            self._children.append(
                subprocess.Popen([sys.executable, "-m", module], env=env, start_new_session=True)  # noqa: S603
            )
        log.info("stack running: API on http://%s:%s", settings.host, settings.port)
        while not self._stop.wait(0.2):
            for child in self._children:
                if child.poll() is not None:
                    log.error("%s exited with %s; stopping the stack", child.args, child.returncode)
                    return 1
        return 0

    def _publish(self, connection_string: str) -> None:
        path = self._settings.data_dir / CONNECTION_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(connection_string)

    def _shutdown(self) -> None:
        for child in self._children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        grace = self._settings.worker_shutdown_grace_s + 5
        for child in self._children:
            try:
                child.wait(grace)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if self._azurite is not None:
            (self._settings.data_dir / CONNECTION_FILE).unlink(missing_ok=True)
            self._azurite.stop()
