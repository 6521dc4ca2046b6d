from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from timeline.errors import AuthenticationError, InvalidInputError
from timeline.model.tokens import KeyRing, TokenSigner, UnknownKeyError

SIGNER = TokenSigner(b"k1", token_ttl_s=3600)


def test_bearer_round_trip() -> None:
    assert SIGNER.verify(SIGNER.mint_bearer("alice")).user_id == "alice"


@pytest.mark.parametrize(
    "token",
    ["", "alice", "alice.1.x", "alice..", "...", "alice.9999999999.AAAA", "ä.1.x", "a.b.c.d"],
)
def test_garbage_bearer_rejected(token: str) -> None:
    with pytest.raises(AuthenticationError):
        SIGNER.verify(token)


def test_bearer_bound_to_user_and_key() -> None:
    token = SIGNER.mint_bearer("alice")
    with pytest.raises(AuthenticationError):
        SIGNER.verify("mallory." + token.partition(".")[2])
    with pytest.raises(AuthenticationError):
        TokenSigner(b"k2", token_ttl_s=3600).verify(token)


def test_expired_bearer_rejected() -> None:
    token = SIGNER.mint_bearer("alice", now=time.time() - 7200)
    with pytest.raises(AuthenticationError) as raised:
        SIGNER.verify(token)
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


def test_key_ring_signs_with_the_newest_key_and_verifies_with_all() -> None:
    old = TokenSigner(KeyRing({"1": b"k1"}, "1", b"data"), token_ttl_s=3600)
    rotated = TokenSigner(KeyRing({"1": b"k1", "2": b"k2"}, "2", b"data"), token_ttl_s=3600)
    old_token, new_token = old.mint_bearer("alice"), rotated.mint_bearer("alice", epoch=3)
    assert rotated.verify(old_token).key_id == "1"
    bearer = rotated.verify(new_token)
    assert (bearer.user_id, bearer.key_id, bearer.epoch) == ("alice", "2", 3)
    with pytest.raises(UnknownKeyError):
        old.verify(new_token)  # a process whose ring is older does not know key 2 yet
    retired = TokenSigner(KeyRing({"2": b"k2"}, "2", b"data"), token_ttl_s=3600)
    with pytest.raises(UnknownKeyError):
        retired.verify(old_token)


def test_each_token_has_its_own_id() -> None:
    ids = {SIGNER.verify(SIGNER.mint_bearer("alice")).token_id for _ in range(50)}
    assert len(ids) == 50
