"""LocalAgreement-2: words that two consecutive hypotheses of the same segment agree on are committed.

As in whisper_streaming: each new hypothesis covers the segment's audio so far; the longest common
word prefix of it and the previous hypothesis is committed and never taken back while the segment is
open; the rest is tentative. The final transcript of the segment replaces both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PUNCT = re.compile(r"[^\w']+")


def _key(word: str) -> str:
    return _PUNCT.sub("", word.lower())


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
        if agreed > len(self._committed):
            self._committed += words[len(self._committed) : agreed]
        self._previous = words
        n = len(self._committed)
        # show the newest hypothesis after the committed prefix, aligned by word count
        tentative = words[n:] if len(words) > n else []
        return Hypothesis(" ".join(self._committed), " ".join(tentative))

    @property
    def committed(self) -> str:
        return " ".join(self._committed)
