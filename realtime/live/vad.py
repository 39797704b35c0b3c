"""Streaming voice activity detection: Silero VAD probabilities turned into speech segments.

`SileroVAD` runs the ONNX model shipped inside the `silero-vad` wheel (no hub download) on 512-sample
windows at 16 kHz, a run of consecutive windows per call (its sequence export, bit-exact with the window-at-a-time
model); one model serves every session, each session keeps its own recurrent state.
`Segmenter` turns the per-window probabilities into `SegmentStart` / `SegmentEnd` events with
hysteresis, minimum speech and silence, padding and a forced split at the quietest point.
"""

from __future__ import annotations

import importlib.util
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..audio import SAMPLE_RATE
from ..config import VADConfig

WINDOW = 512  # samples per Silero window at 16 kHz (32 ms)
QUIET_ENERGY = WINDOW * 1e-9  # sum of squares of a window at -90 dBFS RMS: digital silence, not a quiet voice
LEVEL_TARGET = 0.1
"""Silero hears a quiet voice raised so that the recent peak level reaches this."""
LEVEL_FLOOR = 1e-3
"""Peaks below this (-60 dBFS) are a noise floor, not raised."""
LEVEL_MAX_GAIN = 30.0
LEVEL_HALF_LIFE_S = 5.0
_CONTEXT = 64
_BLOCK = 512
"""Most windows the model reads in one call (a file is read in long chunks; live audio a window at a time)."""
FAINT_THRESHOLD = 0.1
"""A file's windows this likely to be speech, outside every segment, are faint speech (`Segmenter(faint=True)`):
Silero may give a falsetto or creaky voice no more than this, where noise gets less."""
FAINT_GAP = 8
"""Windows below `FAINT_THRESHOLD` that a stretch of faint speech bridges (longer than the padding after it)."""
FAINT_MIN_S = 0.3
"""A stretch of faint speech this long is a segment of its own."""
FAINT_CLEAR_S = 0.3
"""A stretch of faint speech that ends this close to a segment's start is that segment's onset, not speech of its
own."""
FAINT_ONSET_S = 1.0
"""...but a stretch this long that runs into a segment's start is speech of its own (a phrase said under the breath,
or in a noisy room, before a louder one), not only its onset."""
FAINT_LOUD_DB = 40.0
"""A window this far above the noise floor carries an open stretch of faint speech on, whatever Silero gives it: a
voice Silero does not know (a falsetto) is loud all through a phrase of which it hears only a few windows."""
FLOOR_RISE_DB_S = 3.0
"""The noise floor (the quietest recent window outside every segment, digital silence aside) rises this fast, so
that it follows a room that grows noisier."""
FAINT_AFTER_S = 1.0
"""A stretch of faint speech that starts this soon after a segment's speech ends is its trailing sound (a breath, an
echo, a word said again under the breath), not speech of its own."""
FAINT_BACK_S = 3.0
"""A stretch of faint speech starts where the loud windows (`FAINT_LOUD_DB`) before its first faint one start, up to
this far back: a voice Silero does not know may be loud for a second or more before Silero gives it a window."""
FAINT_LOUD_MIN_S = 1.0
"""...and is a segment of its own if it is this long to its last faint window, though its faint windows alone are
shorter than `FAINT_MIN_S` (a breath or a click before a faint window is not that long)."""

def _silero_model_path() -> Path:
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the silero-vad package is not installed (pip install silero-vad)")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad_16k_sequence.onnx"


def one_thread_session(path: Path) -> Any:
    """An onnxruntime CPU session of the model at `path` that runs each call on one thread (the live models: many
    sessions call them side by side, the engine has the cores)."""
    import onnxruntime

    opts = onnxruntime.SessionOptions()
    opts.inter_op_num_threads = 1
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    return onnxruntime.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


