"""``timeline run`` and the programs refuse to start with one clear line per problem, before
anything starts: bad settings, taken ports, a second stack in the same data folder."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import program_env
from tests.tools.stack_helpers import StackProcess, start_until_ready, stop_stack
from timeline.storage.endpoints import COSMOS_REFUSED
from timeline.tools.azurite import free_ports


def run(module: str, *args: str, **settings: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - this interpreter, a fixed module
        [sys.executable, "-m", module, *args],
        env=program_env(**settings), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("module", ["timeline.tools.cli", "api", "fanout_worker"])
def test_every_bad_setting_is_one_line_naming_its_variable(module: str, tmp_path: Path) -> None:
    args = ["run"] if module == "timeline.tools.cli" else []
    done = run(
        module, *args, data_dir=tmp_path / "data", port="abc", token_ttl_s=1,
        azurite_ports="1,x", access_log="maybe",
    )  # fmt: skip
    lines = done.stderr.splitlines()
    assert done.returncode == 2
    assert "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 4, done.stderr
    expected = {
        "TIMELINE_PORT='abc' is not valid (input should be a valid integer",
        "TIMELINE_TOKEN_TTL_S='1' is not valid (input should be greater than or equal to 60)",
        "TIMELINE_AZURITE_PORTS='1,x' is not valid (three ports, blob,queue,table)",
        "TIMELINE_ACCESS_LOG='maybe' is not valid (input should be a valid boolean",
    }
    for start in expected:
        assert any(start in line and "set a valid value or unset it" in line for line in lines)
    assert not (tmp_path / "data").exists(), "something started"


def test_a_refused_account_is_its_own_message_not_a_variable(tmp_path: Path) -> None:
    cosmos = "TableEndpoint=https://c.table.cosmos.azure.com:443/;"
    done = run("timeline.tools.cli", "stats", data_dir=tmp_path, storage_connection_strings=cosmos)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"timeline: {COSMOS_REFUSED}"]


def test_a_rule_between_settings_is_one_line_too(tmp_path: Path) -> None:
    done = run("fanout_worker", data_dir=tmp_path, worker_sweep_delay_s=3)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "fanout-worker: TIMELINE_WORKER_SWEEP_DELAY_S must exceed the write deadline plus the "
        "storage timeout (305 s): set a valid value or unset it "
        "(docs/operations.md#configuration-reference)"
    ]


def test_a_hidden_time_the_api_write_deadline_could_outlast_is_refused(tmp_path: Path) -> None:
    done = run("api", data_dir=tmp_path, api_hidden_message_s=30)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "timeline-api: TIMELINE_API_HIDDEN_MESSAGE_S must exceed the API write deadline plus "
        "the storage timeout (30 s: 6 storage timeouts): set a valid value or unset it "
        "(docs/operations.md#configuration-reference)"
    ]


@pytest.mark.parametrize("which", ["azurite", "metrics"])
def test_a_taken_azurite_or_metrics_port_stops_the_stack_before_anything_starts(
    which: str, tmp_path: Path
) -> None:
    port, metrics, *azurite_ports = free_ports(5)
    taken = azurite_ports[1] if which == "azurite" else metrics
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        done = run(
            "timeline.tools.cli", "run", data_dir=tmp_path / "data", port=port,
            azurite_ports=",".join(map(str, azurite_ports)), worker_metrics_port=metrics,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    [line] = [line for line in done.stderr.splitlines() if "in use" in line]
    assert str(taken) in line
    setting = "TIMELINE_AZURITE_PORTS" if which == "azurite" else "TIMELINE_WORKER_METRICS_PORT"
    assert setting in line
    assert not (tmp_path / "data" / "azurite").exists(), "Azurite started before the check"


@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_a_second_stack_in_the_same_folder_names_the_first_and_metrics_are_on(
    tmp_path: Path,
) -> None:
    port, other_port, *azurite_ports = free_ports(5)
    first = StackProcess(tmp_path / "data", port, tuple(azurite_ports))
    process, line, log = await start_until_ready(first)
    try:
        urls = line.split("; worker metrics ")[1].split()
        assert [url.rsplit("/", 1)[1] for url in urls] == ["metrics"], line
        async with aiohttp.ClientSession() as session, session.get(urls[0]) as response:
            assert response.status == 200
            assert "fanout_poisoned_total" in await response.text()

        second = await asyncio.to_thread(
            run, "timeline.tools.cli", "run", data_dir=tmp_path / "data", port=other_port
        )
        assert second.returncode == 2
        assert second.stderr.splitlines() == [
            f"timeline: a stack is already running in {tmp_path / 'data'} (pid "
            f"{process.pid}): stop it with Ctrl-C in its terminal or `kill {process.pid}`, "
            "or give this one another folder with TIMELINE_DATA_DIR"
        ]
    finally:
        assert await stop_stack(process, log) == 0
