"""Queue calls on the lean path: receive, send, update and delete of messages, each a
hand-built request through the queue client's lean sender (``timeline.storage.wire.pipeline``).

Each is the request the queue SDK sends (method, URL, query, headers, XML body) and gives
back what its call gives: ``QueueMessage`` objects with the same fields (id, pop receipt,
content, dequeue count, insertion, expiry and next-visible times), the content encoded
and decoded by the client's own message policies, and the same exceptions (the generated
client's error map, then the SDK's ``process_storage_error``: 404 ``ResourceNotFoundError``
for a stale pop receipt or a missing queue, 413 ``RequestBodyTooLarge``, ...). What it
saves: the SDK's XML model layer (its deserialiser builds a generated model per field) and
the per-request policies that only cost CPU. Why: ``docs/lean-storage.md``.
"""

from __future__ import annotations

import email.utils
import functools
from datetime import UTC, datetime
from typing import Any, NoReturn
from urllib.parse import quote
from xml.etree.ElementTree import Element, fromstring
from xml.sax.saxutils import escape

from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
    ResourceNotModifiedError,
    map_error,
)
from azure.core.rest import AsyncHttpResponse, HttpRequest
from azure.storage.queue import QueueMessage
from azure.storage.queue.aio import QueueClient

from timeline.storage.wire.pipeline import LeanSender, queue_sender
from timeline.storage.wire.sdk_internals import (
    QueueErrorModel,
    failsafe_deserialize_xml,
    process_storage_error,
    query_str,
    queue_decoder,
    queue_encode,
)

_ERROR_MAP: dict[int, type[HttpResponseError]] = {
    401: ClientAuthenticationError,
    404: ResourceNotFoundError,
    409: ResourceExistsError,
    304: ResourceNotModifiedError,
}
"""The generated client's error map, raised (then remapped by the SDK) before anything else."""
_XML = "application/xml"
_MONTHS = {
    name: number
    for number, name in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}


async def receive_messages(
    client: QueueClient, count: int, visibility_timeout: int
) -> list[QueueMessage]:
    """One receive of up to ``count`` (≤ 32) messages, leased for ``visibility_timeout``
    seconds (the SDK's pager would ask again until it has ``count`` or the queue is empty)."""
    request = HttpRequest(
        "GET",
        _messages_url(client),
        params={"numofmessages": str(count), "visibilitytimeout": str(visibility_timeout)},
        headers={"x-ms-version": client.api_version, "Accept": _XML},
    )
    response = await _send(client, request)
    if response.status_code != 200:
        _raise(response)
    decode = queue_decoder(client)
    answer: Any = response  # the decoder only keeps it on its DecodeError
    return [
        _message(fields, decode(fields.get("MessageText") or "", answer))
        for fields in _items(response.content)
    ]


async def send_message(
    client: QueueClient,
    content: str,
    *,
    visibility_timeout: int | None = None,
    time_to_live: int | None = None,
) -> QueueMessage:
    """``QueueClient.send_message``: the message enqueued, its id and times as sent back."""
    params = {}
    if visibility_timeout is not None:
        params["visibilitytimeout"] = str(visibility_timeout)
    if time_to_live is not None:
        params["messagettl"] = str(time_to_live)
    request = HttpRequest(
        "POST",
        _messages_url(client),
        params=params,
        headers={"Content-Type": _XML, "x-ms-version": client.api_version, "Accept": _XML},
        content=_body(client, content),
    )
    response = await _send(client, request)
    if response.status_code != 201:
        _raise(response)
    return _message(_items(response.content)[0], content)


async def update_message(
    client: QueueClient,
    message: QueueMessage,
    content: str | None = None,
    *,
    visibility_timeout: int | None = None,
) -> QueueMessage:
    """``QueueClient.update_message``: a new lease (and new content, if given) under the
    message's pop receipt; the message with the new receipt and next-visible time."""
    if message.pop_receipt is None:
        raise ValueError("pop_receipt must be present")
    text = content or message.content
    headers = {"x-ms-version": client.api_version}
    body = None
    if text is not None:
        headers["Content-Type"] = _XML
        body = _body(client, text)
    request = HttpRequest(
        "PUT",
        _message_url(client, message.id),
        params={
            "popreceipt": quote(message.pop_receipt, safe=""),
            "visibilitytimeout": str(visibility_timeout or 0),
        },
        headers=headers,
        content=body,
    )
    response = await _send(client, request)
    if response.status_code != 204:
        _raise(response)
    return QueueMessage(
        content=text,
        id=message.id,
        inserted_on=message.inserted_on,
        dequeue_count=message.dequeue_count,
        expires_on=message.expires_on,
        pop_receipt=response.headers.get("x-ms-popreceipt"),
        next_visible_on=_date(response.headers.get("x-ms-time-next-visible")),
    )


