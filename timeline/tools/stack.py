"""``make run``: embedded Azurites (unless storage is configured), then the APIs and workers.

``TIMELINE_EMBEDDED_ACCOUNTS`` Azurites, one storage account each, under ``data_dir/azurite``
(the first: the placement home) and ``data_dir/azurite-1`` ...; ``TIMELINE_API_PROCESSES``
API processes sharing one port (SO_REUSEPORT); ``TIMELINE_WORKERS`` fan-out workers.

Children run in their own sessions so a terminal's Ctrl-C reaches only this supervisor, which
then stops every API and worker first and the Azurites last (they flush their files on
SIGTERM), so no process is left talking to a storage that is gone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPException
from pathlib import Path
from types import FrameType

from timeline.config import CONNECTION_FILE, Settings
from timeline.errors import ConfigurationError
from timeline.startup import api_port_taken
from timeline.storage.accounts import Storage
from timeline.tools.azurite import HOST, Azurite, free_ports, remembered_ports
from timeline.tools.lock import StackLock

log = logging.getLogger(__name__)

API, WORKER = "api", "fanout_worker"
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


def port_taken(host: str, port: int) -> bool:
    """True when something already listens on ``host:port``. APIs that set SO_REUSEPORT would
    share such a port silently (another stack's APIs, say) instead of failing to bind."""
    try:
        addresses = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror:
        return False  # the API's own bind reports the bad host
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # ignore TIME_WAIT
            try:
                probe.bind(address)
            except OSError:
                return True
    return False


def azurite_location(settings: Settings, index: int) -> Path:
    """``data_dir/azurite`` for the first account (where a single Azurite always kept its
    data), ``data_dir/azurite-<index>`` for the others."""
    return settings.data_dir / ("azurite" if index == 0 else f"azurite-{index}")


def set_env(env: dict[str, str], name: str, value: str | None) -> None:
    """Set (or with None remove) ``name``, dropping any spelling of it in another case:
    settings names are case-insensitive, so a leftover ``timeline_x`` could win over ours."""
    for key in [key for key in env if key.upper() == name]:
        del env[key]
    if value is not None:
        env[name] = value


def _count(number: int, noun: str, plural: str = "s") -> str:
    return f"{number} {noun}{'' if number == 1 else plural}"


async def init_storage(connection_string: str, settings: Settings) -> None:
    async with Storage(connection_string, settings.storage_options()) as storage:
        await storage.create_all()


class Stack:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._stop = threading.Event()
        self._children: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._azurites: list[Azurite] = []
        self._metrics_ports: list[int] = []
        self._lock = StackLock(settings.data_dir)

    def _request_stop(self, signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        self._stop.set()

    def run(self) -> int:
        # SIGHUP: the terminal closed. Its default would end this supervisor alone and leave
        # the children (in sessions of their own) running.
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._request_stop)
        self._lock.acquire()  # before anything starts: a second stack here stops at once
        try:
            self._check_ports()
            return self._run()
        finally:
            self._shutdown()
            self._lock.release()

    def _run(self) -> int:
        settings = self._settings
        env = dict(os.environ)
        if settings.uses_embedded_azurite:
            connection_string = self._start_azurites()
            if self._stop.is_set():
                return 0
            set_env(env, "TIMELINE_STORAGE_CONNECTION_STRING", None)
            set_env(env, "TIMELINE_STORAGE_CONNECTION_STRINGS", connection_string)
            self._publish(connection_string)
        else:
            connection_string = settings.connection_string()
        asyncio.run(init_storage(connection_string, settings))
        self._start_services(env)
        self._lock.record_children(
            [pid for pid in (azurite.pid for azurite in self._azurites) if pid is not None]
            + [child.pid for _, child in self._children]
        )
        base = api_base(settings.host, settings.port)
        if not self._wait_for_api(base):
            return 0 if self._stop.is_set() else 1
        log.info("stack running: %s", self._summary(base, len(connection_string.split())))
        while not self._stop.wait(0.2):
            if self._child_died():
                return 1
        return 0

    def _check_ports(self) -> None:
        """Every port the stack will listen on is free, else one line naming it and the
        setting that moves it, before anything starts."""
        settings = self._settings
        if settings.worker_metrics_port is None:  # on by default: any free ports
            self._metrics_ports = list(free_ports(settings.workers))
        elif settings.worker_metrics_port:
            first = settings.worker_metrics_port
            if first + settings.workers - 1 > 65535:
                raise ConfigurationError(
                    f"worker i serves its metrics on TIMELINE_WORKER_METRICS_PORT + i: "
                    f"{first} + {settings.workers - 1} is past 65535: pick a lower port"
                )
            self._metrics_ports = [first + index for index in range(settings.workers)]
        if port_taken(settings.host, settings.port):
            raise api_port_taken(settings.host, settings.port)
        for index, port in enumerate(self._metrics_ports):
            if port_taken(settings.host, port):
                raise ConfigurationError(
                    f"worker {index}'s metrics port {settings.host}:{port} is already in use "
                    "by another program: stop it, or pick other ports with "
                    "TIMELINE_WORKER_METRICS_PORT (worker i uses it + i)"
                )
        if settings.uses_embedded_azurite:
            self._plan_azurites()

    def _plan_azurites(self) -> None:
        """The Azurites' folders and ports; each keeps the ports it served its data on
        before, so a taken one is an error here rather than a different account later. A new
        one binds free ports when it starts."""
        settings = self._settings
        locations = [azurite_location(settings, i) for i in range(settings.embedded_accounts)]
        wanted = [remembered_ports(location) for location in locations]
        wanted[0] = settings.azurite_ports or wanted[0]
        for location, ports in zip(locations, wanted, strict=True):
            taken = [port for port in ports or () if port_taken(HOST, port)]
            if taken:
                fix = "TIMELINE_AZURITE_PORTS" if location == locations[0] else "TIMELINE_DATA_DIR"
                raise ConfigurationError(
                    f"the embedded Azurite of {location} cannot start: port(s) "
                    f"{', '.join(map(str, taken))} on {HOST} are in use by another program: "
                    f"stop it, or use other ports with {fix}"
                )
            lock = (self._lock.fileno(),)  # held while any child lives (timeline.tools.lock)
            self._azurites.append(Azurite(location=location, ports=ports, pass_fds=lock))

    def _start_azurites(self) -> str:
        """Start the Azurites together; return their connection strings, one per line, in
        placement order."""
        fixed = [azurite for azurite in self._azurites if azurite.has_ports]
        free = [azurite for azurite in self._azurites if not azurite.has_ports]
        for together in (fixed, free):  # a new one's free ports are never a fixed one's
            if together:
                with ThreadPoolExecutor(len(together)) as pool:  # node starts slowly
                    list(pool.map(Azurite.start, together))  # raises the first failure
        return "\n".join(azurite.connection_string for azurite in self._azurites)

    def _start_services(self, env: dict[str, str]) -> None:
        settings = self._settings
        api_env = dict(env)
        set_env(api_env, "TIMELINE_API_PROCESSES", str(settings.api_processes))  # reuse_port
        for index in range(settings.api_processes):
            self._spawn(f"api {index}", API, api_env)
        for index in range(settings.workers):
            worker_env = dict(env)
            if self._metrics_ports:  # else 0 (any free port) stays 0 for every worker
                port = str(self._metrics_ports[index])
                set_env(worker_env, "TIMELINE_WORKER_METRICS_PORT", port)
            self._spawn(f"worker {index}", WORKER, worker_env)

    def _spawn(self, name: str, module: str, env: dict[str, str]) -> None:
        process = subprocess.Popen(  # noqa: S603 - this interpreter, a fixed module
            [sys.executable, "-m", module],
            env=env,
            start_new_session=True,
            pass_fds=(self._lock.fileno(),),  # the stack lock, held while any child lives
        )
        self._children.append((name, process))

    def _summary(self, base: str, accounts: int) -> str:
        """The ready line's contents: where the API, its docs page and the web client are, and
        how many of everything run."""
        settings = self._settings
        storage = "embedded Azurite" if settings.uses_embedded_azurite else "configured"
        summary = (
            f"API {base}  docs {base}docs  web client {base} "
            f"({_count(settings.api_processes, 'API process', 'es')}, "
            f"{_count(settings.workers, 'worker')}, "
            f"{_count(accounts, 'storage account')}, {storage})"
        )
        if self._metrics_ports:
            urls = [f"{api_base(settings.host, port)}metrics" for port in self._metrics_ports]
            summary += f"; worker metrics {' '.join(urls)}"
        return summary

    def _child_died(self) -> bool:
        for name, child in self._children:
            if child.poll() is not None:
                log.error(
                    "%s (pid %d) exited with %s; stopping the stack",
                    name, child.pid, child.returncode,
                )  # fmt: skip
                return True
        return False

    def _wait_for_api(self, base: str) -> bool:
        """Poll ``/healthz``, then every worker's ``/metrics``, so that ``stack running``
        means the README's first curl and every URL in that line work. One API process
        answering is enough: SO_REUSEPORT hands new connections only to processes that
        already listen."""
        settings = self._settings
        urls = [f"{base}healthz"]
        urls += [f"{api_base(settings.host, port)}metrics" for port in self._metrics_ports]
        deadline = time.monotonic() + API_READY_TIMEOUT_S
        while urls and not self._stop.is_set() and not self._child_died():
            if answers_ok(urls[0]):
                urls.pop(0)
                continue
            if time.monotonic() > deadline:
                log.error("%s did not answer within %.0fs", urls[0], API_READY_TIMEOUT_S)
                return False
            self._stop.wait(_POLL_S)
        return not urls

    def _publish(self, connection_strings: str) -> None:
        path = self._settings.data_dir / CONNECTION_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(connection_strings)

    def _shutdown(self) -> None:
        """Every API and worker first (all signalled at once, so their grace periods
        overlap), then the Azurites: nothing may still be using the storage they serve."""
        for _, child in self._children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        grace = self._settings.worker_shutdown_grace_s + 5
        for _, child in self._children:
            try:
                child.wait(grace)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if self._azurites:  # all of them, also any whose start failed
            (self._settings.data_dir / CONNECTION_FILE).unlink(missing_ok=True)
            with ThreadPoolExecutor(len(self._azurites)) as pool:
                list(pool.map(Azurite.stop, self._azurites))