class SileroVAD:
    """The Silero VAD ONNX model, loaded once per process and shared by all sessions."""

    _shared: SileroVAD | None = None
    _lock = threading.Lock()

    def __init__(self, path: Path | None = None) -> None:
        self._session = one_thread_session(path or _silero_model_path())

    @classmethod
    def shared(cls) -> SileroVAD:
        with cls._lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def new_state(self) -> VADState:
        return VADState()

    def probabilities(self, windows: np.ndarray, state: VADState) -> np.ndarray:
        """Speech probability of each of consecutive 512-sample windows (shape `(n, 512)`), as one stream
        continuing from `state`, which is updated in place."""
        contexts = np.empty((len(windows), _CONTEXT), dtype=np.float32)
        contexts[0] = state.context
        contexts[1:] = windows[:-1, -_CONTEXT:]
        x = np.concatenate([contexts, windows], axis=1, dtype=np.float32)
        out, state.h, state.c = self._session.run(None, {"input": x, "h": state.h, "c": state.c})
        state.context = windows[-1, -_CONTEXT:].astype(np.float32)
        return np.asarray(out, dtype=np.float64).reshape(-1)


@dataclass
class VADState:
    h: np.ndarray = None  # type: ignore[assignment]
    c: np.ndarray = None  # type: ignore[assignment]
    context: np.ndarray = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        self.h = np.zeros((1, 1, 128), dtype=np.float32)
        self.c = np.zeros((1, 1, 128), dtype=np.float32)
        self.context = np.zeros(_CONTEXT, dtype=np.float32)


@dataclass(frozen=True)
class SegmentStart:
    segment: int
    start: float
    """Start of speech, seconds since the stream began."""


@dataclass(frozen=True)
class SegmentEnd:
    segment: int
    start: float
    end: float
    """End of speech (unpadded), seconds since the stream began."""
    audio: np.ndarray
    """The segment's audio including padding."""
    forced: bool = False
    """True when the segment was cut at the maximum length rather than at a pause."""
    audio_start: float = 0.0
    """Stream time of the first sample of `audio` (the padding before the speech included)."""

    @property
    def heard(self) -> np.ndarray:
        """The audio an engine is given for this segment (a file's window may give more: transcribe.py)."""
        return self.audio


VADEvent = SegmentStart | SegmentEnd


class _Buffer:
    """Append-only float32 buffer; views handed out stay valid and unchanged."""

    def __init__(self, capacity: int) -> None:
        self._data = np.empty(capacity, dtype=np.float32)
        self.size = 0

    def append(self, x: np.ndarray) -> None:
        need = self.size + x.size
        if need > self._data.size:
            grown = np.empty(max(need, 2 * self._data.size), dtype=np.float32)
            grown[: self.size] = self._data[: self.size]
            self._data = grown
        self._data[self.size : need] = x
        self.size = need

    def view(self, start: int = 0, end: int | None = None) -> np.ndarray:
        return self._data[start : self.size if end is None else min(end, self.size)]


