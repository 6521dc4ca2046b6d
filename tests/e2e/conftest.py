"""End-to-end fixtures: the whole stack (``timeline run``: Azurite, API, worker) on free
ports, and real headless Chromium browsers driven by Selenium through the system
chromedriver (Debian's ``chromium`` and ``chromium-driver``; nothing is downloaded).

Run with ``make e2e``. Screenshots, browser console logs and the stack's log go to
``build/e2e/`` (``E2E_OUTPUT_DIR`` to change it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

from tests.conftest import program_env
from timeline.tools.azurite import free_ports

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = Path(os.environ.get("E2E_OUTPUT_DIR", ROOT / "build" / "e2e"))
PAGE_SIZE = 5
"""The stack's page size: small, so "Load more" is reached with a few posts."""

# Never let Selenium Manager look for (or download) a browser or driver.
os.environ.setdefault("SE_OFFLINE", "true")


def _first_existing(*candidates: str | None) -> str | None:
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def chromium_binary() -> str:
    found = _first_existing(
        os.environ.get("CHROMIUM_BINARY"),
        "/usr/lib/chromium/chromium",  # Debian's real binary (/usr/bin/chromium is a wrapper)
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    )
    if found is None:
        pytest.fail("no Chromium: `make e2e` installs Debian's chromium and chromium-driver")
    return found


def chromedriver_binary() -> str:
    found = _first_existing(
        os.environ.get("CHROMEDRIVER"), "/usr/bin/chromedriver", shutil.which("chromedriver")
    )
    if found is None:
        pytest.fail("no chromedriver: `make e2e` installs Debian's chromium-driver")
    return found


def request_json(
    method: str, url: str, body: Any = None, token: str | None = None
) -> tuple[int, Any]:
    """One request to the stack: its status and JSON body (None when it has none)."""
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as error:
        raw = error.read()
        return error.code, json.loads(raw) if raw else None


def server_errors(base: str) -> float:
    """How many 5xx answers the API process has given (its Prometheus counter)."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:  # noqa: S310
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("timeline_http_requests_total{") and 'status="5' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def browser_log(driver: Any) -> list[dict[str, Any]]:
    """The browser console's entries since the last call (Chromium's log, via chromedriver)."""
    return list(driver.get_log("browser"))


@pytest.fixture(scope="session")
def output_dir() -> Path:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    return OUTPUT


STREAM_LOOKBACK_S = 1
"""Short, so the page must find late entries (a follow's backfill) without the stream."""


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, output_dir: Path) -> Iterator[str]:
    """``timeline run`` on free ports with its own data directory: the API's base URL."""
    port, *azurite_ports = free_ports(4)
    env = program_env(
        data_dir=tmp_path_factory.mktemp("e2e-data"),
        port=port,
        azurite_ports=",".join(map(str, azurite_ports)),
        page_size=PAGE_SIZE,
        posts_per_minute=0,
        writes_per_minute=0,
        registrations_per_minute=0,
        worker_idle_sleep_s=0.05,
        worker_idle_max_sleep_s=0.05,
        stream_lookback_s=STREAM_LOOKBACK_S,
    )
    base = f"http://127.0.0.1:{port}"
    with (output_dir / "stack.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "timeline.tools.cli", "run"], env=env, stdout=log, stderr=log
        )
        try:
            _wait_ready(base, process)
            yield base
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(base: str, process: subprocess.Popen[bytes], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the stack exited with {process.returncode}; see build/e2e/stack.log")
        with contextlib.suppress(OSError):
            if request_json("GET", f"{base}/readyz")[0] == 200:
                return
        time.sleep(0.2)
    pytest.fail("the stack did not become ready; see build/e2e/stack.log")


@pytest.fixture
def browsers(
    request: pytest.FixtureRequest, output_dir: Path, tmp_path: Path
) -> Iterator[Callable[[str], webdriver.Chrome]]:
    """A factory of headless Chromium sessions, each with its own profile (so its own
    localStorage). At teardown each one's screenshot and console log are saved as
    ``<test>-<name>.png`` / ``.log`` in the output directory."""
    opened: dict[str, webdriver.Chrome] = {}

    def open_browser(name: str) -> webdriver.Chrome:
        options = Options()
        options.binary_location = chromium_binary()
        for argument in (
            "--headless=new",
            "--no-sandbox",  # root in a container
            "--disable-dev-shm-usage",
            "--disable-gpu",
            "--window-size=1280,1000",
            "--force-device-scale-factor=1",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-features=Translate,OptimizationHints,MediaRouter",
            f"--user-data-dir={tmp_path / f'profile-{name}'}",
        ):
            options.add_argument(argument)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        service = Service(
            executable_path=chromedriver_binary(),
            log_output=str(output_dir / f"chromedriver-{name}.log"),
        )
        driver = webdriver.Chrome(options=options, service=service)
        opened[name] = driver
        return driver

    yield open_browser

    for name, driver in opened.items():
        stem = output_dir / f"{request.node.name}-{name}"
        with contextlib.suppress(Exception):
            driver.save_screenshot(str(stem.with_suffix(".png")))
        with contextlib.suppress(Exception):
            lines = [f"{entry['level']} {entry['message']}" for entry in browser_log(driver)]
            stem.with_suffix(".log").write_text("\n".join(lines) + "\n")
        driver.quit()
