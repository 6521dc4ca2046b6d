"""A lean request sender for a table client: the SDK's and azure-core's own policies and
transport, without the per-request ones that cost CPU and do nothing for our calls.

A ``TableClient``'s pipeline runs thirteen policies per request. Profiled on live fan-out
(one upsert per delivery), the ones that cost CPU without changing the request are the
user agent, redirect handling (storage never redirects), secondary-host bookkeeping (we
read the primary only), the custom hook (our lean calls pass none), network-trace and HTTP
logging (off, but each still runs per request), distributed tracing, and the content-decode
policy (our lean calls decode what they need themselves). What stays is what the request
needs, taken from the client itself: the request id, the storage date headers, the proxy
settings, the client's own credential policy (shared key, SAS or token), a copy of its retry
policy (same settings: which statuses, how many times, the backoff) and its transport (the
same aiohttp session and connection pool). Why: ``docs/lean-storage.md``.
"""

from __future__ import annotations

import copy
from typing import Any

from azure.core.pipeline import AsyncPipeline
from azure.core.pipeline.policies import (
    AsyncHTTPPolicy,
    AsyncRedirectPolicy,
    ContentDecodePolicy,
    CustomHookPolicy,
    DistributedTracingPolicy,
    HttpLoggingPolicy,
    NetworkTraceLoggingPolicy,
    SansIOHTTPPolicy,
    UserAgentPolicy,
)
from azure.core.pipeline.transport import AsyncHttpTransport
from azure.core.rest import AsyncHttpResponse, HttpRequest
from azure.data.tables._policies import StorageHosts
from azure.data.tables.aio import TableClient

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
    pipeline built from ``client``'s own policies and transport; answers are read whole."""

    def __init__(self, client: TableClient) -> None:
        generated: Any = client._client
        transport: AsyncHttpTransport[Any, Any] = generated._client._pipeline._transport
        policies = [_own(policy) for policy in client._policies if _kept(policy)]
        self._pipeline: AsyncPipeline[Any, Any] = AsyncPipeline(
            transport=_Shared(transport), policies=policies
        )

    async def send(self, request: HttpRequest) -> AsyncHttpResponse:
        """One request, retried as the client retries it; the answer's body read."""
        response: AsyncHttpResponse = (
            await self._pipeline.run(request, stream=False)
        ).http_response
        return response


def _kept(policy: Any) -> bool:
    return policy is not None and not isinstance(policy, _DROPPED)


def _own(policy: Any) -> Any:
    """A policy that chains to the next one (retry, token) is copied, so linking it into this
    pipeline leaves the client's own pipeline as it was; stateless ones are shared."""
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
