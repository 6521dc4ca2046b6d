"""What makes ``/docs`` readable: tags that group the operations, real examples, and how to
authorise, added to the OpenAPI document that ``api.openapi`` generates from the routes."""

from __future__ import annotations

from typing import Any

TAGS: tuple[tuple[str, str], ...] = (
    ("accounts", "Register, read a profile, sign out (revoke tokens)"),
    ("posts", "Publish, read and delete posts; replies and reposts"),
    ("follows", "Follow and unfollow, follow requests to locked users; who follows whom"),
    ("timeline", "The home timeline: pages, `since` and the live stream"),
    ("relations", "Blocks, mutes and keyword filters: what a user does not see"),
    ("markers", "Where the user stopped reading, shared by its devices"),
    ("lists", "Lists: private timelines of chosen members, followed or not"),
    ("operations", "Health, readiness, metrics and this description"),
)

# (path segment after /users/{user_id}, tag): the first match of an operation's path wins.
_SEGMENT_TAGS = (
    ("lists", "lists"),
    ("timeline", "timeline"),
    ("markers", "markers"),
    ("following", "follows"),
    ("followers", "follows"),
    ("follow_requests", "follows"),
    ("blocks", "relations"),
    ("mutes", "relations"),
    ("filters", "relations"),
    ("posts", "posts"),
    ("reposts", "posts"),
    ("tokens", "accounts"),
)

EXAMPLE_USER = "alice"
EXAMPLE_TARGET = "bob"
EXAMPLE_POST_ID = "08de2f3c4b5a6d7e8f9a0b1c2d"
"""A well-formed post id (creation ticks in 16 hex digits, then 40 random bits)."""

PATH_EXAMPLES = {
    "user_id": EXAMPLE_USER,
    "target": EXAMPLE_TARGET,
    "post_id": EXAMPLE_POST_ID,
    "filter_id": EXAMPLE_POST_ID,
    "list_id": "0a1b2c3d4e5f6a7b8c9",
    "member": EXAMPLE_TARGET,
}

DESCRIPTION = """\
A home timeline service with fan-out on write: users post, follow each other and read
their home timeline as pages, with `since` or as a live stream.

**How to authorise.** `POST /users` registers a user id and returns a `token` (try it out
under *accounts*: the answer's `token` field). Click **Authorize**, paste the token (without
`Bearer `) and close the dialog: every operation marked with a lock now sends it. A token
acts only as its own user: use that user id as `user_id` (another id is a 403). A token
lasts `TIMELINE_TOKEN_TTL_S`; register again (or sign in on the web client) for a new one.

Errors are `{"error": {"code", "message"}}`. Pages are `{"items", "continuation"}`: pass
`continuation` back, as given, for the next page.
"""

# Request bodies as a user would write them (each valid against its schema).
REQUEST_EXAMPLES: dict[str, dict[str, Any]] = {
    "RegisterRequest": {"user_id": EXAMPLE_USER, "display_name": "Alice"},
    "PostRequest": {"text": "Hello, timeline!"},
    "RepostRequest": {"author": EXAMPLE_TARGET, "post_id": EXAMPLE_POST_ID},
    "MuteRequest": {"expires_at": "2030-01-01T00:00:00Z", "reposts": True},
    "FilterRequest": {"phrase": "spoiler", "expires_at": "2030-01-01T00:00:00Z"},
    "ProfileEdit": {"display_name": "Alice A.", "locked": True},
    "ListRequest": {"title": "Close friends", "exclusive": False},
    "ListEdit": {"title": "Friends", "exclusive": True},
}


def tag_of(path: str) -> str:
    """The group an operation's path belongs to."""
    parts = [part for part in path.split("/") if part]
    if not parts or parts[0] != "users":
        return "operations"
    for segment, tag in _SEGMENT_TAGS:
        if segment in parts[2:]:
            return tag
    return "accounts"  # /users and /users/{user_id}


def annotate(document: dict[str, Any]) -> dict[str, Any]:
    """Add tags, examples and the description to a generated document (in place)."""
    document["info"]["description"] = DESCRIPTION
    document["tags"] = [{"name": name, "description": text} for name, text in TAGS]
    for path, operations in document["paths"].items():
        for operation in operations.values():
            operation["tags"] = [tag_of(path)]
            for parameter in operation.get("parameters", []):
                value = PATH_EXAMPLES.get(parameter["name"])
                if parameter["in"] == "path" and value is not None:
                    parameter["example"] = value
    schemas = document["components"]["schemas"]
    for name, example in REQUEST_EXAMPLES.items():
        if name in schemas:
            schemas[name]["examples"] = [example]
    schemes = document["components"]["securitySchemes"]
    for scheme in schemes.values():
        scheme["description"] = "the `token` that `POST /users` returns"
    return document
