"""The decoding policy every engine follows, written once.

What a segment's audio must be before a model sees it (digital silence skipped, quiet speech raised to a
level Whisper was trained on), how long its decode may run, which hypotheses are rejected and tried again at
a higher temperature (Whisper's compression-ratio, log-probability and no-speech rules, plus a guard against
repetition loops that those rules miss on short text), and what is kept when every temperature failed.
The embedded, vLLM and remote engines call these functions; none of them has rules of its own.
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .logprobs import within
from .types import TimedText, TranscribeOptions, Transcription

SILENCE_PEAK = 1e-3
"""Below this peak amplitude a clip is digital silence: no model call."""
QUIET_PEAK = 0.1
"""Speech whose peak is below this is raised towards it (Whisper's features depend on level)."""
MAX_GAIN = 100.0
NO_SPEECH_THRESHOLD = 0.6
LOGPROB_THRESHOLD = -1.0
COMPRESSION_RATIO_THRESHOLD = 2.4
FINAL_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
BEST_OF = 5
"""Candidates sampled at a temperature above zero, the most probable kept (engines that can)."""
TOKENS_PER_SECOND = 8
"""Bound on the tokens a decode may produce per second of audio (fast speech is about four)."""
TOKENS_MIN = 12
LOOP_SPAN = 3
"""A run of this many words or more said twice back to back is a loop."""
LOOP_REPEATS = {1: 6, 2: 3}
"""Shorter runs are loops when they come this many times in a row (people do say "word word word")."""

_PUNCT = re.compile(r"[^\w']+")
_WORD = re.compile(r"\w")


def is_silent(audio: np.ndarray) -> bool:
    return audio.size == 0 or float(np.max(np.abs(audio))) < SILENCE_PEAK


def normalise(audio: np.ndarray) -> np.ndarray:
    """The audio Whisper should see: quiet speech scaled up to `QUIET_PEAK` (at most `MAX_GAIN`), the rest as is.

    What the user records is untouched; only the copy handed to the model is scaled."""
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if peak >= QUIET_PEAK or peak < SILENCE_PEAK:
        return audio
    return (audio * min(MAX_GAIN, QUIET_PEAK / peak)).astype(np.float32)


def max_new_tokens(duration: float) -> int:
    """The longest decode a clip of `duration` seconds gets (a loop runs into it early)."""
    return TOKENS_MIN + int(TOKENS_PER_SECOND * duration)


def word_key(word: str) -> str:
    """A word as the loop rule compares words: lower case, without punctuation."""
    return _PUNCT.sub("", word.lower())


def find_loop(text: str) -> int | None:
    """Word index where a repetition loop starts over (the first word of the second occurrence), else None.

    A loop is a run of `LOOP_SPAN` or more words repeated back to back, or a shorter run repeated
    `LOOP_REPEATS[length]` times in a row."""
    keys = [word_key(w) for w in text.split()]
    best: int | None = None
    for n in range(1, len(keys) // 2 + 1):
        times = LOOP_REPEATS.get(n, 2)
        for start in range(0, len(keys) - times * n + 1):
            if best is not None and start + n >= best:
                break
            first = keys[start:start + n]
            if not all(first) or any(keys[start + k * n:start + (k + 1) * n] != first for k in range(1, times)):
                continue
            best = start + n
            break
    return best


def trim_loop(text: str) -> str:
    """The text up to where it starts over: "we meet at noon. we meet at noon. we" -> "we meet at noon."."""
    cut = find_loop(text)
    if cut is None:
        return text
    words = text.split()
    keys = [word_key(w) for w in words]
    # keep one occurrence of a repeated run, two of a single word ("no no no no no no" -> "no no")
    n = next(n for n in range(1, cut + 1) if keys[cut - n:cut] == keys[cut:cut + n])
    keep = cut + n if n == 1 else cut
    return " ".join(words[:keep])


def has_words(text: str) -> bool:
    """Whether text holds a word at all ("" and ". . . ." do not)."""
    return _WORD.search(text) is not None


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


Verdict = Literal["ok", "retry", "silence"]


@dataclass(frozen=True)
class Hypothesis:
    text: str
    avg_logprob: float | None = None
    no_speech_prob: float | None = None


def judge(h: Hypothesis) -> Verdict:
    """Whisper's rules for one decode: "silence" (no speech: keep nothing), "retry" (a loop or a guess: decode
    again at the next temperature), or "ok". Engines that report no probabilities are judged on text alone.

    Beyond Whisper's rules, a decode without a word whose no-speech probability is above the threshold is
    silence however confident it is: on a hum the model writes a row of dots, and the samples drawn after it
    vary from run to run."""
    if h.no_speech_prob is not None and h.no_speech_prob > NO_SPEECH_THRESHOLD and (
            h.avg_logprob is None or h.avg_logprob < LOGPROB_THRESHOLD or not has_words(h.text)):
        return "silence"
    if not h.text:
        return "ok"
    if compression_ratio(h.text) > COMPRESSION_RATIO_THRESHOLD or find_loop(h.text) is not None:
        return "retry"
    if h.avg_logprob is not None and h.avg_logprob < LOGPROB_THRESHOLD:
        return "retry"
    return "ok"


def settle(h: Hypothesis) -> str:
    """The text kept once no temperature is left: nothing for silence or for text without a word, a loop cut
    where it starts over."""
    if judge(h) == "silence" or not has_words(h.text):
        return ""
    text = trim_loop(h.text)
    return "" if compression_ratio(text) > COMPRESSION_RATIO_THRESHOLD else text


REJECTED = "rejected"
"""The `extra` key of a result whose last decode the policy rejected (asked without fallback): its `rejection`."""
LOOP = "loop"
"""The rejection of a decode whose only fault is that it starts over: its text up to there passes (`settle`)."""
GUESS = "guess"
"""Any other rejection: the decode's text is not to be trusted."""


def rejection(h: Hypothesis) -> str:
    """Why the policy rejects a decode (`judge` says "retry"): `LOOP` where its text cut where it starts over would
    pass, else `GUESS`."""
    trimmed = trim_loop(h.text)
    return LOOP if trimmed != h.text and judge(dataclasses.replace(h, text=trimmed)) == "ok" else GUESS


def temperatures(options: TranscribeOptions) -> tuple[float, ...]:
    """The temperatures a decode is tried at, in order: the asked one only, greedy only (partials, and decodes
    asked without fallback), else greedy and then Whisper's higher ones."""
    if options.temperature is not None:
        return (options.temperature,)
    return (0.0,) if options.partial or not options.fallback else FINAL_TEMPERATURES


def rejected(result: Transcription) -> bool:
    """Whether the policy rejected the greedy decode: its text was sampled at a higher temperature, or, asked
    without fallback, is the rejected decode itself."""
    return bool(result.extra.get(REJECTED)) or float(result.extra.get("temperature") or 0.0) > 0.0


def cut_at_loop(result: Transcription) -> bool:
    """Whether a result asked without fallback is its greedy decode cut where it started over, the rest passing
    (`LOOP`): its text stands for the audio it covers. Speech can say a phrase twice, and a packed window of
    several clips may hold the same words in two of them."""
    return result.extra.get(REJECTED) == LOOP and float(result.extra.get("temperature") or 0.0) == 0.0


async def with_fallback(decode: Callable[[TranscribeOptions], Awaitable[Transcription]],
                        options: TranscribeOptions) -> Transcription:
    """For engines that decode one clip per request: greedy first, then each higher temperature while the
    policy rejects the result; the kept text is `settle`d."""
    temps = temperatures(options)
    for n, temperature in enumerate(temps):
        result = await decode(options if n == 0 else dataclasses.replace(options, temperature=temperature))
        h = Hypothesis(result.text, result.avg_logprob, result.no_speech_prob)
        verdict = judge(h)
        if verdict == "retry" and n < len(temps) - 1:
            continue
        if verdict == "retry" and not options.fallback:
            result = dataclasses.replace(result, extra={**result.extra, REJECTED: rejection(h)})
        text = settle(h)
        if text == result.text:
            return result
        logprobs = None if result.logprobs is None else within(text, result.logprobs)
        segments = (TimedText(0.0, result.duration, text, logprobs=logprobs),) if text else ()
        return dataclasses.replace(result, text=text, segments=segments, logprobs=logprobs,
                                   extra={**result.extra, "temperature": temperature})
    raise AssertionError("unreachable")
