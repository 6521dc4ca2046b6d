"""The test harness itself (``tests/conftest.py``): a failed or timed-out test leaves nothing
running into the tests after it. Each case runs a small inner pytest session of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
INNER_OPTIONS = (
    "-p", "no:cacheprovider",
    "-o", "asyncio_mode=auto",
    "-o", "asyncio_default_fixture_loop_scope=session",
    "-o", "asyncio_default_test_loop_scope=session",
    "-o", "timeout=120",
    "-o", "timeout_func_only=true",  # as pyproject.toml: a slow set-up must not fire it first
)  # fmt: skip
HEADER = '''
import asyncio

import pytest

from tests.conftest import *  # noqa: F403 - the fixtures under test
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables.aio import TableServiceClient

pytest_plugins = ["tests.conftest"]
TICKS = []


async def tables(azurite):
    async with TableServiceClient.from_connection_string(azurite.connection_string) as service:
        return [table.name async for table in service.list_tables()]


async def write_for_a_while(azurite, rows=100):
    """Write a row every 0.05 s (for 5 s), creating the table again whenever it is gone."""
    async with TableServiceClient.from_connection_string(azurite.connection_string) as service:
        for row in range(rows):
            try:
                await service.get_table_client("leak").upsert_entity(
                    {"PartitionKey": "p", "RowKey": str(row)}
                )
            except ResourceNotFoundError:
                await service.create_table_if_not_exists("leak")
            TICKS.append(row)
            await asyncio.sleep(0.05)
'''


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    return pytester


def test_what_a_failed_test_borrowed_is_never_lent_again(inner: pytest.Pytester) -> None:
    inner.makepyfile(
        HEADER
        + """
async def test_a_fails_while_its_task_writes(private_azurite):
    asyncio.get_running_loop().create_task(write_for_a_while(private_azurite))
    while not TICKS:
        await asyncio.sleep(0.01)
    raise AssertionError("fails, leaving its writer running")


async def test_b_gets_an_empty_account(private_azurite):
    await asyncio.sleep(0.5)  # ten of the writer's writes, were it writing here
    assert await tables(private_azurite) == [], "the failed test's writer wrote here"
"""
    )
    result = inner.runpytest_subprocess(*INNER_OPTIONS, "-p", "no:schemathesis")
    result.assert_outcomes(passed=1, failed=1)


def test_what_a_test_failing_in_teardown_borrowed_is_never_lent_again(
    inner: pytest.Pytester,
) -> None:
    inner.makepyfile(
        HEADER
        + """
@pytest.fixture
async def writer_left_running(private_azurite):
    yield asyncio.get_running_loop().create_task(write_for_a_while(private_azurite))
    raise RuntimeError("a teardown that fails before it cancels the writer")


async def test_a_passes(writer_left_running):
    while not TICKS:
        await asyncio.sleep(0.01)


async def test_b_gets_an_empty_account(private_azurite):
    await asyncio.sleep(0.5)  # ten of the writer's writes, were it writing here
    assert await tables(private_azurite) == [], "the failed test's writer wrote here"
"""
    )
    result = inner.runpytest_subprocess(*INNER_OPTIONS, "-p", "no:schemathesis")
    result.assert_outcomes(passed=2, errors=1)


def test_a_timed_out_async_test_stops_running(inner: pytest.Pytester) -> None:
    inner.makepyfile(
        HEADER
        + """
@pytest.mark.timeout(15)
async def test_a_hangs(private_azurite):
    await write_for_a_while(private_azurite, rows=1000)


async def test_b_runs_alone(private_azurite):
    before = len(TICKS)
    await asyncio.sleep(0.5)
    assert len(TICKS) == before, "the timed-out test is still running beside this one"
    assert await tables(private_azurite) == []
"""
    )
    result = inner.runpytest_subprocess(*INNER_OPTIONS, "-p", "no:schemathesis")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_a_hangs*TimeoutError*"])  # cancelled, not signalled
