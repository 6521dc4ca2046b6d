"""The embedded storage: the pinned Azurite from ``node_modules``, on loopback.

An Azurite started without ports asks the OS for free ones (port 0) and reads the ports it
got from its start-up lines, so no other program can take them between a pick and the bind.

A durable Azurite keeps the ports it was first given (``PORTS_FILE`` in its folder): storage
names an account by its endpoint in the stored placement, so on other ports the same data
would be refused as a different account.
"""

from __future__ import annotations

import logging
import re
import signal
import socket
import subprocess
import threading
from pathlib import Path

from timeline.errors import ConfigurationError

log = logging.getLogger(__name__)

ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
"""Azurite's fixed, public development key."""
HOST = "127.0.0.1"
LISTENING = re.compile(r"Azurite (Blob|Queue|Table) service is successfully listening at \S+:(\d+)")
"""Azurite's start-up line for each service, with the port it bound."""
SERVICES = ("Blob", "Queue", "Table")
PORTS_FILE = "timeline-ports"
"""``blob,queue,table``: the ports a durable Azurite served its data on, reused at restart."""


def connection_string(ports: tuple[int, int, int], scheme: str = "http") -> str:
    blob, queue, table = ports
    return (
        f"DefaultEndpointsProtocol={scheme};AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
        f"BlobEndpoint={scheme}://{HOST}:{blob}/{ACCOUNT};"
        f"QueueEndpoint={scheme}://{HOST}:{queue}/{ACCOUNT};"
        f"TableEndpoint={scheme}://{HOST}:{table}/{ACCOUNT};"
    )


def free_ports(count: int) -> tuple[int, ...]:
    """Ports the OS reports free on loopback right now."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return tuple(sock.getsockname()[1] for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()


def find_node_modules(package: str = "azurite") -> Path:
    """The ``node_modules`` holding ``package``: from the working directory up, then beside
    the code."""
    candidates = [Path.cwd(), Path(__file__).resolve().parents[2]]
    for base in candidates:
        for folder in (base, *base.parents):
            if (folder / "node_modules" / package).is_dir():
                return folder / "node_modules"
    if package != "azurite":
        raise ConfigurationError(f"{package} is not installed: run `npm ci` in the project")
    raise ConfigurationError(
        "Azurite is not installed: run `npm ci` in the project (`make run` does it) "
        "or set TIMELINE_STORAGE_CONNECTION_STRING"
    )


def remembered_ports(location: Path | None) -> tuple[int, int, int] | None:
    """The ports the Azurite under ``location`` last served on, if it was ever started."""
    if location is None or not (location / PORTS_FILE).is_file():
        return None
    blob, queue, table = (int(part) for part in (location / PORTS_FILE).read_text().split(","))
    return blob, queue, table


class Azurite:
    """One Azurite process: durable under ``location``, or in memory when it is None.

    Ports: ``ports`` if given, else the ones a durable Azurite served on before, else free
    ones picked now. With ``tls`` (certificate and key files) it serves HTTPS, and with
    ``oauth`` it also accepts Entra ID bearer tokens (checked loosely: ``--oauth basic``).
    """

    def __init__(
        self,
        *,
        location: Path | None,
        ports: tuple[int, int, int] | None = None,
        start_timeout_s: float = 30.0,
        tls: tuple[Path, Path] | None = None,
        oauth: bool = False,
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        self.location = location
        self.pass_fds = pass_fds
        """Descriptors Azurite inherits (``timeline run``'s stack lock)."""
        self.tls = tls
        self.oauth = oauth
        remembered = remembered_ports(location)
        if ports and remembered and ports != remembered:
            log.warning(
                "Azurite in %s served on ports %s before, now on %s: its stored placement "
                "names the old endpoints",
                location, remembered, ports,
            )  # fmt: skip
        self._ports = ports or remembered
        self._start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def has_ports(self) -> bool:
        """Whether the ports are known: fixed at construction, or bound by a start."""
        return self._ports is not None

    @property
    def ports(self) -> tuple[int, int, int]:
        """``blob, queue, table``: fixed at construction, or bound by the first start."""
        if self._ports is None:
            raise RuntimeError("this Azurite picks its ports when it first starts")
        return self._ports

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def connection_string(self) -> str:
        return connection_string(self.ports, self.scheme)

    def command(self) -> list[str]:
        modules = find_node_modules()
        local_node = modules / ".bin" / "node"
        node = str(local_node) if local_node.exists() else "node"
        blob, queue, table = self._ports or (0, 0, 0)
        storage = ["--location", str(self.location)] if self.location else ["--inMemoryPersistence"]
        if self.tls:
            storage += ["--cert", str(self.tls[0]), "--key", str(self.tls[1])]
        if self.oauth:
            storage += ["--oauth", "basic"]
        return [
            node,
            str(modules / "azurite" / "dist" / "src" / "azurite.js"),
            "--disableTelemetry",
            "--silent",
            "--skipApiVersionCheck",
            "--loose",
            *storage,
            "--blobHost", HOST, "--blobPort", str(blob),
            "--queueHost", HOST, "--queuePort", str(queue),
            "--tableHost", HOST, "--tablePort", str(table),
        ]  # fmt: skip

    def start(self) -> str:
        """Start Azurite and wait until it listens; return its connection string. Without
        ports it binds free ones; a restart reuses the ports of the first start."""
        if self.location is not None:
            self.location.mkdir(parents=True, exist_ok=True)
        self._process = subprocess.Popen(  # noqa: S603 - a fixed command line
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            start_new_session=True,
            pass_fds=self.pass_fds,
        )
        bound = _read_ports_in_background(self._process)
        if not bound.wait(self._start_timeout_s):
            self.stop()
            raise ConfigurationError("Azurite did not start listening in time")
        if bound.ports is None:
            code = self._process.wait()
            self._process = None
            raise ConfigurationError(
                f"Azurite for {self.location or 'memory'} exited at start (code {code}): "
                "its reason (a port in use, say) is on standard error"
            )
        self._ports = bound.ports
        if self.location is not None:
            (self.location / PORTS_FILE).write_text(",".join(map(str, self._ports)))
        log.info("Azurite listening on %s (blob, queue, table)", self._ports)
        return self.connection_string

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM (Azurite flushes its files), then SIGKILL if it does not exit in time."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def signal(self, signum: int) -> None:
        """Send ``signum`` (SIGSTOP and SIGCONT freeze and thaw the account, SIGKILL kills it:
        for fault tests)."""
        if self._process is not None:
            self._process.send_signal(signum)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None


class _BoundPorts(threading.Event):
    """Set once Azurite has said where each service listens (``ports``), or has exited
    without saying it (``ports`` None)."""

    ports: tuple[int, int, int] | None = None


def _read_ports_in_background(process: subprocess.Popen[bytes]) -> _BoundPorts:
    """Read Azurite's standard output on a thread to its end (so the pipe never fills), and
    set the event once every service has reported its port."""
    bound = _BoundPorts()

    def read() -> None:
        found: dict[str, int] = {}
        assert process.stdout is not None
        with process.stdout:
            for raw in process.stdout:
                match = LISTENING.search(raw.decode(errors="replace"))
                if match and not bound.is_set():
                    found[match.group(1)] = int(match.group(2))
                    if len(found) == len(SERVICES):
                        blob, queue, table = (found[service] for service in SERVICES)
                        bound.ports = (blob, queue, table)
                        bound.set()
        bound.set()

    threading.Thread(target=read, name=f"azurite-{process.pid}-stdout", daemon=True).start()
    return bound
