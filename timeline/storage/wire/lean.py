"""The lean storage path: query pages, Entity Group Transactions and single upserts on the
SDK's own policies, without its per-property model layer.

Requests are ``azure.core.rest.HttpRequest`` objects sent through the table client's lean
sender (``timeline.storage.wire.pipeline``: the client's own credential, retry and header
policies and its transport, without the per-request ones that only cost CPU), so
authentication (shared key, SAS, token), retries, timeouts and the transport stay
azure-core's. What is done by hand: a batch body (``timeline.storage.wire.egt``), a single
upsert's ``PUT``, and a query page's JSON, decoded with orjson and typed as the SDK types
it. Errors are decoded by the SDK's own error decoder, so callers see the same exception
types, status codes, error codes and transaction indexes. Why and what it saves:
``docs/lean-storage.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast
from urllib.parse import quote

import orjson
from azure.core.exceptions import HttpResponseError
from azure.core.rest import AsyncHttpResponse, HttpRequest
from azure.data.tables import (
    EdmType,
    EntityProperty,
    RequestTooLargeError,
    TableEntity,
    TableTransactionError,
)
from azure.data.tables.aio import TableClient

from timeline.model.entities import Page
from timeline.storage.wire.egt import Part, build_batch, entity_json, parse_batch, row_keys
from timeline.storage.wire.pipeline import LeanSender, table_sender
from timeline.storage.wire.sdk_internals import (
    ENTITY_CONVERSIONS,
    decode_error,
    from_entity_datetime,
    parameter_filter_substitution,
    process_table_error,
    query_str,
    set_metadata,
    table_host,
    validate_tablename_error,
)

_INT32 = 2**31
# The SDK's own conversions and error decoding, so the lean path types and fails as it does.
_CONVERSIONS: dict[str, Callable[[Any], Any]] = {
    edm.value: convert for edm, convert in ENTITY_CONVERSIONS.items()
}
_QUERY_ACCEPT = "application/json;odata=minimalmetadata"


async def query_page(
    client: TableClient,
    query_filter: str,
    parameters: dict[str, Any],
    *,
    select: list[str] | None,
    limit: int,
    continuation: dict[str, str] | None,
    on_headers: Callable[[Mapping[str, str]], None] | None = None,
) -> Page[TableEntity]:
    """One query request: the entities and the continuation, as the SDK's pager gives them
    (``on_headers`` is given the response's headers)."""
    page = await query_rows(
        client,
        query_filter,
        parameters,
        select=select,
        limit=limit,
        continuation=continuation,
        on_headers=on_headers,
    )
    return Page([to_entity(row) for row in page.items], page.continuation)


async def query_rows(
    client: TableClient,
    query_filter: str,
    parameters: dict[str, Any],
    *,
    select: list[str] | None,
    limit: int,
    continuation: dict[str, str] | None,
    on_headers: Callable[[Mapping[str, str]], None] | None = None,
) -> Page[dict[str, Any]]:
    """``query_page`` with each row as the JSON gave it (``odata.*`` annotations included,
    nothing typed): for pages that read only strings and booleans."""
    response = await query_response(
        client, query_filter, parameters, select=select, limit=limit, continuation=continuation
    )
    if on_headers is not None:
        on_headers(response.headers)
    rows: list[dict[str, Any]] = orjson.loads(response.content)["value"]
    return Page(rows, _continuation(response))


async def query_response(
    client: TableClient,
    query_filter: str,
    parameters: dict[str, Any],
    *,
    select: list[str] | None,
    limit: int,
    continuation: dict[str, str] | None,
) -> AsyncHttpResponse:
    """The query's 200 response, read whole (its body is the page's JSON), or the SDK's error."""
    params = {
        "$top": str(limit),
        "$filter": parameter_filter_substitution(parameters, query_filter),
    }
    if select:
        params["$select"] = ",".join(select)
    if continuation:
        if continuation.get("PartitionKey"):
            params["NextPartitionKey"] = continuation["PartitionKey"]
        if continuation.get("RowKey"):
            params["NextRowKey"] = continuation["RowKey"]
    request = HttpRequest(
        "GET",
        f"{_endpoint(client)}/{quote(client.table_name, safe='')}(){query_str(client)}",
        params={name: quote(value, safe="") for name, value in params.items()},  # as the SDK
        headers={
            "x-ms-version": client.api_version,
            "DataServiceVersion": "3.0",
            "Accept": _QUERY_ACCEPT,
        },
    )
    response = await _send(client, request)
    if response.status_code != 200:
        process_table_error(HttpResponseError(response=response))
    return response


def _continuation(response: AsyncHttpResponse) -> dict[str, str] | None:
    """The next page's token as the SDK's pager gives it: both headers as they came (a
    missing one as None), or None when neither came."""
    next_partition = response.headers.get("x-ms-continuation-NextPartitionKey")
    next_row = response.headers.get("x-ms-continuation-NextRowKey")
    if not (next_partition or next_row):
        return None
    return cast(dict[str, str], {"PartitionKey": next_partition, "RowKey": next_row})


def to_entity(row: dict[str, Any]) -> TableEntity:
    """A query row as the SDK's ``_convert_to_entity`` makes it: strings, int32 and booleans
    as they are, annotated values converted, ``odata.*`` and ``Timestamp`` into metadata."""
    entity = TableEntity()
    if "PartitionKey" in row:
        entity["PartitionKey"] = row["PartitionKey"]
    if "RowKey" in row:
        entity["RowKey"] = row["RowKey"]
    odata: dict[str, Any] = {}
    types: dict[str, str] | None = None
    timestamp = None
    for name, value in row.items():
        if name.startswith("odata."):
            odata[name[6:]] = value
        elif name.endswith("@odata.type"):
            types = types or {}
            types[name[:-11]] = value
        elif name == "Timestamp":
            timestamp = value
        elif name != "PartitionKey" and name != "RowKey":
            entity[name] = value
    if types:
        for name, edm in types.items():
            if name in entity and name not in ("PartitionKey", "RowKey"):
                entity[name] = _typed(edm, entity[name])
    for name, value in entity.items():
        if type(value) is int and not -_INT32 <= value < _INT32:
            entity[name] = EntityProperty(value, EdmType.INT64)
    etag = odata.pop("etag", None)
    odata.pop("metadata", None)
    if timestamp:
        if not etag:
            etag = "W/\"datetime'" + quote(timestamp) + "'\""
        timestamp = from_entity_datetime(timestamp)
    odata.update({"etag": etag, "timestamp": timestamp})
    set_metadata(entity, odata)
    return entity


def _typed(edm: str, value: Any) -> Any:
    if edm in (EdmType.STRING, EdmType.INT32):
        return value
    convert = _CONVERSIONS.get(edm)
    return convert(value) if convert is not None else EntityProperty(edm, value)


async def submit_transaction(client: TableClient, operations: Sequence[Sequence[Any]]) -> None:
    """One Entity Group Transaction; raises what the SDK's ``submit_transaction`` raises."""
    if not operations:
        return
    endpoint = _endpoint(client)
    content_type, body = build_batch(endpoint, client.table_name, operations, client.api_version)
    request = HttpRequest(
        "POST",
        f"{endpoint}/$batch",
        headers={
            "x-ms-version": client.api_version,
            "DataServiceVersion": "3.0",
            "MaxDataServiceVersion": "3.0;NetFx",
            "Content-Type": content_type,
            "Accept": "application/json",
        },
        content=body,
    )
    response = await _send(client, request)
    _raise_for_batch(response, client.table_name)


async def upsert_entity(client: TableClient, entity: Mapping[str, Any]) -> None:
    """One entity upserted whole (``UpdateMode.REPLACE``): a ``PUT`` without ``If-Match``,
    the same request, body and errors as the SDK's ``upsert_entity``."""
    table = quote(client.table_name, safe="")
    request = HttpRequest(
        "PUT",
        f"{_endpoint(client)}/{table}({row_keys(entity)}){query_str(client)}",
        headers={
            "x-ms-version": client.api_version,
            "DataServiceVersion": "3.0",
            "Content-Type": "application/json",
            "Accept": "application/json",
        },
        content=entity_json(entity),
    )
    response = await _send(client, request)
    if response.status_code != 204:
        process_table_error(HttpResponseError(response=response), table_name=client.table_name)


def _endpoint(client: TableClient) -> str:
    return f"{client.scheme}://{table_host(client)}"


async def _send(client: TableClient, request: HttpRequest) -> AsyncHttpResponse:
    """Through the client's lean sender (``timeline.storage.wire.pipeline``), read whole."""
    sender: LeanSender | None = getattr(client, "lean_sender", None)
    if sender is None:
        sender = table_sender(client)
        client.lean_sender = sender  # type: ignore[attr-defined]
    return await sender.send(request)


def _raise_for_batch(response: AsyncHttpResponse, table: str) -> None:
    """The SDK's ``_batch_send`` error handling, on parts parsed by hand."""
    if response.status_code == 413:
        raise _too_large(response)
    if response.status_code != 202:
        decoded = decode_error(response)
        validate_tablename_error(decoded, table)
        raise decoded
    failed = [
        p
        for p in parse_batch(response.headers["Content-Type"], response.content)
        if not 200 <= p.status_code < 300
    ]
    if failed:
        if failed[0].status_code == 413:
            raise _too_large(response)
        decoded = decode_error(response=_PartResponse(failed[0]), error_type=TableTransactionError)
        validate_tablename_error(decoded, table)
        raise decoded


def _too_large(response: AsyncHttpResponse) -> HttpResponseError:
    return decode_error(
        response,
        error_message="The transaction request was too large",
        error_type=RequestTooLargeError,
    )


class _PartResponse:
    """One failed operation's answer, shaped as the response the SDK's error decoder reads."""

    def __init__(self, part: Part) -> None:
        self.status_code = part.status_code
        self.reason = part.reason
        self.headers = _CaseInsensitive(part.headers)
        self.content_type = part.headers.get("content-type")
        self._body = part.body
        self.request = None

    def body(self) -> bytes:
        return self._body

    def text(self, encoding: str | None = None) -> str:
        return self._body.decode(encoding or "utf-8")


class _CaseInsensitive(dict[str, str]):
    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())
