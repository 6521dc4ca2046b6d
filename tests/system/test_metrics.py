"""``/metrics``: requests by route template and status, and each process role's own series."""

from __future__ import annotations

import secrets
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from api.middleware import MIDDLEWARES, echo_request_id
from fanout_worker.metrics import worker_registry
from tests.conftest import unique

Client = TestClient[Any, Any]
REQUESTS = "timeline_http_requests_total"
LATENCY = "timeline_http_request_duration_seconds"


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape by name and labels."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


async def scrape(client: Client) -> tuple[str, dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    response = await client.get("/metrics")
    assert response.status == 200
    text = await response.text()
    return text, samples(text)


async def test_requests_are_counted_and_timed_by_route_template_and_status(
    client: Client,
) -> None:
    user, junk = unique(), f"junk-{secrets.token_hex(5)}"
    _, before = await scrape(client)
    assert (await client.get(f"/users/{user}")).status == 404  # an error made JSON
    assert (await client.post("/users", json={"user_id": user})).status == 201
    assert (await client.get(f"/users/{user}")).status == 200
    assert (await client.get(f"/{junk}/{junk}")).status == 404  # no route at all
    assert (await client.patch(f"/users/{junk}/posts")).status == 405
    assert (await client.request("PROPFIND", "/users")).status == 405  # a WebDAV method
    text, after = await scrape(client)

    counted = {
        ("GET", "/users/{user_id}", "404"): 1,
        ("GET", "/users/{user_id}", "200"): 1,
        ("POST", "/users", "201"): 1,
        ("GET", "unmatched", "404"): 1,
        ("PATCH", "unmatched", "405"): 1,
        ("other", "unmatched", "405"): 1,
        ("GET", "/metrics", "200"): 1,  # the first scrape
    }
    for (method, route, status), count in counted.items():
        labels = {"method": method, "route": route, "status": status}
        for name in (REQUESTS, f"{LATENCY}_count"):
            grown = after[key(name, **labels)] - before.get(key(name, **labels), 0.0)
            assert grown == count, (name, labels)
        assert after[key(f"{LATENCY}_bucket", **labels, le="+Inf")] >= count
    assert user not in text  # paths are never labels
    assert junk not in text
    assert "PROPFIND" not in text


async def test_the_api_serves_no_fanout_series_and_the_worker_serves_both() -> None:
    """The API's /metrics is the default registry; a worker's adds the fan-out's own."""
    api = {family.name for family in text_string_to_metric_families(generate_latest().decode())}
    assert "timeline_storage_requests" in api  # (counter names lose _total when parsed)
    assert "timeline_messages_sent" in api
    assert not [name for name in api if name.startswith("fanout_")]

    served = generate_latest(worker_registry()).decode()
    worker = {family.name for family in text_string_to_metric_families(served)}
    assert {"fanout_deliveries", "fanout_delivery_lag_seconds", "fanout_trim_requests"} <= worker
    assert {"fanout_messages", "fanout_in_flight_messages", "fanout_queue_depth"} <= worker
    assert {"timeline_storage_requests", "process_cpu_seconds"} <= worker


async def test_streamed_responses_are_counted_not_timed_and_redirects_are_counted() -> None:
    """A response the handler streams itself (Server-Sent Events, say) lasts as long as the
    stream: counted, but its duration is no latency. A redirect passes the error middleware
    as an exception and is counted all the same."""
    route = f"/stream-{secrets.token_hex(4)}/{{name}}"

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: hello\n\n")
        return response

    async def moved(_request: web.Request) -> web.Response:
        raise web.HTTPFound("/elsewhere")

    app = web.Application(middlewares=MIDDLEWARES)
    app.on_response_prepare.append(echo_request_id)
    app.router.add_get(route, stream)
    app.router.add_get(f"{route}/moved", moved)
    async with TestClient(TestServer(app)) as client:
        response = await client.get(route.format(name="a"))
        assert (response.status, await response.text()) == (200, "data: hello\n\n")
        assert response.headers["X-Request-Id"]
        redirect = await client.get(route.format(name="b") + "/moved", allow_redirects=False)
        assert redirect.status == 302
        assert redirect.headers["X-Request-Id"]
    scraped = samples(generate_latest().decode())
    streamed = {"method": "GET", "route": route, "status": "200"}
    assert scraped[key(REQUESTS, **streamed)] == 1
    assert key(f"{LATENCY}_count", **streamed) not in scraped
    redirected = {"method": "GET", "route": f"{route}/moved", "status": "302"}
    assert scraped[key(REQUESTS, **redirected)] == 1
    assert scraped[key(f"{LATENCY}_count", **redirected)] == 1
