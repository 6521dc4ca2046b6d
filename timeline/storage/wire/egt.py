"""Entity Group Transaction bodies built as bytes and their replies parsed without ``email``.

The SDK builds every ``$batch`` body as nested ``HttpRequest`` objects serialised through
Python's ``email`` package, and parses the reply the same way: most of a fan-out worker's
CPU. This module writes the same ``multipart/mixed`` changeset directly (one JSON body per
operation, encoded with orjson) and reads the reply's status lines by hand. The wire format
is the one the SDK sends (``docs/lean-storage.md``); each operation is typed and validated
as the SDK would (same ``ValueError``/``TypeError`` before anything is sent).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import orjson
from azure.core import MatchConditions
from azure.data.tables import UpdateMode

from timeline.storage.wire.sdk_internals import add_entity_properties, get_match_condition

_INT32 = 2**31
_CRLF = b"\r\n"


@dataclass(frozen=True, slots=True)
class Part:
    """One operation's answer inside a batch reply."""

    status_code: int
    reason: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def entity_json(entity: Mapping[str, Any]) -> bytes:
    """The entity as the JSON body the SDK sends (ASCII, non-ASCII as ``\\u`` escapes):
    strings, booleans and int32 as JSON values, everything else (int64, floats, datetimes,
    bytes, GUIDs, ``EntityProperty``) typed with an ``@odata.type`` annotation by the SDK's
    own converter."""
    properties: dict[str, Any] = {}
    for name, value in entity.items():
        kind = type(value)
        if kind is str or kind is bool or (kind is int and -_INT32 <= value < _INT32):
            properties[name] = value
        elif value is not None:
            properties.update(add_entity_properties({name: value}))  # the SDK's typing
    body = orjson.dumps(properties)
    if body.isascii():
        return body
    # Non-ASCII escaped as the SDK escapes it: Azurite fails a batch holding raw UTF-8 (500)
    return json.dumps(properties, separators=(",", ":")).encode()


def key_segment(value: Any) -> str:
    """A key as the SDK puts it in a row's URL: ``'`` doubled, then percent-encoded."""
    if not isinstance(value, str):
        raise TypeError("PartitionKey or RowKey must be of type string.")
    return quote(value.replace("'", "''"), safe="")


def row_keys(entity: Mapping[str, Any]) -> str:
    """``PartitionKey='...',RowKey='...'``: a row's keys in its URL, as the SDK writes them."""
    partition, row = key_segment(entity["PartitionKey"]), key_segment(entity["RowKey"])
    return f"PartitionKey='{partition}',RowKey='{row}'"


def _if_match(entity: Mapping[str, Any], options: Mapping[str, Any]) -> str:
    """The ``If-Match`` of an update or delete: the etag (quoted as the SDK quotes it) for
    ``IfNotModified``, else ``*``."""
    etag = options.get("etag")
    condition = options.get("match_condition")
    if condition and not etag:
        metadata = getattr(entity, "metadata", None)
        etag = metadata.get("etag") if metadata else None
    condition = get_match_condition(etag, condition or MatchConditions.Unconditionally)
    if condition != MatchConditions.IfNotModified or etag is None:
        return "*"
    if etag.startswith(("W/", '"', "'")):
        return str(etag)
    return f'"{etag}"'


def _mode(options: Mapping[str, Any], default: UpdateMode) -> str:
    mode = options.get("mode", default)
    if mode == UpdateMode.REPLACE:
        return "PUT"
    if mode == UpdateMode.MERGE:
        return "PATCH"
    raise ValueError(f"Mode type '{mode}' is not supported.")


def _request(operation: Sequence[Any], table_url: str) -> tuple[str, str, list[str], bytes]:
    """Method, URL, extra headers and body of one SDK-style transaction operation."""
    kind, entity = operation[0], operation[1]
    options: Mapping[str, Any] = operation[2] if len(operation) > 2 else {}
    kind = str(getattr(kind, "value", kind)).lower()
    row_url = f"{table_url}({row_keys(entity)})"
    if kind == "upsert":
        return _mode(options, UpdateMode.MERGE), row_url, [], entity_json(entity)
    if kind == "update":
        method = _mode(options, UpdateMode.MERGE)
        return method, row_url, [f"If-Match: {_if_match(entity, options)}"], entity_json(entity)
    if kind == "delete":
        return "DELETE", row_url, [f"If-Match: {_if_match(entity, options)}"], b""
    if kind == "create":
        return "POST", table_url, [], entity_json(entity)
    raise ValueError(f"Unrecognized operation: {operation[0]}")


