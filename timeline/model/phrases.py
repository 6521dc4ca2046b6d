"""Keyword filters' matching: does a text hold one of a reader's phrases as whole words?

Texts and phrases are compared as sequences of tokens, after Unicode normalisation (NFC) and
case folding (``str.casefold``: "STRASSE" matches "straße"). A token is a word (letters,
digits, underscores and the combining marks within them, so "नमस्ते" is one word; "İ"
folds to "i") or one other visible character; runs of white space only
separate tokens. A phrase matches where its tokens appear in a row, separated where the
phrase's are separated by white space and joined where they are joined: "cat" hides "Cat!"
but not "concatenate" or "cats"; "new york" hides "New   York" but not "newyork"; "#cat"
also hides "x#cat" (a phrase edge that is no word needs no boundary, the rule Mastodon's
``whole_word`` filters follow).

**Cost.** A text with no token that starts a phrase (most texts) costs one split in C and
a set lookup; otherwise it is split once, and only positions whose token starts some phrase
are looked at, where each phrase length (at most ``MAX_PHRASE_TOKENS``) is one tuple lookup.
So a 250-entry page costs at worst 250 x 280 x ``MAX_PHRASE_TOKENS`` lookups (every token
starting a phrase), whatever the phrases hold.
"""

from __future__ import annotations

import re
import unicodedata
from collections import defaultdict

MAX_PHRASE_TOKENS = 8
"""Words and other characters a phrase may hold (each bounded read costs this many lookups
per token at most)."""
_TOKEN = re.compile(r"\w+|\S")
_DOTTED_I = "i\u0307"

Token = tuple[bool, str]
"""A token and whether white space comes before it."""


def tokens(text: str) -> list[Token]:
    """``text`` normalised, case-folded and split into tokens."""
    return _split(_fold(text))


def _fold(text: str) -> str:
    if text.isascii():
        return text.lower()  # the same as below for ASCII, at a fraction of the cost
    folded = unicodedata.normalize("NFC", unicodedata.normalize("NFC", text).casefold())
    return folded.replace(_DOTTED_I, "i")  # "İ" folds to "i" and a dot: the dot says nothing


def _split(folded: str) -> list[Token]:
    found: list[Token] = []
    end, after_mark = 0, False
    for match in _TOKEN.finditer(folded):
        piece, gap = match.group(), match.start() > end
        end = match.end()
        mark = len(piece) == 1 and unicodedata.category(piece)[0] == "M"
        # a combining mark belongs to the token before it, and so does a word right after it
        if found and not gap and (mark or (after_mark and _is_word(piece))):
            found[-1] = (found[-1][0], found[-1][1] + piece)
        else:
            found.append((gap, piece))
        after_mark = mark
    return found


def _is_word(piece: str) -> bool:
    return piece[0].isalnum() or piece[0] == "_"


class Phrases:
    """A set of phrases, indexed by their first token and length."""

    __slots__ = ("_index",)

    def __init__(self, phrases: frozenset[str]) -> None:
        index: defaultdict[str, defaultdict[int, set[tuple[Token, ...]]]] = defaultdict(
            lambda: defaultdict(set)
        )
        for phrase in phrases:
            split = tokens(phrase)[:MAX_PHRASE_TOKENS]
            if split:
                index[split[0][1]][len(split)].add(tuple(split[1:]))
        self._index = {first: dict(by_length) for first, by_length in index.items()}

    def __bool__(self) -> bool:
        return bool(self._index)

    def found_in(self, text: object) -> bool:
        """Whether ``text`` holds one of the phrases (a non-text never does)."""
        if not self._index or not isinstance(text, str):
            return False
        folded = _fold(text)
        if folded.isascii() and self._index.keys().isdisjoint(_TOKEN.findall(folded)):
            return False  # most texts: no token starts a phrase (one C-level pass)
        split = _split(folded)
        for position, (_, token) in enumerate(split):
            lengths = self._index.get(token)
            if lengths is None:
                continue
            for length, rests in lengths.items():
                if tuple(split[position + 1 : position + length]) in rests:
                    return True
        return False


NO_PHRASES = Phrases(frozenset())
