"""What ``/docs`` shows: every operation in one named group, examples that are valid
input, and how to get a token for "Authorize"."""

from __future__ import annotations

import re
from typing import Any

import pytest
from openapi_spec_validator import validate
from pydantic import BaseModel

from api import schemas
from api.app import openapi_document
from api.openapi_tags import TAGS, tag_of

DOCUMENT = openapi_document(250, 280)
OPERATIONS = [
    (method, path, operation)
    for path, operations in DOCUMENT["paths"].items()
    for method, operation in operations.items()
]


def test_the_document_stays_valid() -> None:
    validate(DOCUMENT)


def test_every_operation_has_one_declared_tag_and_every_tag_is_used() -> None:
    declared = [tag["name"] for tag in DOCUMENT["tags"]]
    assert declared == [name for name, _ in TAGS]
    used = set()
    for method, path, operation in OPERATIONS:
        assert len(operation["tags"]) == 1, (method, path)
        assert operation["tags"][0] in declared, (method, path)
        used.add(operation["tags"][0])
    assert used == set(declared)
    assert "default" not in used


@pytest.mark.parametrize(("path", "tag"), [
    ("/users", "accounts"), ("/users/{user_id}", "accounts"),
    ("/users/{user_id}/tokens/current", "accounts"), ("/users/{user_id}/posts", "posts"),
    ("/users/{user_id}/posts/{post_id}/replies", "posts"), ("/users/{user_id}/reposts", "posts"),
    ("/users/{user_id}/following/{target}", "follows"), ("/users/{user_id}/followers", "follows"),
    ("/users/{user_id}/timeline", "timeline"), ("/users/{user_id}/timeline/stream", "timeline"),
    ("/users/{user_id}/blocks/{target}", "relations"), ("/users/{user_id}/mutes", "relations"),
    ("/users/{user_id}/filters/{filter_id}", "relations"),
    ("/users/{user_id}/markers/home", "markers"), ("/healthz", "operations"),
    ("/users/{user_id}/lists/{list_id}/timeline", "lists"),
    ("/docs", "operations"),
])  # fmt: skip
def test_tags_by_path(path: str, tag: str) -> None:
    assert tag_of(path) == tag


def test_path_examples_are_real_ids_that_match_their_patterns() -> None:
    seen = set()
    for method, path, operation in OPERATIONS:
        for parameter in operation["parameters"]:
            if parameter["in"] != "path":
                continue
            example = parameter.get("example")
            assert isinstance(example, str), (method, path, parameter["name"])
            assert re.fullmatch(parameter["schema"]["pattern"].strip("^$"), example)
            seen.add((parameter["name"], example))
    assert ("user_id", "alice") in seen


def test_request_examples_are_valid_bodies() -> None:
    components: dict[str, Any] = DOCUMENT["components"]["schemas"]
    checked = 0
    for name, schema in components.items():
        for example in schema.get("examples", []):
            model: type[BaseModel] = getattr(schemas, name)
            model.model_validate(example)
            checked += 1
    assert checked >= 4


def test_the_description_says_how_to_authorise() -> None:
    description = DOCUMENT["info"]["description"]
    assert "POST /users" in description
    assert "Authorize" in description
    assert "token" in DOCUMENT["components"]["securitySchemes"]["bearer"]["description"]