def _check_keys(operations: Sequence[Sequence[Any]]) -> None:
    partition: Any = None
    for operation in operations:
        entity = operation[1]
        if "PartitionKey" not in entity or "RowKey" not in entity:
            raise ValueError("PartitionKey and/or RowKey were not provided in entity")
        if partition is None:
            partition = entity["PartitionKey"]
        elif entity["PartitionKey"] != partition:
            raise ValueError("Partition Keys in the batch must all be the same.")


def build_batch(
    endpoint: str, table: str, operations: Sequence[Sequence[Any]], version: str
) -> tuple[str, bytes]:
    """The ``Content-Type`` and body of a ``$batch`` request holding one changeset of
    ``operations`` (``(kind, entity)`` or ``(kind, entity, options)``, as the SDK takes)."""
    _check_keys(operations)
    batch, changeset = f"batch_{uuid.uuid4()}", f"changeset_{uuid.uuid4()}"
    table_url = f"{endpoint}/{quote(table, safe='')}"
    head = f"x-ms-version: {version}\r\nDataServiceVersion: 3.0\r\nAccept: application/json\r\n"
    chunks: list[bytes] = [
        f"--{batch}\r\nContent-Type: multipart/mixed; boundary={changeset}\r\n\r\n".encode()
    ]
    for index, operation in enumerate(operations):
        method, url, extra, body = _request(operation, table_url)
        lines = [
            f"--{changeset}\r\nContent-Type: application/http\r\n"
            f"Content-Transfer-Encoding: binary\r\nContent-ID: {index}\r\n\r\n"
            f"{method} {url} HTTP/1.1\r\n{head}",
            *(f"{line}\r\n" for line in extra),
        ]
        if body:
            lines.append(f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n")
        chunks.append("".join(lines).encode() + _CRLF + body + _CRLF)
    chunks.append(f"--{changeset}--\r\n\r\n--{batch}--\r\n".encode())
    return f"multipart/mixed; boundary={batch}", b"".join(chunks)


def _boundary(content_type: str) -> bytes:
    for parameter in content_type.split(";")[1:]:
        name, _, value = parameter.strip().partition("=")
        if name.lower() == "boundary":
            return value.strip('"').encode()
    raise ValueError(f"a multipart reply without a boundary: {content_type}")


def _sections(body: bytes, boundary: bytes) -> list[bytes]:
    """The parts between ``--boundary`` delimiters (preamble and epilogue dropped)."""
    delimiter = b"--" + boundary
    pieces = body.split(delimiter)[1:]
    return [piece.strip(b"\r\n") for piece in pieces if not piece.startswith(b"--")]


def _head(block: bytes) -> tuple[list[bytes], bytes]:
    """The header lines and the rest of a MIME or HTTP block."""
    head, _, rest = block.partition(b"\r\n\r\n")
    return head.split(_CRLF), rest


def _headers(lines: list[bytes]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return headers


def _http_part(block: bytes) -> Part:
    """One ``application/http`` part: its MIME headers, then a whole HTTP response."""
    _, http = _head(block)
    lines, body = _head(http)
    status = lines[0].decode("latin-1").split(" ", 2)
    reason = status[2] if len(status) > 2 else ""
    return Part(int(status[1]), reason, _headers(lines[1:]), body.rstrip(_CRLF))


def parse_batch(content_type: str, body: bytes) -> list[Part]:
    """The operations' answers in a ``$batch`` reply, changesets flattened, in order."""
    parts: list[Part] = []
    for section in _sections(body, _boundary(content_type)):
        lines, rest = _head(section)
        headers = _headers(lines)
        inner = headers.get("content-type", "")
        if inner.lower().startswith("multipart/mixed"):
            parts += parse_batch(inner, rest)
        else:
            parts.append(_http_part(section))
    return parts
