"""Keyword filters' matching: does a text hold one of a reader's phrases as whole words?

Both sides are compared case-folded (Unicode ``str.casefold``: "STRASSE" matches "straße"),
and runs of white space in a phrase match any run of white space. "Whole words" means a
phrase that starts with a word character must not follow one, and a phrase that ends with
one must not be followed by one: "cat" hides "Cat!" but not "concatenate", and "#cat" also
hides "x#cat" (the rule Mastodon's ``whole_word`` filters follow).

**Cost.** One pattern per phrase, tried only on texts that hold the phrase's first word:
every word of a phrase is a whole word of any text that holds the phrase (each ends at a
phrase edge with a boundary, or at a character that is no word character), so a text is
split into words once and looked up, and a page of 250 entries costs 250 splits whatever
the number of filters. A phrase of one word is that lookup alone; a phrase with no word
(say "!!!") is searched in every text.
"""

from __future__ import annotations

import re
from collections import defaultdict
from functools import lru_cache

_SPACES = re.compile(r"\s+")
_WORD = re.compile(r"\w+")


class Phrases:
    """A set of phrases, indexed by their first word."""

    __slots__ = ("_by_word", "_wordless", "_words")

    def __init__(self, phrases: frozenset[str]) -> None:
        by_word: defaultdict[str, list[re.Pattern[str]]] = defaultdict(list)
        words: set[str] = set()
        wordless: list[re.Pattern[str]] = []
        for phrase in phrases:
            folded = phrase.casefold()
            first = _WORD.search(folded)
            if first is None:
                wordless.append(_pattern(folded))
            elif first.group() == folded:
                words.add(folded)
            else:
                by_word[first.group()].append(_pattern(folded))
        self._words = frozenset(words)
        self._by_word = dict(by_word)
        self._wordless = tuple(wordless)

    def __bool__(self) -> bool:
        return bool(self._words or self._by_word or self._wordless)

    def found_in(self, text: object) -> bool:
        """Whether ``text`` holds one of the phrases (a non-text never does)."""
        if not self or not isinstance(text, str):
            return False
        folded = text.casefold()
        words = set(_WORD.findall(folded))
        if not words.isdisjoint(self._words):
            return True
        for word in words.intersection(self._by_word):
            if any(pattern.search(folded) for pattern in self._by_word[word]):
                return True
        return any(pattern.search(folded) for pattern in self._wordless)


@lru_cache(maxsize=4096)
def _pattern(folded: str) -> re.Pattern[str]:
    body = r"\s+".join(re.escape(word) for word in _SPACES.split(folded.strip()))
    start = r"(?<!\w)" if _is_word(folded[0]) else ""
    end = r"(?!\w)" if _is_word(folded[-1]) else ""
    return re.compile(f"{start}{body}{end}")


def _is_word(character: str) -> bool:
    return character.isalnum() or character == "_"


NO_PHRASES = Phrases(frozenset())