async def delete_message(client: QueueClient, message: QueueMessage) -> None:
    """``QueueClient.delete_message``: 404 when the pop receipt is stale or the message gone."""
    if message.pop_receipt is None:
        raise ValueError("pop_receipt must be present")
    request = HttpRequest(
        "DELETE",
        _message_url(client, message.id),
        params={"popreceipt": quote(message.pop_receipt, safe="")},
        headers={"x-ms-version": client.api_version},
    )
    response = await _send(client, request)
    if response.status_code != 204:
        _raise(response)


def _messages_url(client: QueueClient) -> str:
    name = quote(client.queue_name, safe="")
    return f"{client.scheme}://{client.primary_hostname}/{name}/messages{query_str(client)}"


def _message_url(client: QueueClient, message_id: str) -> str:
    name, key = quote(client.queue_name, safe=""), quote(message_id, safe="")
    return f"{client.scheme}://{client.primary_hostname}/{name}/messages/{key}{query_str(client)}"


def _body(client: QueueClient, content: str) -> bytes:
    """The XML the SDK sends (``ET.tostring`` of its model): the text escaped, UTF-8."""
    encoded = queue_encode(client, content)
    return (
        b"<?xml version='1.0' encoding='utf-8'?>\n<QueueMessage><MessageText>"
        + escape(encoded).encode()
        + b"</MessageText></QueueMessage>"
    )


def _items(content: bytes) -> list[dict[str, str]]:
    """Each ``QueueMessage`` element of a ``QueueMessagesList`` as its fields' texts."""
    root: Element = fromstring(content)  # noqa: S314 - our own account's answers
    return [{field.tag: field.text or "" for field in item} for item in root]


def _message(fields: dict[str, str], content: Any) -> QueueMessage:
    dequeue_count = fields.get("DequeueCount")
    return QueueMessage(
        content=content,
        id=fields.get("MessageId"),
        inserted_on=_date(fields.get("InsertionTime")),
        expires_on=_date(fields.get("ExpirationTime")),
        dequeue_count=int(dequeue_count) if dequeue_count else None,
        pop_receipt=fields.get("PopReceipt"),
        next_visible_on=_date(fields.get("TimeNextVisible")),
    )


@functools.lru_cache(maxsize=1024)
def _date(text: str | None) -> datetime | None:
    """An RFC 1123 date (``Wed, 25 Nov 2026 19:38:06 GMT``) as the SDK gives it, in UTC;
    read by position (``email.utils`` for any other shape). Cached: a receive's messages
    share a few seconds, and datetimes are immutable."""
    if not text:
        return None
    month = _MONTHS.get(text[8:11])
    if len(text) == 29 and month and text.endswith(" GMT"):
        return datetime(
            int(text[12:16]),
            month,
            int(text[5:7]),
            int(text[17:19]),
            int(text[20:22]),
            int(text[23:25]),
            tzinfo=UTC,
        )
    return email.utils.parsedate_to_datetime(text)


async def _send(client: QueueClient, request: HttpRequest) -> AsyncHttpResponse:
    """Through the client's lean sender (``timeline.storage.wire.pipeline``), read whole."""
    sender: LeanSender | None = getattr(client, "lean_sender", None)
    if sender is None:
        sender = queue_sender(client)
        client.lean_sender = sender  # type: ignore[attr-defined]
    return await sender.send(request)


def _raise(response: AsyncHttpResponse) -> NoReturn:
    """The generated client's error (its map, else with the decoded XML error), remapped by
    the SDK's ``process_storage_error`` as every queue call's error is."""
    try:
        map_error(status_code=response.status_code, response=response, error_map=_ERROR_MAP)
        error = failsafe_deserialize_xml(QueueErrorModel, response)
        raise HttpResponseError(response=response, model=error)
    except HttpResponseError as error:
        process_storage_error(error)
