"""The Azure SDKs' private names the lean storage path uses
(``timeline.storage.wire.sdk_internals``) are all still where it looks for them, and it uses no
other: each function resolves in the installed SDK releases, each client attribute on real
clients as ``Storage`` builds them, and no module of ``timeline/`` names a private SDK name
anywhere else.

A private function an SDK release moved fails ``sdk_internals``'s import (and so every test
session) with ``SdkInternalsMoved``, which names it; a moved client attribute fails
``test_every_client_attribute_resolves_on_real_clients``, which names its accessor and the
attribute."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.core.pipeline.policies import ProxyPolicy
from azure.core.pipeline.transport import AioHttpTransport
from azure.data.tables import TableEntity

from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.storage.wire import sdk_internals
from timeline.storage.wire.sdk_internals import ATTRIBUTES, FUNCTIONS, SdkInternalsMoved

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "timeline" / "storage" / "wire" / "sdk_internals.py"


def test_every_private_sdk_function_resolves_to_what_the_module_names() -> None:
    moved = []
    for name, path in FUNCTIONS.items():
        module, _, attributes = path.partition(":")
        try:
            found: Any = importlib.import_module(module)
            for part in attributes.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError):
            moved.append(str(SdkInternalsMoved(f"{module}.{attributes}")))
            continue
        assert getattr(sdk_internals, name) == found, name
        assert callable(found) or isinstance(found, dict), name
    assert not moved, "\n".join(moved)


def test_a_moved_name_is_named_with_the_installed_release() -> None:
    with pytest.raises(SdkInternalsMoved) as caught:
        sdk_internals._private("azure.data.tables._error:_no_such_function")
    message = str(caught.value)
    assert message.startswith("azure.data.tables._error._no_such_function is not in the installed")
    assert "azure-data-tables 12." in message


def test_every_client_attribute_resolves_on_real_clients(storage: Storage) -> None:
    """The accessors on the table and queue clients ``Storage`` builds (shared key, one
    aiohttp session per pool), each giving what the lean pipeline takes from it."""
    table, queue = storage.table(TIMELINES, "x"), storage.work_queue(0)

    def metadata_set() -> bool:
        entity = TableEntity()
        sdk_internals.set_metadata(entity, {"etag": "e"})
        return dict(entity.metadata) == {"etag": "e"}

    checks: dict[str, Callable[[], bool]] = {
        "query_str": lambda: (
            sdk_internals.query_str(table) == "" and sdk_internals.query_str(queue) == ""
        ),
        "table_host": lambda: table.url.startswith(f"http://{sdk_internals.table_host(table)}"),
        "table_transport": lambda: isinstance(
            sdk_internals.table_transport(table), AioHttpTransport
        ),
        "table_policies": lambda: any(
            isinstance(policy, sdk_internals.StorageHosts)
            for policy in sdk_internals.table_policies(table)
        ),
        "set_metadata": metadata_set,
        "queue_transport": lambda: isinstance(
            sdk_internals.queue_transport(queue), AioHttpTransport
        ),
        "queue_proxy_policy": lambda: isinstance(
            sdk_internals.queue_proxy_policy(queue), ProxyPolicy
        ),
        "queue_retry_policy": lambda: (
            sdk_internals.queue_retry_policy(queue).total_retries == storage.options.retries
        ),
        "queue_credential_policy": lambda: sdk_internals.queue_credential_policy(queue) is not None,
        "queue_encode": lambda: sdk_internals.queue_encode(queue, "héllo") == "héllo",
        "queue_decoder": lambda: sdk_internals.queue_decoder(queue)("héllo", None) == "héllo",
    }
    assert set(checks) == set(ATTRIBUTES), "every accessor is checked here"
    failed = []
    for name, check in checks.items():
        try:
            if not check():
                failed.append(f"{name} ({ATTRIBUTES[name]}): not what the lean path expects")
        except AttributeError as error:
            failed.append(f"{name} ({ATTRIBUTES[name]}) moved: {error}")
    assert not failed, "\n".join(failed)


def _sources(*folders: str) -> Iterator[tuple[Path, ast.Module]]:
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path != HOME:
                yield path, ast.parse(path.read_text(), str(path))


def test_no_private_sdk_name_is_used_anywhere_else() -> None:
    """No import of a private SDK module or name in ``timeline/``, ``api/`` or
    ``fanout_worker/``, and no private attribute of another object (an SDK client's) in
    ``timeline/storage/``: each goes through ``sdk_internals``."""
    found = []
    for path, tree in _sources("timeline", "api", "fanout_worker"):
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                modules, names = [node.module or ""], [alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                modules, names = [alias.name for alias in node.names], []
            else:
                continue
            for module in modules:
                if module.split(".")[0] != "azure":
                    continue
                if any(part.startswith("_") for part in [*module.split("."), *names]):
                    imported = f" import {', '.join(names)}" if names else ""
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {module}{imported}")
    for path, tree in _sources("timeline/storage"):
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
    assert not found, "private names outside timeline/storage/wire/sdk_internals.py:\n" + "\n".join(
        found
    )
