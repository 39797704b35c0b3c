"""Nothing lost: which stretches of speech a decoded clip's text covers.

A file's speech segments are packed into windows and each window is decoded in one pass (realtime/live/transcribe.py).
Whisper may skip a sentence in the middle of a window, or end its decode early, and still give fluent text. The
result's times say which audio its text came from: the words aligned on the encoder output (engines that declare
`word_timestamps`) or Whisper's timed pieces (engines that declare `timestamps`). A segment is `uncovered` when its
speech holds a long stretch that no text lies over, or when its text is too short for its speech: alignment spreads
the words a decode kept over the speech it was given, so a skipped sentence beside a few kept words can look
covered, but not as many words; nor can one word lie across two segments (`stretched`: the VAD cut between them
where it heard a pause), so the words beside such a word are not where they seem. The segments beside one that
holds such words are `suspect` too. The file path
decodes them again (realtime/live/transcribe.py) and that answer, checked in turn, stands for them: its text,
Whisper's no-speech verdict, or an error entry.

A packed window whose greedy decode the decoding policy rejected (a loop, a guess) is not trusted to a sample at a
higher temperature either: each of its segments is decoded alone (`policy.rejected`: a guess worth less than its
segments' greedy decodes one by one), and the window is asked without fallback (`window_options`). An engine that
gives no times cannot be checked this way: its windows hold one segment each (`checkable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from difflib import SequenceMatcher

from ..engines import policy
from ..engines.base import Engine
from ..engines.types import TranscribeOptions, Transcription

Span = tuple[float, float]
"""(start, end) in seconds from the start of a clip."""

GAP_S = 0.6
"""A stretch of speech this long with no text over it is a loss: a pause within a segment is shorter than the VAD's
minimum silence, and the words on either side of a phrase a decode skipped reach `REACH_S` into it, so a phrase of
1.4 s shows as 0.6 s."""
LONE_GAP_S = 2.0
"""...in the answer for a lone segment, this long (a decode of one segment has no sentence to skip to): shorter, it
is decoded once more, and that answer must keep the first (`keeps`)."""
GAP_SHARE = 0.6
"""So is a stretch over this share of a shorter segment's speech."""
MIN_SPEECH_S = 0.25
"""Segments with less speech than this need no cover (a click or a breath the VAD kept)."""
MIN_WORDS_PER_S = 1.0
"""Fewer words than this per second of a segment's speech is text too short for it."""
SPARSE_SPEECH_S = 1.0
"""Segments with less speech than this are judged by their gaps alone (a word or two is a whole answer)."""
EDGE_S = 1.0
"""A segment beside an uncovered one whose last (or first) this many seconds of speech, at that side, have no text
is suspect: the decode stopped (or started again) inside it."""
STRETCH_S = 0.3
"""A word whose time reaches this far into the speech of two segments was stretched over them by alignment."""
LONG_WORD_S = 2.0
"""So was a word this long within one segment's speech: no word is said that slowly."""
KEPT_SHARE = 0.9
"""A second decode `keeps` a first one that holds this share of its words, in order."""
SPLIT_S = 4.0
"""A lone segment with at least this much speech whose answer is `sparse` at `UNTIMED_WORDS_PER_S` and does not say
where its text lies is decoded again in halves."""
UNTIMED_SPLIT_S = 2.0
"""...this much, on an engine that gives no times (`checkable`): there a segment is a window of its own and nothing
else checks it, and two short phrases the VAD joined are read as one (each half holds a quarter of the speech or
more, a word or two)."""
UNTIMED_WORDS_PER_S = 2.0
"""Fewer words than this per second of a lone segment's speech, in an answer that does not say where they lie, may be
one sentence of two: read speech runs faster, and a segment of two sentences that kept one says about half of its
words."""
ADDS_WORDS = 3
"""A segment of speech the VAD did not hear is read again alone, and that reading stands where it `adds` this many
consecutive words to the window's."""
REACH_S = 0.4
"""How far beyond a word's or a piece's times its text counts as covering speech: alignment is coarse at the
edges of words, and Whisper's piece boundaries fall in the pauses around them."""


def checkable(engine: Engine) -> bool:
    """Whether the engine's results say where their text came from (so a window may hold several segments)."""
    return bool(engine.word_timestamps or engine.timestamps)


def check_options(engine: Engine, options: TranscribeOptions) -> TranscribeOptions:
    """The options a window is decoded with so that its result can be checked: word times where the engine
    aligns words (the decode asked for stays as it is and gains the words: Whisper's timed pieces can be placed
    wrong, a skipped first sentence's time given to the next), else Whisper's timed pieces."""
    if options.word_timestamps or not checkable(engine):
        return options
    if engine.word_timestamps:
        return replace(options, word_timestamps=True, coverage=True)
    return options if options.timestamps else replace(options, timestamps=True, coverage=True)


