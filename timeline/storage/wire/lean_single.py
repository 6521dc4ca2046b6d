"""Single-entity calls on the lean path: a point read, an insert, a replace or merge (with
its ``If-Match``) and a delete, each a hand-built request through the table client's lean
sender (``timeline.storage.wire.pipeline``).

Each is the request the SDK's own call sends (method, URL with keys quoted as the SDK
quotes them, headers, body) and gives back what that call gives: the entity typed as
``_convert_to_entity`` types it (``lean.to_entity``), the same ``{date, etag, version}``
metadata, and the same exceptions, decoded by the SDK's own error decoder (404
``ResourceNotFoundError``, 409 ``ResourceExistsError``, 412 ``ResourceModifiedError``; a
delete of a missing row is not an error, as in the SDK). What it saves: the SDK's model
layer and the pipeline policies that only cost CPU (``docs/lean-storage.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import orjson
from azure.core import MatchConditions
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
    ResourceNotModifiedError,
)
from azure.core.rest import AsyncHttpResponse, HttpRequest
from azure.data.tables import TableEntity, UpdateMode
from azure.data.tables.aio import TableClient

from timeline.storage.wire.egt import entity_json, key_segment
from timeline.storage.wire.lean import _endpoint, _send, to_entity
from timeline.storage.wire.sdk_internals import (
    decode_error,
    deserialize_rfc,
    get_match_condition,
    prep_if_match,
    process_table_error,
    query_str,
    validate_key_values,
    validate_tablename_error,
)

_MINIMAL = "application/json;odata=minimalmetadata"
_CREATE_ERRORS: dict[int, type[HttpResponseError]] = {
    401: ClientAuthenticationError,
    404: ResourceNotFoundError,
    409: ResourceExistsError,
    304: ResourceNotModifiedError,
}
"""The generated ``insert_entity``'s error map: ``create_entity`` raises these undecoded."""


async def get_entity(
    client: TableClient, partition_key: str, row_key: str, *, select: list[str] | None = None
) -> TableEntity:
    """``TableClient.get_entity``: one row by its keys, only ``select``'s properties if given."""
    params = {"$select": quote(",".join(select), safe="")} if select else {}
    request = HttpRequest(
        "GET",
        _row_url(client, partition_key, row_key),
        params=params,
        headers=_headers(client, Accept=_MINIMAL),
    )
    response = await _send(client, request)
    if response.status_code != 200:
        process_table_error(HttpResponseError(response=response), table_name=client.table_name)
    row: dict[str, Any] = orjson.loads(response.content)
    return to_entity(row)


async def create_entity(client: TableClient, entity: Mapping[str, Any]) -> dict[str, Any]:
    """``TableClient.create_entity``: an insert (``POST``), 409 when the row exists."""
    body = entity_json(entity)
    request = HttpRequest(
        "POST",
        f"{_endpoint(client)}/{quote(client.table_name, safe='')}{query_str(client)}",
        headers=_headers(
            client, Accept=_MINIMAL, **{"Content-Type": "application/json;odata=nometadata"}
        ),
        content=body,
    )
    response = await _send(client, request)
    if response.status_code not in (201, 204):
        # The SDK raises the generated client's error, once its decoded form has been checked
        # for missing keys and a bad table name (which raise ``ValueError`` instead).
        error = _CREATE_ERRORS.get(response.status_code, HttpResponseError)(response=response)
        decoded = decode_error(response, error.message)
        validate_key_values(decoded, entity.get("PartitionKey"), entity.get("RowKey"))
        validate_tablename_error(decoded, client.table_name)
        raise error
    return _metadata(response, content=response.status_code == 201)


async def update_entity(
    client: TableClient,
    entity: Mapping[str, Any],
    mode: UpdateMode = UpdateMode.MERGE,
    *,
    etag: str | None = None,
    match_condition: MatchConditions | None = None,
) -> dict[str, Any]:
    """``TableClient.update_entity``: ``PUT`` (replace) or ``PATCH`` (merge) of an existing
    row, ``If-Match`` the etag (412 when it changed) or ``*`` (404 when it is missing)."""
    if match_condition and not etag and isinstance(entity, TableEntity):
        etag = entity.metadata.get("etag")
    condition = get_match_condition(etag, match_condition or MatchConditions.Unconditionally)
    url = _row_url(client, entity["PartitionKey"], entity["RowKey"])
    body = entity_json(entity)
    if mode == UpdateMode.REPLACE:
        method = "PUT"
    elif mode == UpdateMode.MERGE:
        method = "PATCH"
    else:
        raise ValueError(f"Mode type '{mode}' is not supported.")
    headers = _headers(client, Accept="application/json", **{"Content-Type": "application/json"})
    headers["If-Match"] = prep_if_match(etag, condition) or "*"
    request = HttpRequest(method, url, headers=headers, content=body)
    response = await _send(client, request)
    if response.status_code != 204:
        process_table_error(HttpResponseError(response=response), table_name=client.table_name)
    return _metadata(response)


async def delete_entity(
    client: TableClient,
    partition_key: str,
    row_key: str,
    *,
    etag: str | None = None,
    match_condition: MatchConditions | None = None,
) -> None:
    """``TableClient.delete_entity``: ``If-Match`` the etag (412 when it changed) or ``*``;
    a row already missing is not an error (the SDK returns on 404)."""
    condition = get_match_condition(etag, match_condition or MatchConditions.Unconditionally)
    headers = _headers(client, Accept=_MINIMAL)
    headers["If-Match"] = prep_if_match(etag, condition) or "*"
    request = HttpRequest("DELETE", _row_url(client, partition_key, row_key), headers=headers)
    response = await _send(client, request)
    if response.status_code not in (204, 404):
        process_table_error(HttpResponseError(response=response), table_name=client.table_name)


def _row_url(client: TableClient, partition_key: str, row_key: str) -> str:
    """The row's URL, its keys quoted as the SDK quotes them (``'`` doubled, then encoded)."""
    keys = f"PartitionKey='{key_segment(partition_key)}',RowKey='{key_segment(row_key)}'"
    table = quote(client.table_name, safe="")
    return f"{_endpoint(client)}/{table}({keys}){query_str(client)}"


def _headers(client: TableClient, **extra: str) -> dict[str, str]:
    return {"x-ms-version": client.api_version, "DataServiceVersion": "3.0", **extra}


def _metadata(response: AsyncHttpResponse, *, content: bool = False) -> dict[str, Any]:
    """What the SDK's ``_trim_service_metadata`` keeps of a write's answer."""
    headers = response.headers
    date = headers.get("Date")
    result: dict[str, Any] = {
        "date": deserialize_rfc(date) if date else None,
        "etag": headers.get("ETag"),
        "version": headers.get("x-ms-version"),
    }
    preference = headers.get("Preference-Applied")
    if preference:
        result["preference_applied"] = preference
        result["content"] = orjson.loads(response.content) if content else None
    return result
