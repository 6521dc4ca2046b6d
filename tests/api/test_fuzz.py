"""Schemathesis fuzzing of the running API from its own ``/openapi.json``.

Every generated request (valid and invalid, per the documented schemas) must get a
documented status (never a 5xx), the documented content type and a body matching the
documented schema. The examples are bounded and derandomized, so a run is repeatable:
``make test`` sends a few per operation, ``make test-long`` the full size.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings

from api.app import openapi_document
from tests.conftest import TEST_SECRET, program_env, unique
from tests.helpers import bearer
from timeline.tools.azurite import Azurite, free_ports

EXAMPLES_PER_OPERATION = 40
"""At full size (``make test-long``); the quick twins take ``QUICK_EXAMPLES``."""
QUICK_EXAMPLES = 4
PAGE_SIZE = 250
MAX_POST_CHARS = 280


@dataclass
class LiveApi:
    base_url: str
    user_id: str
    token: str
    requests_sent: Counter[int] = field(default_factory=Counter)
    """Requests sent, by the examples per operation of the test that sent them."""
    cases_run: defaultdict[int, set[str]] = field(default_factory=lambda: defaultdict(set))
    """The cases (operation, with or without credentials) fuzzed in this process, by the
    examples per operation: with xdist each worker runs a share of them."""


def _wait_ready(base_url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if requests.get(f"{base_url}/readyz", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("the API did not become ready")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def live_api(azurite: Azurite, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApi]:
    """``python -m api`` on the session's Azurite, with one registered user."""
    port = free_ports(1)[0]
    env = program_env(
        storage_connection_string=azurite.connection_string,
        data_dir=tmp_path_factory.mktemp("fuzz"),
        auth_secret=TEST_SECRET,
        port=port,
        posts_per_minute=0,
        page_size=PAGE_SIZE,
        max_post_chars=MAX_POST_CHARS,
    )
    command = [sys.executable, "-m"]
    subprocess.run([*command, "timeline.tools.cli", "init"], env=env, check=True, timeout=60)  # noqa: S603
    api = subprocess.Popen([*command, "api"], env=env, stderr=subprocess.DEVNULL)  # noqa: S603
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base_url)
        user_id = unique("fuzz")
        registered = requests.post(f"{base_url}/users", json={"user_id": user_id}, timeout=10)
        assert registered.status_code == 201, registered.text
        served = requests.get(f"{base_url}/openapi.json", timeout=10).json()
        assert served == DOCUMENT, "the fuzzed document is the one the API serves"
        live = LiveApi(base_url, user_id, registered.json()["token"])
        yield live
        print(f"fuzzing sent {dict(live.requests_sent)} requests (by examples per operation)")
        for examples, sent in live.requests_sent.items():  # this process's share of cases
            assert sent >= len(live.cases_run[examples]) * examples / 4, (
                "fuzzing ran too few examples"
            )
    finally:
        api.terminate()
        assert api.wait(timeout=30) == 0


DOCUMENT = openapi_document(PAGE_SIZE, MAX_POST_CHARS)
schema = schemathesis.openapi.from_dict(DOCUMENT)


def bounded(examples: int) -> settings:
    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


def _call_and_validate(
    case: schemathesis.Case[Any],
    live_api: LiveApi,
    examples: int,
    *,
    modified: bool = False,
    **options: Any,
) -> None:
    """Run every check, except those that cannot hold here. A generated continuation,
    ``since`` or read marker ``position`` need not be accepted: it is signed, so only one the
    API issued is valid (any other is a documented 400); nor need a generated
    ``Idempotency-Key``: the fuzzer sends one key with several bodies, and the key with a
    second body is a documented 422; nor a mute's ``expires_at``, which must also lie in the
    future (else a documented 400). A ``modified`` case may have had its invalid parts made
    valid, so it need not be rejected."""
    excluded = []
    expiring = isinstance(case.body, dict) and case.body.get("expires_at") is not None
    if (
        (case.query and {"continuation", "since"} & set(case.query))
        or (case.headers and "Idempotency-Key" in case.headers)
        or (isinstance(case.body, dict) and "position" in case.body)
        or expiring
    ):
        excluded.append(schemathesis.checks.positive_data_acceptance)
    if modified:
        excluded.append(schemathesis.checks.negative_data_rejection)
    live_api.requests_sent[examples] += 1
    live_api.cases_run[examples].add(f"{case.method} {case.path} {modified}")
    case.call_and_validate(base_url=live_api.base_url, excluded_checks=excluded, **options)


def _anonymous(case: schemathesis.Case[Any], live_api: LiveApi, examples: int) -> None:
    """Random ids, bodies and parameters, without credentials."""
    _call_and_validate(case, live_api, examples)


def _authenticated(case: schemathesis.Case[Any], live_api: LiveApi, examples: int) -> None:
    """The same with a valid token acting as the user in the path: reaches the handlers."""
    if case.path_parameters and "user_id" in case.path_parameters:
        case.path_parameters["user_id"] = live_api.user_id
    _call_and_validate(case, live_api, examples, modified=True, headers=bearer(live_api.token))


AUTHENTICATED = schema.exclude(
    operation_id=["timeline_stream", "revoke_token", "revoke_all_tokens"]
)
"""Not the live stream, whose answer never ends (``tests/reads/test_since_and_stream.py``
covers it), nor the two sign-outs, which would revoke the token every later case needs
(``tests/api/test_revocation_and_rotation.py`` covers them)."""


@schema.parametrize()
@bounded(QUICK_EXAMPLES)
def test_anonymous_requests_get_documented_answers(
    case: schemathesis.Case[Any], live_api: LiveApi
) -> None:
    _anonymous(case, live_api, QUICK_EXAMPLES)


@AUTHENTICATED.parametrize()
@bounded(QUICK_EXAMPLES)
def test_authenticated_requests_get_documented_answers(
    case: schemathesis.Case[Any], live_api: LiveApi
) -> None:
    _authenticated(case, live_api, QUICK_EXAMPLES)


@pytest.mark.long
@schema.parametrize()
@bounded(EXAMPLES_PER_OPERATION)
def test_anonymous_requests_at_full_size(case: schemathesis.Case[Any], live_api: LiveApi) -> None:
    _anonymous(case, live_api, EXAMPLES_PER_OPERATION)


@pytest.mark.long
@AUTHENTICATED.parametrize()
@bounded(EXAMPLES_PER_OPERATION)
def test_authenticated_requests_at_full_size(
    case: schemathesis.Case[Any], live_api: LiveApi
) -> None:
    _authenticated(case, live_api, EXAMPLES_PER_OPERATION)