def redecode_options(engine: Engine, options: TranscribeOptions, asked: TranscribeOptions,
                     packed: bool) -> TranscribeOptions:
    """The options an uncovered segment is decoded again with, alone. A segment that was packed with others is
    decoded as the caller asked (alone, nothing lies beyond its own sentence to skip to); a window of one segment
    whose text stopped short is decoded with Whisper's timestamp tokens where the engine gives them (long-form
    decoding carries on past an early end). Word times only if `asked`."""
    timestamps = asked.timestamps or (engine.timestamps and not packed)
    return replace(options, timestamps=timestamps, word_timestamps=asked.word_timestamps, coverage=False)


def timing(result: Transcription) -> list[Span] | None:
    """Where each word of the result's text lies in its clip: its words' times, else each timed piece shared evenly
    among its words; None when it has text but no times (one piece over the whole clip is no timing); [] when it
    has no text."""
    if not result.text.strip():
        return []
    words = [(w.start, w.end) for w in result.words if w.word.strip()]
    return words or piece_timing(result)


def piece_timing(result: Transcription) -> list[Span] | None:
    """Where each word of the result's text lies by its timed pieces alone (each piece's time shared evenly among
    its words); None when there is no more than one piece over the whole clip."""
    pieces = [(p.start, p.end, len(p.text.split())) for p in result.segments if p.text.strip()]
    if len(pieces) == 1 and pieces[0][0] <= 0.0 and pieces[0][1] >= result.duration - 0.01:
        return None
    step = [(a, (b - a) / n, n) for a, b, n in pieces]
    return [(a + k * d, a + (k + 1) * d) for a, d, n in step for k in range(n)] or None


def window_options(options: TranscribeOptions, segments: int) -> TranscribeOptions:
    """The options a window of `segments` segments is decoded with: a packed window's rejected decode is not tried
    again at higher temperatures, since its segments are decoded alone then (`policy.rejected`)."""
    return replace(options, fallback=False) if segments > 1 else options


def longest_gap(span: Span, covered: Sequence[Span], reach: float = REACH_S) -> float:
    """The longest stretch of `span` that no covered span (widened by `reach`) lies over."""
    start, end = span
    at, longest = start, 0.0
    for a, b in sorted((a - reach, b + reach) for a, b in covered):
        if b <= at:
            continue
        if a >= end:
            break
        longest = max(longest, min(a, end) - at)
        at = max(at, b)
        if at >= end:
            break
    return max(longest, end - at)


def words_in(span: Span, covered: Sequence[Span], reach: float = REACH_S) -> int:
    """How many words (covered spans) have their middle in `span` (widened by `reach`)."""
    start, end = span
    return sum(start - reach <= (a + b) / 2 < end + reach for a, b in covered)


def suspect(speech: Sequence[Span], covered: Sequence[Span], missing: Sequence[int], words: bool = False,
            brief: bool = True) -> list[int]:
    """`missing` (uncovered segments of a packed window) with the segment after each one, the segment before each one
    that holds words or whose speech has no text over its last `EDGE_S` seconds, and (with `brief`) the segments too
    brief to be judged by their speech that got no word (`covered` are words' own times where `words`: one that
    overlaps the speech counts; else a word's middle in it). A decode that skipped a segment jumped ahead and may
    have landed inside the next one, a phrase into it (two phrases with a pause the VAD did not cut at), with the
    first words it read there aligned over the phrase it skipped; words over a segment that is not covered were
    stretched there from a sentence beside it, and the decode may have skipped that sentence's first or last words
    too; a decode that stopped early may have stopped inside the segment before, a sentence short of its end; the
    VAD may hear a fraction of a second of a voice it
    does not know (a falsetto) whose phrase is in the audio around it, or a few hundredths of a second of each word
    of a speaker with a cold, whose aligned words lie over those hundredths without their middles in them. And the
    first segment with words after a start of the window that has none: Whisper reads a window from its start, and
    a decode that stopped early may have its words aligned at the end, over a segment it never read."""
    def said_over(span: Span) -> bool:
        if words:
            return any(min(b, span[1]) > max(a, span[0]) for a, b in covered)
        return bool(words_in(span, covered, reach=0.0))

    out = set(missing) | {i for i, span in enumerate(speech) if brief and span[1] - span[0] < MIN_SPEECH_S
                          and not said_over(span)}
    worded = next((i for i, span in enumerate(speech) if words_in(span, covered)), None)
    if worded and all(i in missing or speech[i][1] - speech[i][0] < MIN_SPEECH_S for i in range(worded)) and (
            0 in missing):
        out.add(worded)
    for i in missing:
        if i + 1 < len(speech):
            out.add(i + 1)
        if i > 0 and (words_in(speech[i], covered) or bare_edge(speech[i - 1], covered, at_end=True)):
            out.add(i - 1)
    return sorted(out)


