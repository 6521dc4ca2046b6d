from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from timeline.errors import AuthenticationError, InvalidInputError
from timeline.model.tokens import TokenSigner

SIGNER = TokenSigner(b"k1", token_ttl_s=3600)


def test_bearer_round_trip() -> None:
    assert SIGNER.verify_bearer(SIGNER.mint_bearer("alice")) == "alice"


@pytest.mark.parametrize(
    "token",
    ["", "alice", "alice.1.x", "alice..", "...", "alice.9999999999.AAAA", "ä.1.x", "a.b.c.d"],
)
def test_garbage_bearer_rejected(token: str) -> None:
    with pytest.raises(AuthenticationError):
        SIGNER.verify_bearer(token)


def test_bearer_bound_to_user_and_key() -> None:
    token = SIGNER.mint_bearer("alice")
    _, expires, signature = token.split(".")
    with pytest.raises(AuthenticationError):
        SIGNER.verify_bearer(f"mallory.{expires}.{signature}")
    with pytest.raises(AuthenticationError):
        TokenSigner(b"k2", token_ttl_s=3600).verify_bearer(token)


def test_expired_bearer_rejected() -> None:
    token = SIGNER.mint_bearer("alice", now=time.time() - 7200)
    with pytest.raises(AuthenticationError) as raised:
        SIGNER.verify_bearer(token)
    assert raised.value.code == "expired_token"


def test_continuation_round_trip_and_scope() -> None:
    raw = {"PartitionKey": "cA==", "RowKey": "cjI="}
    text = SIGNER.encode_continuation("timeline:alice", raw)
    assert SIGNER.decode_continuation("timeline:alice", text) == raw
    with pytest.raises(InvalidInputError):
        SIGNER.decode_continuation("timeline:bob", text)


def _flip_last(text: str) -> str:
    return text[:-1] + ("B" if text[-1] == "A" else "A")


def _swap_payload(text: str) -> str:
    other = SIGNER.encode_continuation("s", {"RowKey": "zzz"})
    return other.split(".")[0] + "." + text.split(".")[1]


@pytest.mark.parametrize(
    "tamper", [_flip_last, _swap_payload, lambda t: "x" + t, lambda t: t + ".x"]
)
def test_tampered_continuation_rejected(tamper: Callable[[str], str]) -> None:
    text = SIGNER.encode_continuation("s", {"RowKey": "r"})
    with pytest.raises(InvalidInputError) as raised:
        SIGNER.decode_continuation("s", tamper(text))
    assert raised.value.code == "invalid_continuation"


@pytest.mark.parametrize("text", ["", ".", "a.b", "!!!.???", "x" * 5000])
def test_garbage_continuation_rejected(text: str) -> None:
    with pytest.raises(InvalidInputError):
        SIGNER.decode_continuation("s", text)
