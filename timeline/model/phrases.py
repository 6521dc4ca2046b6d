"""Keyword filters' matching: does a text hold one of a reader's phrases as whole words?

Both sides are compared case-folded (Unicode ``str.casefold``: "STRASSE" matches "straße"),
and runs of white space in a phrase match any run of white space. "Whole words" means a
phrase that starts with a word character must not follow one, and a phrase that ends with
one must not be followed by one: "cat" hides "Cat!" but not "concatenate", and "#cat" also
hides "x#cat" (the rule Mastodon's ``whole_word`` filters follow).

A reader's phrases become one compiled alternation, cached by the phrase set, so a page of
250 entries costs 250 searches whatever the number of filters.
"""

from __future__ import annotations

import re
from functools import lru_cache

_SPACES = re.compile(r"\s+")


class Phrases:
    """A set of phrases and the one pattern that finds any of them."""

    __slots__ = ("_pattern",)

    def __init__(self, phrases: frozenset[str]) -> None:
        self._pattern = _pattern(tuple(sorted(phrases))) if phrases else None

    def __bool__(self) -> bool:
        return self._pattern is not None

    def found_in(self, text: object) -> bool:
        """Whether ``text`` holds one of the phrases (a non-text never does)."""
        return (
            self._pattern is not None
            and isinstance(text, str)
            and self._pattern.search(text.casefold()) is not None
        )


@lru_cache(maxsize=4096)
def _pattern(phrases: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(_one(phrase) for phrase in phrases))


def _one(phrase: str) -> str:
    folded = phrase.casefold()
    body = r"\s+".join(re.escape(word) for word in _SPACES.split(folded.strip()))
    start = r"(?<!\w)" if _is_word(folded[0]) else ""
    end = r"(?!\w)" if _is_word(folded[-1]) else ""
    return f"{start}{body}{end}"


def _is_word(character: str) -> bool:
    return character.isalnum() or character == "_"


NO_PHRASES = Phrases(frozenset())
