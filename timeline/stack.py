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
import time
import urllib.request
from http.client import HTTPException
from types import FrameType

from timeline.azurite import Azurite
from timeline.config import CONNECTION_FILE, Settings
from timeline.storage import Storage

log = logging.getLogger(__name__)

SERVICES = ("api", "fanout_worker")
API_READY_TIMEOUT_S = 60.0
_POLL_S = 0.1
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""Probes go straight to the local API, whatever ``http_proxy`` says."""


def api_base(host: str, port: int) -> str:
    """The API's base URL as reachable from this machine, also when it binds a wildcard."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def answers_ok(url: str) -> bool:
    """One GET: True on a 200; refused, reset, timed out, non-2xx or not HTTP are all False."""
    try:
        with _DIRECT.open(url, timeout=1.0) as response:
            return bool(response.status == 200)
    except (OSError, HTTPException):  # URLError and HTTPError are OSErrors
        return False


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
        asyncio.run(init_storage(connection_string, settings))
        for module in SERVICES:
            self._children.append(
                subprocess.Popen([sys.executable, "-m", module], env=env, start_new_session=True)  # noqa: S603
            )
        base = api_base(settings.host, settings.port)
        if not self._wait_for_api(base):
            return 0 if self._stop.is_set() else 1
        log.info("stack running: API %s", base)
        while not self._stop.wait(0.2):
            if self._child_died():
                return 1
        return 0

    def _child_died(self) -> bool:
        for child in self._children:
            if child.poll() is not None:
                log.error("%s exited with %s; stopping the stack", child.args, child.returncode)
                return True
        return False

    def _wait_for_api(self, base: str) -> bool:
        """Poll ``/healthz`` so that ``stack running`` means the README's first curl works."""
        deadline = time.monotonic() + API_READY_TIMEOUT_S
        while not self._stop.is_set() and not self._child_died():
            if answers_ok(f"{base}healthz"):
                return True
            if time.monotonic() > deadline:
                log.error(
                    "the API did not answer %shealthz within %.0fs", base, API_READY_TIMEOUT_S
                )
                return False
            self._stop.wait(_POLL_S)
        return False

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