def bare_edge(span: Span, covered: Sequence[Span], at_end: bool) -> bool:
    """Whether the last (`at_end`) or first `EDGE_S` seconds of a longer stretch of speech have no text over them."""
    start, end = span
    if end - start <= EDGE_S:
        return False
    edge = (end - EDGE_S, end) if at_end else (start, start + EDGE_S)
    return longest_gap(edge, covered) >= EDGE_S - 1e-6


def stretched(speech: Sequence[Span], words: Sequence[Span]) -> list[int]:
    """Indexes of the speech spans (a window's segments) that one aligned word lies across, from the first to the
    last that it reaches `STRETCH_S` into, or that holds a word of `LONG_WORD_S` or more. A word is said within one
    segment, and quicker than that, so alignment spread this one over speech the decode skipped (a "the" over
    several sentences, an "on" over a clause, a "that" over the sentence before it in the same segment)."""
    out: set[int] = set()
    for a, b in words:
        over = [i for i, (x, y) in enumerate(speech) if min(b, y) - max(a, x) > STRETCH_S]
        if len(over) > 1:
            out |= set(range(over[0], over[-1] + 1))
        elif b - a >= LONG_WORD_S:
            out |= set(over)
    return sorted(out)


def sparse(speech: Span, result: Transcription, rate: float = MIN_WORDS_PER_S) -> bool:
    """Whether a result with text says fewer than `rate` words per second of its segment's speech (of
    `SPARSE_SPEECH_S` or more), wherever its words may lie: an empty answer is Whisper's no-speech verdict."""
    words, length = len(result.text.split()), speech[1] - speech[0]
    return 0 < words < rate * length and length >= SPARSE_SPEECH_S


def keeps(again: Transcription, first: Transcription) -> bool:
    """Whether a second decode of a lone segment stands for a first one that looked short by `GAP_S` but not by
    `LONE_GAP_S`: it was not rejected, says more, and says `KEPT_SHARE` of what the first
    said, in order. A decode that skipped a sentence gains it; one that lost its way in a voice Whisper barely knows
    (a falsetto) writes other words, and the first answer stands."""
    if policy.rejected(again):
        return False
    said, more = ([k for k in map(policy.word_key, r.text.split()) if k] for r in (first, again))
    if len(more) <= len(said):
        return False
    matcher = SequenceMatcher(None, said, more, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks()) >= KEPT_SHARE * len(said)


def adds(alone: Transcription, said: Sequence[str]) -> bool:
    """Whether a segment's answer decoded alone, not rejected, says `ADDS_WORDS` consecutive words that are not in
    `said` (what its window's decode said over it and its neighbours), in order."""
    if policy.rejected(alone):
        return False
    more = [k for k in map(policy.word_key, alone.text.split()) if k]
    kept = [k for k in map(policy.word_key, said) if k]
    at = 0
    for block in SequenceMatcher(None, more, kept, autojunk=False).get_matching_blocks():
        if block.a - at >= ADDS_WORDS:
            return True
        at = block.a + block.size
    return False


def unaccounted(speech: Sequence[Span], covered: Sequence[Span], words: bool = False, brief: bool = True) -> list[int]:
    """The segments of a packed window to decode again: `uncovered` ones, those an aligned word is `stretched`
    across (when `covered` are words' own times, not a piece's shared out), and those they make `suspect` (brief
    ones with `brief`: a result's timed pieces checked beside its words leave those to the words)."""
    missing = {*uncovered(speech, covered), *(stretched(speech, covered) if words else ())}
    return suspect(speech, covered, sorted(missing), words, brief)


def uncovered(speech: Sequence[Span], covered: Sequence[Span], gap: float = GAP_S) -> list[int]:
    """Indexes of the speech spans (a window's segments) that hold a stretch of speech no text covers (at least
    `gap`, or `GAP_SHARE` of a shorter segment's speech), or whose words are too few for their speech
    (`MIN_WORDS_PER_S` over `SPARSE_SPEECH_S` or more); `covered` holds one span per word."""
    out = []
    for i, (a, b) in enumerate(speech):
        length = b - a
        if length < MIN_SPEECH_S:
            continue
        if longest_gap((a, b), covered) >= min(gap, GAP_SHARE * length) or (
                length >= SPARSE_SPEECH_S and words_in((a, b), covered) < MIN_WORDS_PER_S * length):
            out.append(i)
    return out


__all__ = ["ADDS_WORDS", "EDGE_S", "GAP_S", "GAP_SHARE", "KEPT_SHARE", "LONE_GAP_S", "LONG_WORD_S", "MIN_SPEECH_S",
           "MIN_WORDS_PER_S", "REACH_S", "SPARSE_SPEECH_S", "SPLIT_S", "STRETCH_S", "UNTIMED_SPLIT_S",
           "UNTIMED_WORDS_PER_S", "Span", "adds", "bare_edge", "check_options", "checkable", "keeps", "longest_gap",
           "piece_timing", "redecode_options", "sparse", "stretched", "suspect", "timing", "unaccounted",
           "uncovered", "window_options", "words_in"]
