"""Every private name of the Azure SDKs that the lean storage path uses, in one place.

The lean path (``lean``, ``lean_single``, ``lean_queue``, ``egt``, ``pipeline``) builds its
own requests but keeps the SDKs' own conversions, error decoding and pipeline objects, so
that it types, fails and authenticates as the SDKs do. Some of those are private: functions
of the SDKs' underscore modules, and attributes of their clients. They are named here and
nowhere else in ``timeline/`` (``tests/storage/test_sdk_internals.py`` checks both that and
that each one still resolves on real clients), so an SDK release that moves one fails in one
place, by name.

A function that has moved fails this module's import with ``SdkInternalsMoved``, which names
it and the installed release; a client attribute that has moved fails its accessor below
(and the test, by name).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any, NoReturn, cast

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError
from azure.core.pipeline.transport import AsyncHttpTransport
from azure.data.tables import TableEntity
from azure.data.tables.aio import TableClient
from azure.storage.queue.aio import QueueClient


class SdkInternalsMoved(ImportError):
    """A private SDK name the lean path uses is not where this module looks for it."""

    def __init__(self, path: str) -> None:
        package = "-".join(path.split(".")[:3])  # azure.data.tables: azure-data-tables
        try:
            installed = f"{package} {version(package)}"
        except PackageNotFoundError:
            installed = f"{package} (not installed)"
        super().__init__(
            f"{path} is not in the installed {installed}: the lean storage path uses it "
            "(timeline/storage/wire/sdk_internals.py); find where this release put it, or pin the "
            "release that has it"
        )


def _private(path: str) -> Any:
    """The object at ``path`` (``module:attribute.attribute``), or ``SdkInternalsMoved``."""
    module, _, attributes = path.partition(":")
    dotted = f"{module}.{attributes}"
    try:
        found: Any = importlib.import_module(module)
        for name in attributes.split("."):
            found = getattr(found, name)
    except (ImportError, AttributeError) as error:
        raise SdkInternalsMoved(dotted) from error
    return found


_TABLES = "azure.data.tables"
_QUEUES = "azure.storage.queue"

FUNCTIONS: dict[str, str] = {
    "ENTITY_CONVERSIONS": f"{_TABLES}._deserialize:_ENTITY_TO_PYTHON_CONVERSIONS",
    "from_entity_datetime": f"{_TABLES}._deserialize:_from_entity_datetime",
    "decode_error": f"{_TABLES}._error:_decode_error",
    "process_table_error": f"{_TABLES}._error:_process_table_error",
    "validate_tablename_error": f"{_TABLES}._error:_validate_tablename_error",
    "validate_key_values": f"{_TABLES}._error:_validate_key_values",
    "parameter_filter_substitution": f"{_TABLES}._serialize:_parameter_filter_substitution",
    "add_entity_properties": f"{_TABLES}._serialize:_add_entity_properties",
    "get_match_condition": f"{_TABLES}._serialize:_get_match_condition",
    "deserialize_rfc": f"{_TABLES}._generated._serialization:Deserializer.deserialize_rfc",
    "prep_if_match": f"{_TABLES}._generated._vendor:prep_if_match",
    "StorageHosts": f"{_TABLES}._policies:StorageHosts",
    "QueueErrorModel": f"{_QUEUES}._generated.models:Error",
    "failsafe_deserialize_xml": f"{_QUEUES}._generated._utils.model_base:_failsafe_deserialize_xml",
    "process_storage_error": f"{_QUEUES}._shared.response_handlers:process_storage_error",
}
"""This module's name for each private SDK function, class or table (``module:name``)."""

ATTRIBUTES: dict[str, str] = {
    "query_str": "TableClient._query_str, QueueClient._query_str",
    "table_host": "TableClient._primary_hostname",
    "table_transport": "TableClient._client._client._pipeline._transport",
    "table_policies": "TableClient._policies",
    "set_metadata": "TableEntity._metadata",
    "queue_transport": "QueueClient._pipeline._transport",
    "queue_proxy_policy": "QueueClient._config.proxy_policy",
    "queue_retry_policy": "QueueClient._config.retry_policy",
    "queue_credential_policy": "QueueClient._credential_policy",
    "queue_encode": "QueueClient._message_encode_policy",
    "queue_decoder": "QueueClient._message_decode_policy.decode",
}
"""Each accessor below and the private client (or entity) attribute it reads or sets."""

# --- the table SDK's conversions, serialisation and error decoding ------------------------

