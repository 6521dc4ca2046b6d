"""Smoke test of the image: ``timeline init``, the API and a worker, each from the image,
against an Azurite started here (the project's pinned one); then a user posts, a follower
reads the post from the worker's copy, both health checks pass, and both stop on SIGTERM.

    .venv/bin/python deploy/container/smoke.py [--image localhost/timeline:dev] [--tool podman]

``--tool``: ``podman`` or ``docker`` (``run --network host``), or ``buildah`` (``run
--isolation chroot``: for hosts where the OCI runtime cannot start containers, e.g. inside an
unprivileged container). Exit status 0 when every step passed."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from timeline.tools.azurite import Azurite, free_ports

SECRET = "smoke-test-secret-not-for-production"  # noqa: S105 - a test secret


class Runner:
    """Starts the image's programs with one container tool, on the host's network."""

    def __init__(self, tool: str, image: str, env: dict[str, str]) -> None:
        self.tool, self.image, self.env = tool, image, env
        self.started: list[tuple[subprocess.Popen[bytes], str | None]] = []

    def _env_args(self) -> list[str]:
        return [arg for name, value in self.env.items() for arg in ("-e", f"{name}={value}")]

    def command(self, program: list[str], name: str) -> tuple[list[str], str | None]:
        """The command line that runs ``program`` in the image; the container it makes
        (buildah: its working container, removed at the end)."""
        if self.tool == "buildah":
            container = subprocess.run(  # noqa: S603 - fixed command line
                ["buildah", "from", "--name", name, self.image],  # noqa: S607
                check=True, capture_output=True, text=True,
            ).stdout.strip()  # fmt: skip
            head = ["buildah", "run", "--isolation", "chroot", "--network", "host"]
            return [*head, *self._env_args(), container, "--", *program], container
        head = [self.tool, "run", "--rm", "--name", name, "--network", "host"]
        return [*head, *self._env_args(), self.image, *program], name

    def run(self, program: list[str], name: str) -> None:
        """Run ``program`` to its end; raise if it fails."""
        line, container = self.command(program, name)
        try:
            subprocess.run(line, check=True, timeout=120)  # noqa: S603
        finally:
            self.remove(container)

    def start(self, program: list[str], name: str) -> subprocess.Popen[bytes]:
        line, container = self.command(program, name)
        process = subprocess.Popen(line)  # noqa: S603
        self.started.append((process, container))
        return process

    def exec(self, name: str, program: list[str]) -> int:
        """Run ``program`` beside a started one (as a health check would); its exit status."""
        if self.tool == "buildah":
            line, container = self.command(program, f"{name}-probe")
            try:
                return subprocess.run(line, timeout=60).returncode  # noqa: S603
            finally:
                self.remove(container)
        return subprocess.run([self.tool, "exec", name, *program], timeout=60).returncode  # noqa: S603

    def stop(
        self, process: subprocess.Popen[bytes], name: str, program: str, timeout_s: float = 30
    ) -> float:
        """SIGTERM the program (``podman stop`` sends the image's STOPSIGNAL); seconds taken."""
        began = time.monotonic()
        if self.tool == "buildah":  # buildah run kills its program on SIGTERM: signal it
            for pid in programs(process.pid, program):
                os.kill(pid, signal.SIGTERM)
        else:
            subprocess.run([self.tool, "stop", "-t", str(int(timeout_s)), name], check=False)  # noqa: S603
        process.wait(timeout_s + 10)
        return time.monotonic() - began

    def remove(self, container: str | None) -> None:
        if self.tool == "buildah" and container:
            subprocess.run(["buildah", "rm", container], capture_output=True, check=False)  # noqa: S603, S607

    def cleanup(self) -> None:
        for process, container in self.started:
            if process.poll() is None:
                for pid in descendants(process.pid):
                    with suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                process.kill()
                process.wait()
            self.remove(container)


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (from ``/proc``)."""
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with suppress(OSError):
                children = [int(child) for child in (task / "children").read_text().split()]
                found += children
                pending += children
    return found


def programs(pid: int, program: str) -> list[int]:
    """The processes under ``pid`` that run ``program`` itself (not buildah's helpers): an
    interpreter, ``python`` (as uv's entry-point scripts name it) or ``python3``."""
    matches = []
    for child in descendants(pid):
        with suppress(OSError):
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            interpreter = argv[0].rsplit(b"/", 1)[-1]
            if interpreter in (b"python", b"python3") and any(
                arg.endswith(program.encode()) for arg in argv
            ):
                matches.append(child)
    return matches


def request(method: str, url: str, body: dict[str, Any] | None = None, token: str = "") -> Any:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    call = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310
    with urllib.request.urlopen(call, timeout=10) as response:  # noqa: S310 - loopback
        text = response.read()
    return json.loads(text) if text else None


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"smoke: FAILED: {what} within {timeout_s:.0f} s")
        time.sleep(0.2)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def session(base: str) -> None:
    """The README's first session: register, follow, post, and read the worker's copy."""
    suffix = str(time.time_ns())
    alice, bob = f"alice{suffix}", f"bob{suffix}"
    alice_token = request("POST", f"{base}/users", {"user_id": alice})["token"]
    bob_token = request("POST", f"{base}/users", {"user_id": bob})["token"]
    request("PUT", f"{base}/users/{bob}/following/{alice}", token=bob_token)
    post = request("POST", f"{base}/users/{alice}/posts", {"text": "hello"}, alice_token)

    def arrived() -> bool:
        page = request("GET", f"{base}/users/{bob}/timeline", token=bob_token)
        return [item["post_id"] for item in page["items"]] == [post["post_id"]]

    wait_for(arrived, "the post on the follower's timeline (the worker's copy)")
    print("smoke: post fanned out to the follower's timeline")


@contextmanager
def azurite() -> Iterator[Azurite]:
    server = Azurite(location=None)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="localhost/timeline:dev")
    parser.add_argument("--tool", default="podman", choices=["podman", "docker", "buildah"])
    args = parser.parse_args()
    api_port, metrics_port = free_ports(2)
    with azurite() as storage:
        env = {
            "TIMELINE_STORAGE_CONNECTION_STRING": storage.connection_string,
            "TIMELINE_AUTH_SECRET": SECRET,
            "TIMELINE_HOST": "127.0.0.1",
            "TIMELINE_PORT": str(api_port),
            "TIMELINE_WORKER_METRICS_PORT": str(metrics_port),
        }
        runner = Runner(args.tool, args.image, env)
        try:
            runner.run(["timeline", "init"], "smoke-init")
            api = runner.start(["timeline-api"], "smoke-api")
            worker = runner.start(["fanout-worker"], "smoke-worker")
            base = f"http://127.0.0.1:{api_port}"
            wait_for(lambda: answers(f"{base}/readyz"), "the API ready (/readyz)")
            wait_for(lambda: answers(f"http://127.0.0.1:{metrics_port}/metrics"), "worker up")
            session(base)
            for name, program in (("smoke-api", "api"), ("smoke-worker", "worker")):
                check = ["python3", "/opt/timeline/healthcheck.py", program]
                if runner.exec(name, check) != 0:
                    raise SystemExit(f"smoke: FAILED: the {program}'s health check")
            print("smoke: both health checks pass")
            stopping = (
                ("smoke-worker", worker, "fanout-worker"),
                ("smoke-api", api, "timeline-api"),
            )
            for name, process, program in stopping:
                taken = runner.stop(process, name, program)
                print(f"smoke: {name} stopped in {taken:.1f} s (exit {process.returncode})")
                if process.returncode != 0:
                    raise SystemExit(f"smoke: FAILED: {name} did not exit cleanly on SIGTERM")
        finally:
            runner.cleanup()
    print("smoke: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
