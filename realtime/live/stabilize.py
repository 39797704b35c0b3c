"""LocalAgreement-2: words that two consecutive hypotheses of the same segment agree on are committed.

As in whisper_streaming: each new hypothesis covers the segment's audio so far; the longest common
word prefix of it and the previous hypothesis is committed and never taken back while the segment is
open (but not from a hypothesis that gained or lost a word among the committed ones); the rest is
tentative. The final transcript of the segment replaces both.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

_PUNCT = re.compile(r"[^\w']+")


def _key(word: str) -> str:
    return _PUNCT.sub("", word.lower())


def _aligned(committed: list[str], words: list[str]) -> bool:
    """Whether the hypothesis lines up with the committed words position by position (substituted words allowed):
    one that gained or lost a word among them would commit a word twice, or skip one, by position."""
    a, b = [_key(w) for w in committed], [_key(w) for w in words]
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if i1 != j1 or (i2 != j2 and (tag == "equal" or i2 < len(a))):
            return False
    return True


@dataclass(frozen=True)
class Hypothesis:
    committed: str
    tentative: str

    @property
    def text(self) -> str:
        return f"{self.committed} {self.tentative}".strip()


class LocalAgreement:
    def __init__(self) -> None:
        self._previous: list[str] = []
        self._committed: list[str] = []

    def update(self, text: str) -> Hypothesis:
        words = text.split()
        agreed = 0
        for a, b in zip(self._previous, words, strict=False):
            if _key(a) != _key(b):
                break
            agreed += 1
        if agreed > len(self._committed) and _aligned(self._committed, words):
            self._committed += words[len(self._committed) : agreed]
        self._previous = words
        n = len(self._committed)
        # show the newest hypothesis after the committed prefix, aligned by word count
        tentative = words[n:] if len(words) > n else []
        return Hypothesis(" ".join(self._committed), " ".join(tentative))

    @property
    def committed(self) -> str:
        return " ".join(self._committed)