ENTITY_CONVERSIONS: Mapping[Any, Callable[..., Any]] = _private(FUNCTIONS["ENTITY_CONVERSIONS"])
"""EDM type -> the function that turns a query's JSON value into the SDK's Python value."""
from_entity_datetime: Callable[[str], datetime] = _private(FUNCTIONS["from_entity_datetime"])
"""A row's ``Timestamp`` text as the SDK's datetime (``TablesEntityDatetime``)."""
decode_error: Callable[..., HttpResponseError] = _private(FUNCTIONS["decode_error"])
"""A failed response as the SDK's exception (type, status, error code)."""
process_table_error: Callable[..., None] = _private(FUNCTIONS["process_table_error"])
"""Raises what the SDK raises for a failed table call."""
validate_tablename_error: Callable[[HttpResponseError, str], None] = _private(
    FUNCTIONS["validate_tablename_error"]
)
"""Raises the SDK's ``ValueError`` when a failure means a bad table name."""
validate_key_values: Callable[[HttpResponseError, Any, Any], None] = _private(
    FUNCTIONS["validate_key_values"]
)
"""Raises the SDK's ``ValueError`` when a failure means missing keys."""
parameter_filter_substitution: Callable[[dict[str, Any], str], str] = _private(
    FUNCTIONS["parameter_filter_substitution"]
)
"""A query filter with its ``@name`` parameters put in, quoted as the SDK quotes them."""
add_entity_properties: Callable[[Mapping[str, Any]], dict[str, Any]] = _private(
    FUNCTIONS["add_entity_properties"]
)
"""Properties typed for the wire (``@odata.type`` annotations), as the SDK sends them."""
get_match_condition: Callable[[str | None, MatchConditions], MatchConditions] = _private(
    FUNCTIONS["get_match_condition"]
)
"""The condition an etag and a match condition make (the SDK's checks included)."""
deserialize_rfc: Callable[[str], datetime] = _private(FUNCTIONS["deserialize_rfc"])
"""An RFC 1123 ``Date`` header as the SDK's datetime."""
prep_if_match: Callable[[str | None, MatchConditions | None], str | None] = _private(
    FUNCTIONS["prep_if_match"]
)
"""The ``If-Match`` header of a condition, etag quoted as the SDK quotes it."""
StorageHosts: type[Any] = _private(FUNCTIONS["StorageHosts"])
"""The table client's secondary-host policy (the lean pipeline leaves it out)."""

# --- the queue SDK's error decoding --------------------------------------------------------

QueueErrorModel: type[Any] = _private(FUNCTIONS["QueueErrorModel"])
"""The generated queue client's XML error model."""
failsafe_deserialize_xml: Callable[[type[Any], Any], Any] = _private(
    FUNCTIONS["failsafe_deserialize_xml"]
)
"""An XML error body as ``QueueErrorModel`` (None when it does not parse)."""
process_storage_error: Callable[[HttpResponseError], NoReturn] = _private(
    FUNCTIONS["process_storage_error"]
)
"""Raises what the queue SDK raises for a failed call."""


# --- attributes of the SDKs' clients and entities ------------------------------------------


def query_str(client: TableClient | QueueClient) -> str:
    """The SAS query (``?sv=...``) the client appends to every URL, or ``""``."""
    return cast(str, client._query_str)


def table_host(client: TableClient) -> str:
    """The table client's primary host and account path (``127.0.0.1:10002/devstoreaccount1``)."""
    return cast(str, client._primary_hostname)


def table_transport(client: TableClient) -> AsyncHttpTransport[Any, Any]:
    """The transport at the end of the table client's pipeline (its aiohttp session)."""
    generated: Any = client._client
    return cast(AsyncHttpTransport[Any, Any], generated._client._pipeline._transport)


def table_policies(client: TableClient) -> list[Any]:
    """The table client's pipeline policies, in order."""
    return client._policies


def set_metadata(entity: TableEntity, metadata: dict[str, Any]) -> None:
    """Give a built entity its ``metadata`` (etag, timestamp), as the SDK's decoder does."""
    entity._metadata = metadata  # type: ignore[assignment]


def queue_transport(client: QueueClient) -> AsyncHttpTransport[Any, Any]:
    """The transport at the end of the queue client's pipeline (its aiohttp session)."""
    pipeline: Any = client._pipeline
    return cast(AsyncHttpTransport[Any, Any], pipeline._transport)


def queue_proxy_policy(client: QueueClient) -> Any:
    """The queue client's proxy policy."""
    config: Any = client._config
    return config.proxy_policy


def queue_retry_policy(client: QueueClient) -> Any:
    """The queue client's retry policy (its settings: statuses, count, backoff)."""
    config: Any = client._config
    return config.retry_policy


def queue_credential_policy(client: QueueClient) -> Any:
    """The queue client's credential policy (shared key or token), or None (a SAS URL)."""
    return client._credential_policy


def queue_encode(client: QueueClient, content: str) -> str:
    """A message's content as the client's encode policy puts it on the wire."""
    return client._message_encode_policy(content)


def queue_decoder(client: QueueClient) -> Callable[[str, Any], Any]:
    """The client's decode policy's ``decode(text, response)``."""
    return cast(Callable[[str, Any], Any], client._message_decode_policy.decode)
