"""One live transcription session: audio frames in, transcript events out.

A session owns its VAD state, the open segment's LocalAgreement, its transcript and its partial
schedule. It hands segments to the shared `Worker` and reports `partial`, `final` and `error`
events through a callback, in segment order.

Finals are speculative: once speech pauses, the segment's final audio is known, so it is queued then; if
the pause reaches the minimum silence the segment closes with that job's result (final latency is about
the minimum silence, not silence plus inference), and if speech resumes first the job is withdrawn. It is
queued at the pause's first silent window (the after-padding not heard yet taken as silence), and only while
the engine has no other session's work: on a busy engine the final waits in the queue anyway, and the short
dips inside sentences would take the engine's time from other sessions; there it is queued when the segment
closes.

A final whose words leave a stretch of its segment's speech without text (Whisper may end a decode after the first
of two sentences said one after the other) is decoded again with Whisper's timestamps, as the file path decodes a
lone segment (realtime/live/coverage.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..audio import SAMPLE_RATE
from ..config import TurnConfig
from ..engines import TranscribeOptions, Transcription
from ..engines import logprobs as lp
from ..engines.policy import trim_loop
from ..speakers import Diarization, LiveSpeakers, Turn
from . import coverage
from .end_of_turn import LEAD_S, TurnModel, drawn_out
from .events import ErrorEvent, Event, FinalEvent, PartialEvent, SpeakerEvent, SpeechStarted, SpeechStopped
from .stabilize import LocalAgreement
from .transcript import Entry, Partial, Transcript
from .vad import SegmentEnd, Segmenter, SegmentStart, SileroVAD, VADConfig
from .worker import Job, Worker

log = logging.getLogger(__name__)

FIRST_PARTIAL_AFTER_S = 0.25
"""Speech a segment needs before its first partial (a segment opens after 30 ms; Whisper has nothing to say
about that little)."""


@dataclass(frozen=True)
class _Speculative:
    """A final queued at a pause before it is known to be the end of the segment."""

    segment: int
    end: float
    job: Job

    def matches(self, segment: int, end: float) -> bool:
        return (self.segment, self.end) == (segment, end)


class TranscriptionSession:
    def __init__(
        self,
        session_id: str,
        worker: Worker,
        on_event: Callable[[Event], None],
        vad_config: VADConfig | None = None,
        vad_model: SileroVAD | None = None,
        partial_interval: float = 0.5,
        partial_interval_max: float = 2.0,
        language: str | None = None,
        word_timestamps: bool = False,
        clock: Callable[[], float] = time.monotonic,
        speakers: LiveSpeakers | None = None,
        speaker_pool: Executor | None = None,
        on_audio: Callable[[np.ndarray], None] | None = None,
        turn: TurnConfig | None = None,
        turn_model: TurnModel | None = None,
    ) -> None:
        self.id = session_id
        self.worker = worker
        self.on_event = on_event
        self.segmenter = Segmenter(vad_config, vad_model)
        self.partial_interval = partial_interval
        self.partial_interval_max = partial_interval_max
        self.options = TranscribeOptions(language=language, word_timestamps=word_timestamps)
        self._checked = worker.engine.word_timestamps  # a final's words say whether it holds all its speech
        self.clock = clock
        self.transcript = Transcript()
        self.closed = False
        self.started_at = clock()
        self._agreement = LocalAgreement()
        self._last_partial_at = -math.inf  # no partial yet in this segment
        self._wall_last = self.started_at
        self._samples_last = 0
        self._finals_pending: dict[int, asyncio.Future[Transcription]] = {}
        self._ends: dict[int, SegmentEnd] = {}
        self._speculative: _Speculative | None = None
        self.last_latency: float | None = None
        self.speakers = speakers
        """The speaker model's live state when speaker labels are on; its work runs on `speaker_pool`."""
        self._speaker_pool = speaker_pool
        self._speaker_ids: dict[int, int] = {}
        self._turns: dict[int, list[Turn]] = {}
        self.names: dict[int, str] = {}
        """Names the user gave speakers, by speaker number."""
        self.on_audio = on_audio
        """Takes the audio as it arrives, where it is kept (the history's `--keep-audio`)."""
        self.turn: TurnConfig | None = None
        """End of turn: a pause closes the segment when the turn model finds the speaker finished, or once it lasts
        the eagerness's longest wait; without it, after the VAD's minimum silence."""
        self._turn_model = turn_model
        self._judged: tuple[int, float] | None = None
        self._finished: tuple[int, float] | None = None
        self._verdict: asyncio.Future[float] | None = None
        self.choose_turn(turn)

    # -- time
    @property
    def stream_time(self) -> float:
        return self.segmenter.samples / SAMPLE_RATE

    def wall_at(self, stream_seconds: float) -> float:
        """Wall-clock time at which the audio at `stream_seconds` reached the server."""
        return self._wall_last - (self._samples_last / SAMPLE_RATE - stream_seconds)

    # -- input
    def feed(self, audio: np.ndarray, heard: np.ndarray | None = None) -> None:
        """The next samples of the session's audio; `heard`, where given, is what the VAD hears in their place (a
        denoised copy, as long), while the engine gets `audio`."""
        if self.closed:
            return
        self._samples_last += audio.size
        self._wall_last = self.clock()
        if self.on_audio is not None:
            self.on_audio(audio)
        for event in self.segmenter.feed(audio, heard):
            self._handle(event)
        self._speculate()
        self._judge_turn()
        self._maybe_partial()

    def flush(self) -> None:
        """End of input: close the open segment (file transcription, clean stream end)."""
        for event in self.segmenter.flush():
            self._handle(event)

    def _handle(self, event: SegmentStart | SegmentEnd) -> None:
        if isinstance(event, SegmentStart):
            self._agreement = LocalAgreement()
            self._last_partial_at = -math.inf  # no partial yet in this segment
            self._emit(SpeechStarted(event.segment, event.start))
            return
        self.worker.drop_partial(self.id)
        if self.transcript.partial is not None and self.transcript.partial.segment == event.segment:
            self.transcript.partial = None
        self._ends[event.segment] = event
        self._emit(SpeechStopped(event.segment, event.start, event.end))
        spec, self._speculative = self._speculative, None
        if spec is not None and spec.matches(event.segment, event.end) and not spec.job.future.cancelled():
            self.worker.adopt(spec.job)
            future = spec.job.future
        else:
            if spec is not None:
                self.worker.cancel(spec.job)
            future = self.worker.submit(Job(self.id, event.segment, event.audio, "final", self.final_options))
        self._finals_pending[event.segment] = future
        future.add_done_callback(lambda f, seg=event.segment: self._on_final(seg, f))
        if self.speakers is not None:
            heard = asyncio.get_running_loop().run_in_executor(self._speaker_pool, self.speakers.add, event.audio,
                                                               event.audio_start)
            heard.add_done_callback(lambda f, seg=event.segment: self._on_speakers(seg, f))

    def _speculate(self) -> None:
        pending = self.segmenter.pending_end(0.0)
        spec = self._speculative
        if pending is None:
            if spec is not None:  # speech resumed: that pause was not the end
                self.worker.cancel(spec.job)
                self._speculative = None
            return
        segment, end, audio = pending
        if spec is not None and spec.matches(segment, end):
            return
        if self.worker.busy_with_others(self.id):
            return
        padded = self.segmenter.pending_end()
        if padded is not None:
            audio = padded[2]
        if spec is not None:
            self.worker.cancel(spec.job)
        job = Job(self.id, segment, audio, "final", self.final_options, speculative=True)
        self.worker.submit(job)
        self._speculative = _Speculative(segment, end, job)

    def _judge_turn(self) -> None:
        """A pause that lasts the turn's `judge_after_ms` is judged by the turn model on the segment's audio so far;
        the model is asked `LEAD_S` sooner, on that audio drawn out to the full pause (`end_of_turn.drawn_out`), so
        that a finished turn closes as the pause reaches it, not a model call later."""
        seg, turn = self.segmenter, self.turn
        pause = seg.pause
        if turn is None or self._turn_model is None or pause is None:
            return
        after = turn.judge_after_ms / 1000
        if self._end_finished_turn() or pause == self._judged or seg.pause_s < after - LEAD_S:
            return
        self._judged = pause
        model = self._turn_model
        audio = drawn_out(seg.audio_so_far(), seg.pause_s, after)
        future = asyncio.get_running_loop().run_in_executor(model.pool, model.complete, audio)
        future.add_done_callback(lambda f: self._on_turn(pause, f))
        self._verdict = future

    @property
    def judging(self) -> asyncio.Future[float] | None:
        """The end-of-turn model's verdict on the open pause while it is being reached, else None."""
        return self._verdict if self._verdict is not None and not self._verdict.done() else None

    def _on_turn(self, pause: tuple[int, float], future: asyncio.Future[float]) -> None:
        if self.closed or future.cancelled():
            return
        if future.exception() is not None:
            log.warning("session %s: the end-of-turn model failed (%s); the pause waits its longest", self.id,
                        future.exception())
            return
        assert self.turn is not None
        if future.result() >= self.turn.threshold and self.segmenter.pause == pause:
            self._finished = pause
            self._end_finished_turn()

    def _end_finished_turn(self) -> bool:
        """Close the segment at its pause if the model found the turn finished and the pause has lasted the turn's
        `judge_after_ms` (a verdict asked ahead of its pause waits for that); whether it closed."""
        seg = self.segmenter
        if self._finished is None or self._finished != seg.pause or self.turn is None:
            return False
        if seg.pause_s < self.turn.judge_after_ms / 1000:
            return False
        self._finished = None
        for event in seg.end_turn():
            self._handle(event)
        return True

    def _maybe_partial(self) -> None:
        seg = self.segmenter
        if not seg.announced or seg.paused or self.worker.has_partial(self.id):
            return  # in a pause the speculative final is at most the after-padding away: leave it the engine
        if self.stream_time - seg.speech_start < FIRST_PARTIAL_AFTER_S:
            return
        now = self.clock()
        interval = min(self.partial_interval_max, max(self.partial_interval, 1.5 * self.worker.stats.engine_latency))
        if self.worker.pending_finals:
            interval = self.partial_interval_max
        if now - self._last_partial_at < interval:
            return
        self._last_partial_at = now
        segment, start, end = seg.segment, seg.speech_start, self.stream_time
        job = Job(self.id, segment, seg.audio_so_far(), "partial",
                  TranscribeOptions(language=self.options.language, task=self.options.task, partial=True,
                                    logprobs=self.options.logprobs, prompt=self.options.prompt,
                                    vocabulary=self.options.vocabulary),
                  on_text=lambda text: self._on_partial_text(segment, start, end, text))
        future = self.worker.submit(job)
        future.add_done_callback(lambda f: self._on_partial(segment, start, end, f))

    # -- results
    def _on_partial(self, segment: int, start: float, end: float, future: asyncio.Future[Transcription]) -> None:
        if self.closed or future.cancelled() or future.exception() is not None:
            return
        if not self.segmenter.announced or self.segmenter.segment != segment:
            return  # the segment closed meanwhile: its final is on the way
        result = future.result()
        text = trim_loop(result.text)
        hyp = self._agreement.update(text)
        if not hyp.text:
            return
        by_word = None
        if result.logprobs is not None:
            by_word = tuple(lp.by_words(text.split(), lp.within(text, result.logprobs)))
        self.transcript.partial = Partial(segment, start, end, hyp.committed, hyp.tentative)
        self._emit(PartialEvent(segment, start, end, hyp.committed, hyp.tentative, logprobs=by_word))

    def _on_partial_text(self, segment: int, start: float, end: float, text: str) -> None:
        """A streaming engine's hypothesis so far: shown as tentative words after the committed ones."""
        if self.closed or not self.segmenter.announced or self.segmenter.segment != segment:
            return
        committed = self._agreement.committed
        words = trim_loop(text).split()
        tentative = " ".join(words[len(committed.split()):])
        if not tentative:
            return
        self.transcript.partial = Partial(segment, start, end, committed, tentative)
        self._emit(PartialEvent(segment, start, end, committed, tentative, streaming=True))

    @property
    def final_options(self) -> TranscribeOptions:
        """A final is decoded as asked, with its words' times where the engine aligns words: the check that it
        holds all its segment's speech (`_stopped_short`) goes by them."""
        return coverage.check_options(self.worker.engine, self.options) if self._checked else self.options

    def _stopped_short(self, end_event: SegmentEnd, result: Transcription) -> bool:
        """Whether a final's text leaves `coverage.LONE_GAP_S` or more of its segment's speech without a word:
        Whisper may end a segment's decode after its first sentence (two people, one after the other)."""
        spans = coverage.timing(result) if self._checked else None
        speech = (end_event.start - end_event.audio_start, end_event.end - end_event.audio_start)
        return spans is not None and bool(coverage.uncovered([speech], spans, coverage.LONE_GAP_S))

    def _on_final(self, segment: int, future: asyncio.Future[Transcription], again: bool = False) -> None:
        self._finals_pending.pop(segment, None)
        end_event = self._ends.get(segment)
        if end_event is None or self.closed or future.cancelled():
            self._ends.pop(segment, None)
            return
        if not again and future.exception() is None and self._stopped_short(end_event, future.result()):
            # decoded again with Whisper's timestamps, as the file path decodes a lone segment that stopped short:
            # long-form decoding carries on past an early end, and that answer stands
            options = coverage.redecode_options(self.worker.engine, self.final_options, self.options, packed=False)
            redo = self.worker.submit(Job(self.id, segment, end_event.audio, "final", options))
            self._finals_pending[segment] = redo
            redo.add_done_callback(lambda f: self._on_final(segment, f, again=True))
            return
        self._ends.pop(segment, None)
        latency = max(0.0, self.clock() - self.wall_at(end_event.end))
        exc = future.exception()
        start, end = end_event.start, end_event.end
        if exc is not None:
            self.transcript.add(Entry(segment, start, end, str(exc), kind="error", latency=latency))
            self._emit(ErrorEvent(segment, start, end, str(exc)))
            return
        result = future.result()
        text, language = result.text, result.language
        words = tuple(dataclasses.replace(w, start=end_event.audio_start + w.start, end=end_event.audio_start + w.end)
                      for w in result.words) if self.options.word_timestamps else ()  # in stream time
        self.last_latency = latency
        speaker = self.speaker_label(segment)
        for entry in self._labelled(Entry(segment, start, end, text, latency=latency, language=language,
                                          words=words, logprobs=result.logprobs)):
            self.transcript.add(entry)
        self._emit(FinalEvent(segment, start, end, text, latency, language=language, words=words, speaker=speaker,
                              logprobs=result.logprobs))
        if speaker is not None and _mixed(self._turns.get(segment, [])):
            self._announce(segment)  # the speaker model was done first: the turns follow the final

    # -- speakers
    def speaker_name(self, speaker: int) -> str:
        return self.names.get(speaker) or f"Speaker {speaker + 1}"

    def speaker_label(self, segment: int) -> str | None:
        """The label of who spoke a segment, once the speaker model has heard it."""
        speaker = self._speaker_ids.get(segment)
        return None if speaker is None else self.speaker_name(speaker)

    def _on_speakers(self, segment: int, future: asyncio.Future[tuple[list[Turn], dict[int, int]]]) -> None:
        if self.closed or future.cancelled():
            return
        if (exc := future.exception()) is not None:
            log.warning("speaker labels failed for segment %d: %s", segment, exc)
            return
        turns, merged = future.result()
        if not turns:
            return
        spoken: dict[int, float] = {}
        for t in turns:
            spoken[t.speaker] = spoken.get(t.speaker, 0.0) + t.end - t.start
        self._speaker_ids[segment] = max(spoken, key=lambda k: spoken[k])
        self._turns[segment] = turns
        revised = []
        for seg, speaker in self._speaker_ids.items():
            if speaker in merged:
                self._speaker_ids[seg] = merged[speaker]
                self._turns[seg] = [dataclasses.replace(t, speaker=merged.get(t.speaker, t.speaker))
                                    for t in self._turns.get(seg, [])]
                revised.append(seg)
        self._announce(segment)
        for seg in revised:
            if seg != segment:
                self._announce(seg, revised=True)

    def _labelled(self, entry: Entry) -> list[Entry]:
        """A final's entry with its speaker, cut into runs of one speaker's words where the speaker changes inside
        the segment and its words say where (`labels.label`, the file path's rule), else whole."""
        label = self.speaker_label(entry.segment)
        if label is None:
            return [entry]
        turns = self._turns.get(entry.segment, [])
        if entry.words and _mixed(turns):
            from .labels import label as by_words  # imports the file path, which a session without labels needs not

            runs = by_words([entry], Diarization(turns, np.zeros((0, 0)), dict(self.names)), numbered=True)
            if len({e.speaker for e in runs}) > 1:
                return runs
        return [dataclasses.replace(entry, speaker=label)]

    def _whole(self, segment: int) -> Entry | None:
        """The segment's final as one entry again (its runs joined), None before it is there."""
        parts = self.transcript.entries_of(segment)
        if len(parts) < 2:
            return parts[0] if parts else None
        words = tuple(w for e in parts for w in e.words)
        return dataclasses.replace(parts[0], start=min(e.start for e in parts), end=max(e.end for e in parts),
                                   text="".join(w.word for w in words).strip(), words=words)

    def _announce(self, segment: int, revised: bool = False) -> None:
        """The segment's speaker into its transcript entry and out as an event, once its final is there."""
        label = self.speaker_label(segment)
        whole = self._whole(segment)
        if label is None or whole is None:
            return
        self.transcript.replace(segment, self._labelled(whole))
        turns = tuple((t.start, t.end, self.speaker_name(t.speaker)) for t in self._turns.get(segment, []))
        self._emit(SpeakerEvent(segment, label, turns, revised=revised))

    def rename(self, speaker: str, name: str) -> bool:
        """Call a speaker (by its current label) `name` from now on, in the transcript and its downloads."""
        number = next((n for n in set(self._speaker_ids.values()) if self.speaker_name(n) == speaker), None)
        name = " ".join(name.split())[:64]
        if number is None or not name:
            return False
        self.names[number] = name
        for seg, n in self._speaker_ids.items():
            if n == number:
                self._announce(seg, revised=True)
        return True

    def _emit(self, event: Event) -> None:
        try:
            self.on_event(event)
        except Exception:  # a broken consumer must not stop transcription
            log.exception("event consumer failed")

    @property
    def pending_finals(self) -> int:
        """Closed segments whose final (or error) has not been delivered yet."""
        return len(self._finals_pending)

    # -- control
    def choose(self, language: str | None, task: Literal["transcribe", "translate"] = "transcribe") -> None:
        """Decode in `language` (None: the model detects it) with `task` from the next job on (a segment already
        queued keeps what it was queued with)."""
        if (language, task) != (self.options.language, self.options.task):
            self.options = dataclasses.replace(self.options, language=language, task=task)

    def choose_turn(self, turn: TurnConfig | None) -> None:
        """End of turn from now on (None: the VAD's minimum silence ends a segment)."""
        if turn is not None and self._turn_model is None:
            self._turn_model = TurnModel.shared()
        self.turn = turn
        self.segmenter.hold_s = None if turn is None else turn.max_wait_s

    def clear(self) -> None:
        self.transcript.clear()

    def close(self) -> None:
        """Disconnect: cancel queued work and free the audio buffers."""
        self.closed = True
        self.worker.cancel_session(self.id)
        for future in self._finals_pending.values():
            future.cancel()
        self._finals_pending.clear()
        self._ends.clear()
        self._speculative = None
        self.segmenter = Segmenter(self.segmenter.config, self.segmenter.model)


def _mixed(turns: list[Turn]) -> bool:
    """More than one speaker in a segment's turns."""
    return len({t.speaker for t in turns}) > 1
