"""Keyword filters' matching: whole words, normalised and case-folded, any run of white
space, at a bounded cost whatever the phrases."""

from __future__ import annotations

import unicodedata

import pytest

from timeline.model.phrases import Phrases


@pytest.mark.parametrize(
    ("phrase", "text", "found"),
    [
        ("cat", "Cat!", True),
        ("cat", "my CAT sleeps", True),
        ("cat", "concatenate", False),
        ("cat", "cats", False),
        ("cat", "cat_food", False),  # an underscore is a word character
        ("straße", "STRASSE closed", True),  # Unicode case folding, not lower()
        ("café", "Cafés", False),
        ("café", "le CAFÉ.", True),
        ("new york", "New   York today", True),
        ("new york", "newyork", False),
        ("#cat", "x#cat", True),  # a phrase edge that is no word character needs no boundary
        ("#cat", "#catalog", False),
        ("c++", "I like C++!", True),
        ("ünïcode", "ÜNÏCODE", True),
        ("new york", "new jersey, york", False),  # its first word alone is not enough
        ("cat's", "the CAT'S toy", True),
        ("cat's", "the cat is", False),
        ("!!!", "wow!!! yes", True),  # a phrase with no word is searched everywhere
        ("!!!", "wow!! yes", False),
        ("İstanbul", "İSTANBUL nights", True),
        ("istanbul", "İSTANBUL", True),  # the dot a folded "İ" leaves says nothing
        ("stanbul", "İSTANBUL", False),
        ("café", unicodedata.normalize("NFD", "un café"), True),  # composed or not, the same
        ("cafe", unicodedata.normalize("NFD", "un café"), False),
        ("नमस", "नमस्ते", False),  # a combining mark is part of its word
        ("नमस्ते", "नमस्ते दोस्त", True),
    ],
)
def test_a_phrase_is_found_as_whole_words_ignoring_case(
    phrase: str, text: str, found: bool
) -> None:
    assert Phrases(frozenset({phrase})).found_in(text) is found


def test_any_of_many_phrases_is_found_and_no_phrases_find_nothing() -> None:
    many = Phrases(frozenset({f"word{n}" for n in range(100)} | {"spoiler"}))
    assert many.found_in("a SPOILER ahead")
    assert many.found_in("word99")
    assert not many.found_in("word100")
    assert not many.found_in(None)
    none = Phrases(frozenset())
    assert not none
    assert not none.found_in("anything")
    assert many


def test_regex_characters_in_a_phrase_are_literal() -> None:
    phrases = Phrases(frozenset({"a.b", "(x"}))
    assert phrases.found_in("see a.b here")
    assert not phrases.found_in("see axb here")
    assert phrases.found_in("(x marks")


def test_hostile_phrases_match_right() -> None:
    """Every token of the text starts a phrase, of every length (the bench times this)."""
    phrases = Phrases(frozenset(" ".join(["a"] * (n % 8)) + f" q{n}" for n in range(100)))
    text = ("a " * 140)[:280]
    assert not phrases.found_in(text)
    assert phrases.found_in(text[:-1] + " q3")
