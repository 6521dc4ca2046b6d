"""The OpenAPI 3 document, generated from the route table and the pydantic models."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from api.openapi_tags import annotate
from api.schemas import ErrorBody, PostRequest
from timeline.model.keys import (
    IDEMPOTENCY_KEY_PATTERN,
    LIST_ID_PATTERN,
    POST_FORMAT_CHARACTERS,
    POST_ID_PATTERN,
    USER_ID_PATTERN,
    text_pattern,
)
from timeline.model.tokens import CONTINUATION_PATTERN, MAX_CONTINUATION_CHARS

Handler = Any
PATH_PARAMETERS = {
    "user_id": USER_ID_PATTERN,
    "target": USER_ID_PATTERN,
    "post_id": POST_ID_PATTERN,
    "filter_id": POST_ID_PATTERN,
    "list_id": LIST_ID_PATTERN,
    "member": USER_ID_PATTERN,
}
_REF = "#/components/schemas/{model}"
_RAW_SCHEMAS: dict[str, dict[str, Any]] = {
    "application/json": {"type": "object"},
    "text/plain": {"type": "string"},
    "text/event-stream": {"type": "string"},
    "text/html": {"type": "string"},
}
_STATUS_TEXT = {
    400: "invalid input (a request the HTTP parser itself rejects, such as a request line or "
    "header over 8 KiB, gets aiohttp's plain-text 400)",
    401: "missing, invalid or expired bearer token",
    403: "the token's user may not do this",
    404: "unknown user or post (on /docs: Swagger UI is not installed)",
    409: "conflict with existing state",
    413: "request body too large",
    415: "request body is not JSON",
    422: "the Idempotency-Key was used for a different request within its window",
    429: "rate limited, or (a stream) too many streams of this user (see Retry-After)",
    503: (
        "storage unavailable (a write refused past its deadline sent nothing more: send it "
        "again), or (a stream) too many streams in this process (see Retry-After)"
    ),
}


@dataclass(frozen=True)
class Operation:
    """One route: how aiohttp dispatches it and how OpenAPI describes it."""

    method: str
    path: str
    handler: Handler
    summary: str
    status: int = 200
    response: type[BaseModel] | None = None
    request: type[BaseModel] | None = None
    auth: bool = False
    paged: bool = False
    errors: tuple[int, ...] = ()
    headers: dict[str, str] = field(default_factory=dict)
    raw_content_type: str | None = None
    idempotent: bool = False
    """Takes an ``Idempotency-Key`` header: a retry with the same key repeats nothing."""
    since: bool = False
    """Takes ``since``: only items newer than a position from an earlier page."""
    resumable: bool = False
    """A live stream: ``since`` starts it, a ``Last-Event-ID`` header resumes it."""
    query: tuple[dict[str, Any], ...] = ()
    """Further query parameters, as OpenAPI parameter objects."""
    other_success: tuple[tuple[int, str, type[BaseModel]], ...] = ()
    """Other success answers: (status, when, body)."""
    optional_auth: bool = False
    """Takes a bearer token if sent (a follower then sees followers-only posts); a bad one
    is a 401."""
    head: bool = False
    """Also answers ``HEAD`` (the same status and headers, no body), as load balancers'
    health checks send; not in the OpenAPI document, which describes the ``GET``."""

    def add_to(self, app: web.Application) -> None:
        app.router.add_route(self.method, self.path, self.handler, name=self.operation_id)
        if self.head:
            app.router.add_route("HEAD", self.path, self.handler)

    @property
    def operation_id(self) -> str:
        return self.handler.__name__  # type: ignore[no-any-return]


def build_openapi(
    operations: list[Operation], *, title: str, version: str, page_size: int, max_post_chars: int
) -> dict[str, Any]:
    models: set[type[BaseModel]] = {ErrorBody}
    for operation in operations:
        models.update(m for m in (operation.request, operation.response) if m is not None)
        models.update(body for _, _, body in operation.other_success)
    _, definitions = models_json_schema(
        [(model, "validation") for model in sorted(models, key=lambda m: m.__name__)],
        ref_template=_REF,
    )
    schemas = definitions.get("$defs", {})
    if PostRequest.__name__ in schemas:  # the limit is a setting, so not in the model itself
        post_text = schemas[PostRequest.__name__]["properties"]["text"]
        post_text["pattern"] = text_pattern(max_post_chars, allowed_format=POST_FORMAT_CHARACTERS)
    paths: dict[str, dict[str, Any]] = {}
    for operation in operations:
        paths.setdefault(operation.path, {})[operation.method.lower()] = _describe(
            operation, page_size
        )
    return annotate(
        {
            "openapi": "3.1.0",
            "info": {"title": title, "version": version},
            "paths": paths,
            "components": {
                "schemas": schemas,
                "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            },
        }
    )


def _describe(operation: Operation, page_size: int) -> dict[str, Any]:
    described: dict[str, Any] = {
        "operationId": operation.operation_id,
        "summary": operation.summary,
        "parameters": _parameters(operation, page_size),
        "responses": _responses(operation),
    }
    if operation.auth:
        described["security"] = [{"bearer": []}]
    elif operation.optional_auth:
        described["security"] = [{}, {"bearer": []}]
    if operation.request is not None:
        described["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(operation.request)}},
        }
    return described


def _parameters(operation: Operation, page_size: int) -> list[dict[str, Any]]:
    parameters = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": {"type": "string", "pattern": pattern},
        }
        for name, pattern in PATH_PARAMETERS.items()
        if f"{{{name}}}" in operation.path
    ]
    parameters += operation.query
    if operation.idempotent:
        parameters.append(
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "description": "any unique string (a UUID): a retry of the same request with "
                "the same key within 24 hours returns the first result and changes nothing; "
                "the key with a different request is a 422",
                "schema": {"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN},
            }
        )
    if operation.paged:
        parameters += [
            {
                "name": "limit",
                "in": "query",
                "required": False,
                "schema": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": page_size,
                    "default": page_size,
                },
            },
            {
                "name": "continuation",
                "in": "query",
                "required": False,
                "description": "opaque: the previous page's continuation, as given",
                "schema": {
                    "type": "string",
                    "pattern": CONTINUATION_PATTERN,
                    "maxLength": MAX_CONTINUATION_CHARS,
                },
            },
        ]
    if operation.resumable:
        parameters.append(
            {
                "name": "Last-Event-ID",
                "in": "header",
                "required": False,
                "description": "the id of the last event received: the stream resumes after "
                "it (and sends the look-back window again; dedupe by post_id)",
                "schema": {
                    "type": "string",
                    "pattern": CONTINUATION_PATTERN,
                    "maxLength": MAX_CONTINUATION_CHARS,
                },
            }
        )
    if operation.since:
        parameters.append(
            {
                "name": "since",
                "in": "query",
                "required": False,
                "description": (
                    "opaque: a page's 'newest' (or an event id); the stream sends the items "
                    "newer than it, then each new one"
                    if operation.resumable
                    else "opaque: a page's 'newest' (or a stream event id); only items "
                    "newer than it are returned, newest first, paged down to it"
                ),
                "schema": {
                    "type": "string",
                    "pattern": CONTINUATION_PATTERN,
                    "maxLength": MAX_CONTINUATION_CHARS,
                },
            }
        )
    return parameters


def _responses(operation: Operation) -> dict[str, Any]:
    success: dict[str, Any] = {"description": operation.summary}
    if operation.response is not None:
        success["content"] = {"application/json": {"schema": _ref(operation.response)}}
    elif operation.raw_content_type is not None:
        schema = _RAW_SCHEMAS[operation.raw_content_type]
        success["content"] = {operation.raw_content_type: {"schema": schema}}
    if operation.headers:
        success["headers"] = {
            name: {"description": text, "schema": {"type": "string"}}
            for name, text in operation.headers.items()
        }
    responses: dict[str, Any] = {str(operation.status): success}
    for status, when, body in operation.other_success:
        answer = {"application/json": {"schema": _ref(body)}}
        responses[str(status)] = {"description": when, "content": answer}
    for status in sorted({*operation.errors, *_implied_errors(operation)}):
        content: dict[str, Any] = {"application/json": {"schema": _ref(ErrorBody)}}
        if status == 400:
            content["text/plain"] = {"schema": _RAW_SCHEMAS["text/plain"]}
        responses[str(status)] = {"description": _STATUS_TEXT[status], "content": content}
    return responses


def _implied_errors(operation: Operation) -> set[int]:
    implied = {503}
    if operation.auth:
        implied |= {401, 403}
    if operation.optional_auth:
        implied |= {401}
    if operation.request is not None:
        implied |= {400, 413, 415}
    if operation.paged or operation.since or operation.idempotent or "{" in operation.path:
        implied |= {400}
    return implied


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}
