"""Token log-probabilities: read off a decode's logits, handed to the words they spell, and laid out as OpenAI's
`logprobs` (`{token, logprob, bytes}`).

A decode's tokens spell its text byte for byte (Whisper's tokens are byte-level), so the tokens of any part of the
text — a word, the words kept of a piece, a run of words sent as a delta — are found by their bytes.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .types import TokenLogprob, Word


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, in which Whisper's tokenizers spell their tokens: each character to its byte."""
    shown = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(shown)
    for b in range(256):
        if b not in shown:
            shown.append(b)
            chars.append(256 + len(chars) - 188)
    return {chr(c): b for b, c in zip(shown, chars, strict=True)}


_BYTES = _byte_alphabet()


def spell(token: str) -> bytes:
    """A token's bytes, from the tokenizer's byte-level spelling of it ("Ġthe" is b" the")."""
    return bytes(_BYTES[c] for c in token)


def steps(ids: Sequence[int], logits: Sequence[Any]) -> list[float]:
    """The log probability of each token of a hypothesis at its step: the log-softmax of the step's logits at it.
    `logits` holds one row of the vocabulary per step, as CTranslate2 returns them (`return_logits_vocab`)."""
    if len(logits) < len(ids):
        raise ValueError(f"{len(logits)} steps of logits for {len(ids)} tokens")
    out = []
    for token, row in zip(ids, logits, strict=False):
        x = np.asarray(row, dtype=np.float32).reshape(-1)
        top = float(x.max())
        out.append(float(x[token]) - top - float(np.log(np.exp(x - top, dtype=np.float64).sum())))
    return out


def text_tokens(ids: Sequence[int], logprobs: Sequence[float], spell: Callable[[int], bytes],
                text_below: int) -> tuple[TokenLogprob, ...]:
    """The text tokens among `ids` (below `text_below`: Whisper's timestamps and special tokens are not text), each
    with its log probability and bytes."""
    out = []
    for token, logprob in zip(ids, logprobs, strict=True):
        if token < text_below:
            raw = spell(token)
            out.append(TokenLogprob(raw.decode("utf-8", errors="replace"), logprob, tuple(raw)))
    return tuple(out)


def within(text: str, tokens: Sequence[TokenLogprob]) -> tuple[TokenLogprob, ...]:
    """The tokens that spell `text` from their start, the leading space aside: the kept part of a decode whose end
    the policy cut off (a loop)."""
    want = len(text.strip().encode())
    kept: list[TokenLogprob] = []
    spelled = b""
    for t in tokens:
        if len((spelled + bytes(t.bytes)).lstrip()) > want and spelled.strip():
            break
        kept.append(t)
        spelled += bytes(t.bytes)
    return tuple(kept)


def by_words(words: Sequence[str], tokens: Sequence[TokenLogprob]) -> list[tuple[TokenLogprob, ...]]:
    """The tokens of each of `words`, which spell the tokens' text in order (spaces aside): a token goes to the
    word its first non-space byte falls in."""
    if not words:
        return []
    ends = list(itertools.accumulate(len(w.strip().encode()) for w in words))
    out: list[list[TokenLogprob]] = [[] for _ in words]
    at = 0
    for t in tokens:
        out[min(bisect.bisect_right(ends, at), len(words) - 1)].append(t)
        at += len(bytes(t.bytes).replace(b" ", b""))
    return [tuple(x) for x in out]


def onto_words(words: Sequence[Word], tokens: Sequence[TokenLogprob]) -> tuple[Word, ...]:
    """`words` (which spell the tokens' text) each with its tokens."""
    return tuple(replace(w, logprobs=lp) for w, lp in zip(words, by_words([w.word for w in words], tokens),
                                                          strict=True))


def of_words(words: Iterable[Word]) -> tuple[TokenLogprob, ...]:
    return tuple(t for w in words for t in w.logprobs)


def as_json(tokens: Iterable[TokenLogprob]) -> list[dict[str, Any]]:
    """OpenAI's `logprobs` list."""
    return [{"token": t.token, "logprob": t.logprob, "bytes": list(t.bytes)} for t in tokens]