class Segmenter:
    """Per-session streaming segmentation. Feed 16 kHz float32 audio of any chunk size.

    With `faint`, a stretch outside every segment whose windows Silero hears only faintly (`FAINT_THRESHOLD`) for
    `FAINT_MIN_S` or more is a segment too, announced when it ends: speech such as a falsetto phrase that never reaches
    the threshold. Windows far louder than the noise floor (`FAINT_LOUD_DB`) carry such a stretch over those Silero does
    not hear at all. Files use it, where the engine's no-speech verdict can drop such a segment quietly; live sessions
    do not, where a segment is shown as it is heard."""

    def __init__(self, config: VADConfig | None = None, model: SileroVAD | None = None, faint: bool = False) -> None:
        self.config = config or VADConfig()
        self.model = model or SileroVAD.shared()
        self.faint = faint
        self._faint: _Buffer | None = None  # the open stretch of faint speech, its padding before it first
        self._faint_origin = 0  # stream sample index of its buffer's position 0
        self._faint_start = 0
        self._faint_last = 0  # stream sample index just past its last faint (or loud) window
        self._faint_heard = 0  # ...just past its last window Silero heard as faint speech
        self._faint_first = 0  # stream sample index of its first window Silero heard as faint speech
        self._floor: float | None = None  # noise floor, dB
        self._loud_from: int | None = None  # stream sample index where the current run of loud windows started
        self._loud_last = 0  # ...just past its last loud window
        self._recent: deque[tuple[int, np.ndarray]] = deque(
            maxlen=int((FAINT_BACK_S * SAMPLE_RATE + self.config.pad_before_ms * SAMPLE_RATE // 1000) // WINDOW) + 2)
        self._spoken = -(10**9)  # stream sample index where the last segment's speech ended
        self.state = self.model.new_state()
        ms = SAMPLE_RATE // 1000
        self._pad_before = self.config.pad_before_ms * ms
        self._pad_after = self.config.pad_after_ms * ms
        self._min_speech = self.config.min_speech_ms * ms
        self._min_silence = self.config.min_silence_ms * ms
        self._max_len = int(self.config.max_segment_s * SAMPLE_RATE)
        self._pending = np.zeros(0, dtype=np.float32)
        self._pending_heard: np.ndarray | None = None  # what Silero hears of `_pending`, where that differs
        self._preroll = np.zeros(0, dtype=np.float32)
        self.samples = 0  # samples processed through the model
        self._quiet = False
        self._ahead: deque[float] = deque()  # probabilities the model gave for the windows after this one
        self._level = 0.0  # recent peak level: rises at once, falls with LEVEL_HALF_LIFE_S
        self._level_decay = 0.5 ** (WINDOW / SAMPLE_RATE / LEVEL_HALF_LIFE_S)
        self._next_index = 0
        self.hold_s: float | None = None
        """While set, a pause closes the open segment only once it has lasted this long, or when `end_turn` says the
        speaker has finished (realtime/live/end_of_turn.py), not after `min_silence_ms`."""
        self._reset_segment()

    def _reset_segment(self) -> None:
        self.active = False
        self._announced = False
        self._buf: _Buffer | None = None
        self._buf_origin = 0  # stream sample index of buffer position 0
        self._speech_start = 0
        self._last_speech = 0  # stream sample index just past the last speech window
        self._silence_from: int | None = None
        self._probs: list[float] = []
        self._index = -1

    @property
    def segment(self) -> int:
        """Index of the open segment (valid while `announced`)."""
        return self._index

    @property
    def announced(self) -> bool:
        return self.active and self._announced

    @property
    def speech_start(self) -> float:
        return self._speech_start / SAMPLE_RATE

    def audio_so_far(self) -> np.ndarray:
        """The open segment's audio (with leading padding); an unchanging view, no copy."""
        return self._buf.view() if self._buf is not None else np.zeros(0, dtype=np.float32)

    @property
    def faint_from(self) -> int | None:
        """Stream sample index where the open stretch of faint speech's audio starts (it may yet be a segment, whose
        `SegmentStart` comes when it ends), or where it would start if a run of loud windows became one; else None."""
        if self._faint is not None:
            return self._faint_origin
        if self._loud_from is None:  # only a file's segmenter (`faint`) tracks loud windows
            return None
        return self._origin(max(self._loud_from, self._trail_end))

    @property
    def _trail_end(self) -> int:
        """Stream sample index where the last segment's trailing sound (`FAINT_AFTER_S`) ends."""
        return self._spoken + int(FAINT_AFTER_S * SAMPLE_RATE)

    def _origin(self, start: int) -> int:
        """Where the audio of a stretch of faint speech that starts at `start` starts: its padding, as a preroll."""
        return start + WINDOW - self._pad_before if self._pad_before else start

    @property
    def paused(self) -> bool:
        """Speech in the open segment has stopped (perhaps only for a moment)."""
        return self._silence_from is not None

    @property
    def pause(self) -> tuple[int, float] | None:
        """The announced open segment's pause, as (segment, stream seconds where its speech stopped); else None."""
        if not self.announced or self._silence_from is None:
            return None
        return self._index, self._silence_from / SAMPLE_RATE

    @property
    def pause_s(self) -> float:
        """How long the open segment's pause has lasted so far (0 while speech goes on)."""
        return 0.0 if self._silence_from is None else (self.samples - self._silence_from) / SAMPLE_RATE

    def end_turn(self) -> list[VADEvent]:
        """The speaker has finished: the open segment closes at its pause now."""
        events: list[VADEvent] = []
        if self.active and self._silence_from is not None:
            self._close(self._silence_from, events)
        return events

    def pending_end(self, after_s: float | None = None) -> tuple[int, float, np.ndarray] | None:
        """While speech has paused for at least `after_s` (default: the after-padding): (segment, end, audio) as
        the segment would close now. If the pause lasts `min_silence_ms`, the `SegmentEnd` carries exactly this
        end, and this audio except that here the after-padding not heard yet is silence (zeros)."""
        if not self.announced or self._silence_from is None or self._buf is None:
            return None
        wait = self._pad_after if after_s is None else min(self._pad_after, int(after_s * SAMPLE_RATE))
        if self.samples - self._silence_from < wait:
            return None
        cut = self._silence_from + self._pad_after
        heard = min(self.samples, cut)
        audio = self._buf.view(0, heard - self._buf_origin)
        if heard < cut:
            audio = np.concatenate([audio, np.zeros(cut - heard, dtype=np.float32)])
        return self._index, self._silence_from / SAMPLE_RATE, audio

    def feed(self, audio: np.ndarray, heard: np.ndarray | None = None) -> list[VADEvent]:
        """Segment events for the next samples of the stream. Silero hears `heard` in their place where it is
        given (as many samples: a denoised copy), while the segments carry `audio`."""
        events: list[VADEvent] = []
        data = np.concatenate([self._pending, audio]) if self._pending.size else audio
        n = data.size - data.size % WINDOW
        windows = data[:n].reshape(-1, WINDOW)
        ears = windows
        if heard is not None or self._pending_heard is not None:
            if heard is None:
                heard = audio
            if heard.size != audio.size:
                raise ValueError("the audio Silero hears must be as long as the audio it stands for")
            pending = self._pending_heard if self._pending_heard is not None else self._pending
            both = np.concatenate([pending, heard]) if pending.size else heard
            ears = both[:n].reshape(-1, WINDOW)
            self._pending_heard = both[n:].copy()
        for i in range(len(windows)):
            self._step(windows[i], events, ears[i + 1 : i + _BLOCK], ears[i])
        self._pending = data[n:].copy()
        return events

    def flush(self) -> list[VADEvent]:
        """End of stream: close the open segment if it is long enough."""
        events: list[VADEvent] = []
        if self._pending.size:
            ears = self._pending_heard if self._pending_heard is not None else self._pending
            self._step(np.pad(self._pending, (0, WINDOW - self._pending.size)), events, None,
                       np.pad(ears, (0, WINDOW - ears.size)))
            self._pending = np.zeros(0, dtype=np.float32)
            self._pending_heard = None
        if self.active:
            end = self._silence_from if self._silence_from is not None else self.samples
            self._close(end, events)
        self._close_faint(events)
        return events

    def _probability(self, window: np.ndarray, following: np.ndarray | None = None) -> float:
        """Silero's speech probability; digitally silent windows (below -90 dBFS) skip the model while no segment
        is open, and the model then starts again from a fresh state, as at the start of a stream. The model reads
        the window together with those of `following` (the windows after it) that no rule can skip, and their
        probabilities wait for their turn."""
        if self._ahead:
            return self._ahead.popleft()
        if not self.active and float(np.dot(window, window)) < QUIET_ENERGY:
            if not self._quiet:
                self.state = self.model.new_state()
                self._quiet = True
            return 0.0
        self._quiet = False
        block = [self._raised(window)]
        for w in following if following is not None else ():
            if float(np.dot(w, w)) < QUIET_ENERGY:
                break
            block.append(self._raised(w))
        first, *rest = self.model.probabilities(np.stack(block), self.state)
        self._ahead.extend(float(p) for p in rest)
        return float(first)

    def _raised(self, window: np.ndarray) -> np.ndarray:
        """The window as Silero should hear it: a quiet voice (laptop microphones without auto gain) raised by
        the gain that brings the recent peak level to LEVEL_TARGET; the segment's audio itself is not changed."""
        self._level = max(float(np.max(np.abs(window))), self._level * self._level_decay)
        if self._level >= LEVEL_TARGET or self._level < LEVEL_FLOOR:
            return window
        return window * min(LEVEL_MAX_GAIN, LEVEL_TARGET / self._level)

    def _step(self, window: np.ndarray, events: list[VADEvent], following: np.ndarray | None = None,
              heard: np.ndarray | None = None) -> None:
        p = self._probability(window if heard is None else heard, following)
        pos = self.samples
        self.samples += WINDOW
        cfg = self.config
        if not self.active:
            if p >= cfg.threshold:
                onset = self._close_faint(events, onset=pos - self._faint_last < FAINT_CLEAR_S * SAMPLE_RATE,
                                          before=pos - self._preroll.size)
                self._open(pos, window, carry=onset)
                return
            if self._pad_before:
                self._preroll = np.concatenate([self._preroll, window])[-self._pad_before :]
            if self.faint:
                self._track_faint(pos, window, p, events)
            return
        assert self._buf is not None
        self._buf.append(window)
        self._probs.append(p)
        if p >= cfg.threshold:
            self._silence_from = None
            self._last_speech = self.samples
        elif p < cfg.neg_threshold and self._silence_from is None:
            self._silence_from = pos
        if not self._announced and self._last_speech - self._speech_start >= self._min_speech:
            self._announced = True
            self._index = self._next_index
            self._next_index += 1
            events.append(SegmentStart(self._index, self._speech_start / SAMPLE_RATE))
        close_after = self._min_silence if self.hold_s is None else int(self.hold_s * SAMPLE_RATE)
        if self._silence_from is not None and self.samples - self._silence_from >= close_after:
            self._close(self._silence_from, events)
        elif self.samples - self._speech_start >= self._max_len:
            if self.hold_s is not None and self._silence_from is not None:
                self._close(self._silence_from, events)  # a held pause: the turn is as long as it may be
            else:
                self._split(events)

    def _loud(self, window: np.ndarray) -> bool:
        """Whether the window is `FAINT_LOUD_DB` above the noise floor, which it updates."""
        energy = float(np.dot(window, window))
        if energy < QUIET_ENERGY:
            return False
        level = 10.0 * float(np.log10(energy / WINDOW))
        rise = FLOOR_RISE_DB_S * WINDOW / SAMPLE_RATE
        self._floor = level if self._floor is None else min(level, self._floor + rise)
        return level >= self._floor + FAINT_LOUD_DB

    def _track_faint(self, pos: int, window: np.ndarray, p: float, events: list[VADEvent]) -> None:
        loud = self._loud(window)
        self._recent.append((pos, window))
        if self._faint is None:
            if loud:
                self._loud_from = pos if self._loud_from is None else self._loud_from
                self._loud_last = pos + WINDOW
            elif self._loud_from is not None and pos + WINDOW - self._loud_last > FAINT_GAP * WINDOW:
                self._loud_from = None
            after = self._trail_end
            if p < FAINT_THRESHOLD or pos < after:
                return
            start = pos
            if self._loud_from is not None:
                start = max(self._loud_from, after, pos - int(FAINT_BACK_S * SAMPLE_RATE))
                start += (pos - start) % WINDOW  # on a window's start
            origin = self._origin(start)
            kept = [(at, w) for at, w in self._recent if at + w.size > origin]  # this window is the last
            self._faint = _Buffer(int(SAMPLE_RATE * 2))
            for at, w in kept:
                self._faint.append(w[max(0, origin - at):])
            self._faint_origin = max(origin, kept[0][0])
            self._faint_start, self._faint_first = start, pos
            self._faint_last = self._faint_heard = pos + WINDOW
            self._loud_from = None
            return
        self._faint.append(window)
        if p >= FAINT_THRESHOLD:
            self._faint_last = self._faint_heard = pos + WINDOW
        elif loud:
            self._faint_last = pos + WINDOW
        ended = pos + WINDOW - self._faint_last > FAINT_GAP * WINDOW
        if ended or self._faint_last - self._faint_start >= self._max_len:
            self._close_faint(events)

    def _close_faint(self, events: list[VADEvent], onset: bool = False,
                     before: int | None = None) -> np.ndarray | None:
        """End the open stretch of faint speech: a segment if it is long enough and not only a segment's onset; its
        audio stops `before` (where the segment that closes it starts its audio). A stretch long enough that is only
        the onset of the segment that opens now is given back, with its padding, to start that segment's audio: Silero
        may hear the first words of a phrase in a noisy room only faintly ("So this is the" before "sick corpus")."""
        buf, self._faint = self._faint, None
        if buf is None:
            return None
        heard, loud = self._faint_heard - self._faint_first, self._faint_heard - self._faint_start
        if heard >= FAINT_MIN_S * SAMPLE_RATE:  # long enough by its faint windows: it starts at the first
            first = self._faint_first
        elif self._faint_start < self._faint_first and loud >= FAINT_LOUD_MIN_S * SAMPLE_RATE:
            first = self._faint_start
        else:
            return None
        origin = max(self._faint_origin, self._origin(first))
        if onset and heard < FAINT_ONSET_S * SAMPLE_RATE:
            return buf.view(origin - self._faint_origin).copy()
        stop = self._faint_last + self._pad_after if before is None else min(before, self._faint_last + self._pad_after)
        index, self._next_index = self._next_index, self._next_index + 1
        start, end = first / SAMPLE_RATE, min(self._faint_last, stop) / SAMPLE_RATE
        audio = buf.view(origin - self._faint_origin, stop - self._faint_origin).copy()
        events += [SegmentStart(index, start), SegmentEnd(index, start, end, audio, False, origin / SAMPLE_RATE)]
        return None

    def _open(self, pos: int, window: np.ndarray, carry: np.ndarray | None = None) -> None:
        self.active = True
        self._loud_from = None
        self._recent.clear()
        self._announced = False
        pre = self._preroll if carry is None else carry
        self._buf = _Buffer(int(SAMPLE_RATE * 4))
        self._buf.append(pre)
        self._buf.append(window)
        self._buf_origin = pos - pre.size
        self._speech_start = pos
        self._last_speech = pos + WINDOW
        self._silence_from = None
        self._probs = [1.0]
        self._preroll = np.zeros(0, dtype=np.float32)

    def _close(self, speech_end: int, events: list[VADEvent], forced: bool = False) -> None:
        assert self._buf is not None
        self._spoken = speech_end
        if self._announced:
            cut = speech_end + (0 if forced else self._pad_after)
            audio = self._buf.view(0, cut - self._buf_origin)
            events.append(
                SegmentEnd(self._index, self._speech_start / SAMPLE_RATE, speech_end / SAMPLE_RATE, audio, forced,
                           self._buf_origin / SAMPLE_RATE)
            )
        if self._pad_before:
            tail = self._buf.view()[-self._pad_before :]
            self._preroll = tail.copy()
        self._reset_segment()

    def _split(self, events: list[VADEvent]) -> None:
        """Cut a segment at max length at its quietest window in the last third; speech goes on."""
        assert self._buf is not None
        probs = np.asarray(self._probs)
        n = probs.size
        lo = max(1, (2 * n) // 3)
        audio = self._buf.view()
        first_window = self._speech_start - self._buf_origin  # offset of probs[0]'s window in buf
        best, best_key = n - 1, (2.0, 0.0)
        for i in range(lo, n):
            off = first_window + i * WINDOW
            w = audio[off : off + WINDOW]
            key = (float(probs[i]), float(np.sqrt(np.mean(w * w))) if w.size else 0.0)
            if key < best_key:
                best, best_key = i, key
        cut_in_buf = first_window + best * WINDOW
        cut = self._buf_origin + cut_in_buf
        rest = audio[cut_in_buf:].copy()
        index = self._index
        self._close(cut, events, forced=True)
        # the new segment continues immediately from the cut, already announced (speech is ongoing)
        self.active = True
        self._announced = True
        self._index = index + 1
        self._next_index = index + 2
        self._buf = _Buffer(int(SAMPLE_RATE * 4))
        self._buf.append(rest)
        self._buf_origin = cut
        self._speech_start = cut
        self._last_speech = self.samples
        self._silence_from = None
        self._probs = list(probs[best:])
        self._preroll = np.zeros(0, dtype=np.float32)
        events.append(SegmentStart(self._index, cut / SAMPLE_RATE))
