"""A lean request sender for a table or queue client: the SDK's and azure-core's own policies
and transport, without the per-request ones that cost CPU and do nothing for our calls.

A ``TableClient``'s pipeline runs thirteen policies per request. Profiled on live fan-out
(one upsert per delivery), the ones that cost CPU without changing the request are the
user agent, redirect handling (storage never redirects), secondary-host bookkeeping (we
read the primary only), the custom hook (our lean calls pass none), network-trace and HTTP
logging (off, but each still runs per request), distributed tracing, and the content-decode
policy (our lean calls decode what they need themselves). What stays is what the request
needs, taken from the client itself: a request id, the storage date headers, the proxy
settings, the client's own credential policy (shared key, SAS or token), a copy of its retry
policy (same settings: which statuses, how many times, the backoff) and its transport (the
same aiohttp session and connection pool). Why: ``docs/lean-storage.md``.

The one policy replaced rather than kept is the request id: azure-core's ``RequestIdPolicy``
(and the queue SDK's headers policy) make a ``uuid1`` per request, about 5% of a lean
request's CPU. The service needs no client request id; it only echoes it and logs it, for
matching a request to the storage logs. A lean request keeps one, made cheaply: a random
prefix per sender and a counter (``CheapRequestId``).
"""

from __future__ import annotations

import copy
import itertools
import uuid
from time import time
from typing import Any
from wsgiref.handlers import format_date_time

from azure.core.pipeline import AsyncPipeline, PipelineRequest
from azure.core.pipeline.policies import (
    AsyncHTTPPolicy,
    AsyncRedirectPolicy,
    ContentDecodePolicy,
    CustomHookPolicy,
    DistributedTracingPolicy,
    HttpLoggingPolicy,
    NetworkTraceLoggingPolicy,
    RequestIdPolicy,
    SansIOHTTPPolicy,
    UserAgentPolicy,
)
from azure.core.pipeline.transport import AsyncHttpTransport
from azure.core.rest import AsyncHttpResponse, HttpRequest
from azure.data.tables.aio import TableClient
from azure.storage.queue.aio import QueueClient

from timeline.storage.wire.sdk_internals import (
    StorageHosts,
    queue_credential_policy,
    queue_proxy_policy,
    queue_retry_policy,
    queue_transport,
    table_policies,
    table_transport,
)

_DROPPED = (
    UserAgentPolicy,
    ContentDecodePolicy,
    AsyncRedirectPolicy,
    StorageHosts,
    CustomHookPolicy,
    NetworkTraceLoggingPolicy,
    DistributedTracingPolicy,
    HttpLoggingPolicy,
)
"""Policies a lean request goes without (see the module docstring)."""


class LeanSender:
    """Sends ``azure.core.rest.HttpRequest`` objects with absolute URLs through a short
    pipeline of ``policies`` and a shared ``transport``; answers are read whole."""

    def __init__(self, policies: list[Any], transport: AsyncHttpTransport[Any, Any]) -> None:
        self._pipeline: AsyncPipeline[Any, Any] = AsyncPipeline(
            transport=_Shared(transport), policies=policies
        )

    async def send(self, request: HttpRequest) -> AsyncHttpResponse:
        """One request, retried as the client retries it; the answer's body read."""
        response: AsyncHttpResponse = (
            await self._pipeline.run(request, stream=False)
        ).http_response
        return response


def table_sender(client: TableClient) -> LeanSender:
    """``client``'s own policies less the dropped ones, its request id made cheaply."""
    policies = [_own(policy) for policy in table_policies(client) if _kept(policy)]
    return LeanSender(policies, table_transport(client))


def queue_sender(client: QueueClient) -> LeanSender:
    """A queue client's proxy settings, a copy of its retry policy, the storage date with a
    cheap request id (in place of its headers policy's ``uuid1``), its credential policy
    and its transport, in the order its own pipeline runs them (date and signature per
    try). Left out as for tables, and its content-validation and response hooks (no lean
    call asks for a checksum or passes a hook) and range and message-id rewriting (lean
    URLs are whole)."""
    policies = [
        queue_proxy_policy(client),
        copy.copy(queue_retry_policy(client)),
        StorageDate(),
        CheapRequestId(),
        _own(queue_credential_policy(client)),
    ]
    return LeanSender(
        [policy for policy in policies if policy is not None], queue_transport(client)
    )


class CheapRequestId(SansIOHTTPPolicy[Any, Any]):
    """``x-ms-client-request-id``: a random prefix per sender and a counter, unique as
    ``uuid1`` is, for a fraction of its cost."""

    def __init__(self) -> None:
        self._prefix = uuid.uuid4().hex[:16]
        self._count = itertools.count()

    def on_request(self, request: PipelineRequest[Any]) -> None:
        request.http_request.headers["x-ms-client-request-id"] = (
            f"{self._prefix}-{next(self._count)}"
        )


class StorageDate(SansIOHTTPPolicy[Any, Any]):
    """``x-ms-date``, which the shared-key signature covers, set on every try."""

    def on_request(self, request: PipelineRequest[Any]) -> None:
        request.http_request.headers["x-ms-date"] = format_date_time(time())


def _kept(policy: Any) -> bool:
    return policy is not None and not isinstance(policy, _DROPPED)


def _own(policy: Any) -> Any:
    """The request id made cheaply (``CheapRequestId``). A policy that chains to the next
    one (retry, token) is copied, so linking it into this
    pipeline leaves the client's own pipeline as it was; stateless ones are shared."""
    if isinstance(policy, RequestIdPolicy):
        return CheapRequestId()
    if isinstance(policy, SansIOHTTPPolicy) or not isinstance(policy, AsyncHTTPPolicy):
        return policy
    return copy.copy(policy)


class _Shared(AsyncHttpTransport[Any, Any]):
    """The client's transport, shared: this pipeline never opens or closes it (the client
    and ``Clients`` own it), as the SDK's own ``AsyncTransportWrapper`` does."""

    def __init__(self, transport: AsyncHttpTransport[Any, Any]) -> None:
        self._transport = transport

    async def send(self, request: Any, **kwargs: Any) -> Any:
        return await self._transport.send(request, **kwargs)

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def __aexit__(self, *args: Any) -> None:
        pass
