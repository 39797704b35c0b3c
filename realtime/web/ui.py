"""The page: a live tab around fastrtc's `WebRTC` audio component, a file tab, and the HTML they render.

The live tab has a language picker (Detect and the engine's languages; fixed to English on an English-only model)
and, on a model that translates, a Translate to English toggle, applied to the live session at its first event and
on every change (from the next segment when changed mid-session); uploads on the file tab are decoded in
the picker's language too. It shows the session's transcript (time and, where the engine reports it, the spoken
language per line), its downloads and a copy button; `?view=captions` restyles it as large captions of the last
lines (assets/style.css, assets/app.js, which also says when the connection drops). The file tab sends an upload
through the service's file path (`transcribe_results` on the shared worker's file lane, as the HTTP API does) and
streams progress (segments done of those cut so far, audio covered) and text as segments finish, then the same four
downloads.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import html
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import gradio as gr
from fastrtc import WebRTC

from ..audio import AudioDecodeError
from ..engines import TranscribeOptions
from ..live import end_of_turn, labels
from ..live import transcript as fmt
from ..live.service import TranscriptionService
from ..live.transcribe import SegmentStream, timed_entries, transcribe_results
from ..live.transcript import Entry, TranscriptSnapshot
from ..live.vad import SegmentEnd
from .access import session_token
from .handler import (
    DETECT,
    TURN_CHOICES,
    TranscriptionHandler,
    apply_page_inputs,
    page_turn,
    page_vocabulary,
    picked_language,
)
from .turn import Turn, TurnError

ASSETS = Path(__file__).resolve().parents[2] / "assets"
TRACK_CONSTRAINTS = {
    "echoCancellation": False,
    "noiseSuppression": False,
    "autoGainControl": False,
    "sampleRate": {"ideal": 48000},
    "sampleSize": {"ideal": 16},
    "channelCount": {"exact": 1},
}
FILE_TYPES = [".wav", ".flac", ".mp3", ".ogg", ".oga", ".opus", ".webm", ".m4a", ".mp4", ".aac"]
"""What the file tab offers to pick: the containers the HTTP API decodes."""
LANGUAGE_NAMES = dict(pair.replace("_", " ").split("=") for pair in (
    "af=Afrikaans am=Amharic ar=Arabic as=Assamese az=Azerbaijani ba=Bashkir be=Belarusian bg=Bulgarian bn=Bengali "
    "bo=Tibetan br=Breton bs=Bosnian ca=Catalan cs=Czech cy=Welsh da=Danish de=German el=Greek en=English "
    "es=Spanish et=Estonian eu=Basque fa=Persian fi=Finnish fo=Faroese fr=French gl=Galician gu=Gujarati ha=Hausa "
    "haw=Hawaiian he=Hebrew hi=Hindi hr=Croatian ht=Haitian_Creole hu=Hungarian hy=Armenian id=Indonesian "
    "is=Icelandic it=Italian ja=Japanese jw=Javanese ka=Georgian kk=Kazakh km=Khmer kn=Kannada ko=Korean la=Latin "
    "lb=Luxembourgish ln=Lingala lo=Lao lt=Lithuanian lv=Latvian mg=Malagasy mi=Maori mk=Macedonian ml=Malayalam "
    "mn=Mongolian mr=Marathi ms=Malay mt=Maltese my=Burmese ne=Nepali nl=Dutch nn=Norwegian_Nynorsk no=Norwegian "
    "oc=Occitan pa=Punjabi pl=Polish ps=Pashto pt=Portuguese ro=Romanian ru=Russian sa=Sanskrit sd=Sindhi "
    "si=Sinhala sk=Slovak sl=Slovenian sn=Shona so=Somali sq=Albanian sr=Serbian su=Sundanese sv=Swedish "
    "sw=Swahili ta=Tamil te=Telugu tg=Tajik th=Thai tk=Turkmen tl=Tagalog tr=Turkish tt=Tatar uk=Ukrainian "
    "ur=Urdu uz=Uzbek vi=Vietnamese yi=Yiddish yo=Yoruba zh=Chinese yue=Cantonese").split())
"""English names of Whisper's languages, for the language picker (a code missing here is shown as itself)."""
DOWNLOADS = {"txt": "text/plain", "srt": "application/x-subrip", "vtt": "text/vtt", "json": "application/json"}
COPY_JS = """(...args) => { const box = document.getElementById("rt-transcript");
  const text = [...box.querySelectorAll(".rt-final")].map((e) => e.textContent.trim()).filter(Boolean).join("\\n");
  navigator.clipboard.writeText(text).then(() => window.rtSay && window.rtSay("Transcript copied"),
    () => window.rtSay && window.rtSay("The browser did not allow copying"));
  return args; }"""
SPEAKER_COLOURS = 8
"""Distinct colours for speaker labels (assets/style.css, .rt-speaker-0 to -7); more speakers reuse them."""
RENAME = re.compile(r"^\s*(?P<old>[^=]+?)\s*=\s*(?P<new>.+?)\s*$")
TIME_LIMIT_BACKSTOP_S = 15.0  # fastrtc's own hang-up, after SessionLimits has ended the session with a message


def _clock(seconds: float) -> str:
    m, s = divmod(max(0.0, seconds), 60)
    return f"{int(m):02d}:{s:04.1f}"


def _lines(entries: tuple[Entry, ...] | list[Entry], languages: dict[int, str] | None = None) -> list[str]:
    """A line per entry: its time, its language (the entry's own, else `languages` by segment), its speaker (a
    colour per speaker, in order of appearance) and its text."""
    lines = []
    colours: dict[str, int] = {}
    for e in entries:
        when = f'<span class="rt-time">{_clock(e.start)} → {_clock(e.end)}</span>'
        code = getattr(e, "language", None) or (languages or {}).get(e.segment)
        lang = f'<span class="rt-lang" title="language">{html.escape(str(code))}</span>' if code else ""
        who = ""
        if e.speaker:
            n = colours.setdefault(e.speaker, len(colours)) % SPEAKER_COLOURS
            who = f'<span class="rt-speaker rt-speaker-{n}" title="speaker">{html.escape(e.speaker)}</span>'
        if e.kind == "error":
            lines.append(f'<div class="rt-line">{when}<span class="rt-error">⚠ {html.escape(e.text)}</span></div>')
        elif e.text:
            lines.append(f'<div class="rt-line">{when}{lang}{who}<span class="rt-final">{html.escape(e.text)}</span>'
                         '</div>')
    return lines


def render_transcript(snapshot: TranscriptSnapshot | None, languages: dict[int, str] | None = None) -> str:
    """The live transcript; `languages` (segment -> code, from final events) labels lines whose entry has none."""
    if snapshot is None or (not snapshot.entries and snapshot.partial is None):
        return '<div class="rt-empty">Press the microphone button and speak; words appear here as you talk.</div>'
    lines = _lines(snapshot.entries, languages)
    p = snapshot.partial
    if p is not None:
        lines.append(
            f'<div class="rt-line rt-partial"><span class="rt-time">{_clock(p.start)} → …</span>'
            f'<span class="rt-committed">{html.escape(p.committed)}</span> '
            f'<span class="rt-tentative">{html.escape(p.tentative)}</span></div>'
        )
    return "\n".join(lines)


def render_status(service: TranscriptionService, session_id: str | None, event: dict[str, Any] | None) -> str:
    info = service.engine.describe()
    parts = [
        f'<span class="rt-badge">engine: {html.escape(str(info.get("engine")))}</span>',
        f'<span class="rt-badge">model: {html.escape(str(info.get("model")))}</span>',
    ]
    precision = info.get("summary") or info.get("compute_type")
    if precision:
        parts.append(f'<span class="rt-badge">{html.escape(str(precision))}</span>')
    session = service.sessions.get(session_id) if session_id else None
    if session is not None and session.last_latency is not None:
        parts.append(f'<span class="rt-badge">last final latency: {session.last_latency:.2f} s</span>')
    if event and event.get("type") == "error":
        parts.append(f'<span class="rt-badge rt-error">engine error: {html.escape(str(event.get("message")))}</span>')
    kept = service.history.describe() if service.history is not None else None
    if kept and kept.get("error"):
        parts.append(f'<span class="rt-badge rt-error">history not saved ({kept["behind"]} writes waiting, '
                     f'retried): {html.escape(str(kept["error"]))}</span>')
    if event and event.get("type") == "closed":
        parts.append(f'<span class="rt-badge rt-closed">{html.escape(str(event.get("message")))}</span>')
    if session_id:
        sid = html.escape(session_id)
        query = f"?token={session_token(session_id)}" if service.settings.api_key else ""
        links = " ".join(f'<a href="transcript/{sid}.{ext}{query}" download="transcript.{ext}">.{ext}</a>'
                         for ext in DOWNLOADS)
        parts.append(f'<span class="rt-downloads">download {links}</span>')
    return " ".join(parts)


def language_choices(engine_languages: tuple[str, ...]) -> list[tuple[str, str]]:
    """The picker's (label, value) pairs: Detect (on a model that detects), then the engine's languages by name."""
    named = sorted((f"{LANGUAGE_NAMES.get(code, code)} ({code})", code) for code in engine_languages)
    return named if len(engine_languages) == 1 else [("Detect", DETECT), *named]


def render_file_language(engine_languages: tuple[str, ...], value: str | None) -> str:
    """The File tab's note of the language its uploads are decoded in (the Live tab's picker)."""
    code = picked_language(engine_languages, value, None)
    name = f"{LANGUAGE_NAMES.get(code, code)} ({code})" if code else "detected per segment"
    return f'<p class="rt-file-language">Language: {html.escape(name)} (the Live tab\'s picker)</p>'


def _data_url(text: str, media: str) -> str:
    return f"data:{media};charset=utf-8;base64,{base64.b64encode(text.encode()).decode()}"


def render_downloads(entries: list[Entry], language: str | None) -> str:
    """Links that hold the file's transcript in each format (data: URLs: no second request, nothing stored)."""
    if not any(e.text and e.kind == "final" for e in entries):
        return ""
    docs = {"txt": fmt.to_text(entries) + "\n", "srt": fmt.to_srt(entries), "vtt": fmt.to_vtt(entries),
            "json": fmt.to_json(entries, **({"language": language} if language else {}))}
    links = " ".join(f'<a href="{_data_url(docs[ext], media)}" download="transcript.{ext}">.{ext}</a>'
                     for ext, media in DOWNLOADS.items())
    return f'<span class="rt-downloads">download {links}</span>'


def render_file_text(entries: list[Entry], languages: dict[int, str]) -> str:
    if not entries:
        return ('<div class="rt-empty">Drop a recording above, or pick one; its text appears here as it is '
                'transcribed.</div>')
    return "\n".join(_lines(entries, languages))


def render_progress(done: int, cut: int, cutting: bool, covered: float, duration: float | None,
                    error: str | None = None, labelling: bool = False) -> str:
    """The file's progress: a bar over the audio transcribed and the count of segments done of those cut; with
    `labelling`, the speaker labels are still to come."""
    if error:
        return f'<div class="rt-progress-error" role="alert">⚠ {html.escape(error)}</div>'
    total = f"{cut}{'+' if cutting else ''}"
    label = (f"{done} of {total} segments transcribed" + (" (still cutting)" if cutting else "")
             + (f" · {_clock(covered)} of {_clock(duration)}" if duration else ""))
    fraction = 1.0 if not cutting and done >= cut else min(0.99, covered / duration) if duration else None
    bar = (f'<progress max="1" value="{fraction:.3f}" aria-label="transcription progress"></progress>'
           if fraction is not None else '<progress aria-label="transcription progress"></progress>')
    if labelling and not cutting and done >= cut:
        label, fraction = "telling the speakers apart", 0.99
    state = "done" if not cutting and done >= cut and not labelling else "running"
    return (f'<div class="rt-progress" data-state="{state}" data-done="{done}" data-total="{cut}" '
            f'role="status">{bar}<span>{html.escape(label)}</span></div>')


class _CountingStream(SegmentStream):
    """A SegmentStream that counts the segments its thread has cut, and knows when it has cut them all."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cut = 0
        self.cutting = True

    def _push(self, item: object) -> None:
        if isinstance(item, SegmentEnd):
            self.cut += 1
        else:
            self.cutting = False
        super()._push(item)


def _probe_duration(path: Path) -> float | None:
    import av

    try:
        with av.open(str(path)) as container:
            if container.duration:
                return container.duration / 1_000_000
            stream = container.streams.audio[0]
            return float(stream.duration * stream.time_base) if stream.duration and stream.time_base else None
    except Exception:
        return None


async def transcribe_upload(service: TranscriptionService, path: str | None,
                            language: str | None = None, speakers: bool = True,
                            vocabulary: str | None = None) -> AsyncIterator[tuple[str, str, str]]:
    """(progress, text, downloads) HTML as the file's segments are cut and transcribed; `language` is the
    picker's value (None: the app's setting). With the speaker model loaded (and `speakers`), the lines are
    labelled with their speakers once the whole file is heard; `vocabulary` is the vocabulary box's text (None: the
    app's `--vocabulary`)."""
    if not path:
        yield "", render_file_text([], {}), ""
        return
    settings, engine = service.settings, service.engine
    if not service.ready or not engine.ready:
        yield render_progress(0, 0, False, 0, None, f"the {engine.name} engine is not ready; try again soon"), "", ""
        return
    chosen = picked_language(engine.languages, language, settings.language) if language else settings.language
    window = (settings.file_window_s or None) if engine.timestamps else None
    duration = await asyncio.to_thread(_probe_duration, Path(path))
    segments = _CountingStream(path, settings.vad_config(), window_s=window)
    entries: list[Entry] = []
    languages: dict[int, str] = {}
    speech: list[tuple[float, float]] = []
    done, covered, language = 0, 0.0, chosen
    labelling = speakers and service.speakers_ready
    # speaker labels go by the words' times: a line spoken by two people is cut where the speaker changes
    options = TranscribeOptions(language=chosen, timestamps=bool(engine.timestamps),
                                word_timestamps=bool(labelling and engine.word_timestamps),
                                vocabulary=page_vocabulary(service, vocabulary))
    yield render_progress(0, 0, True, 0, duration), render_file_text([], {}), ""
    try:
        async for end, result in transcribe_results(path, service.file_worker(), options=options, stream=segments):
            done += 1
            covered = max(covered, end.end)
            speech += labels.speech_spans(end, settings.vad_config())
            if isinstance(result, BaseException):
                new = [Entry(len(entries), end.start, end.end, f"transcription failed: {result}", kind="error")]
            else:
                new = [e for e in timed_entries(end, result, len(entries)) if e.text]
                language = language or result.language
                languages.update({e.segment: result.language for e in new if result.language})
            entries.extend(new)
            yield (render_progress(done, segments.cut, segments.cutting, covered, duration, labelling=labelling),
                   render_file_text(entries, languages), "")
    except AudioDecodeError as exc:
        message = str(exc).replace(str(path), "the upload")
        yield render_progress(done, segments.cut, False, covered, duration, f"not decodable audio: {message}"), "", ""
        return
    if labelling and entries:
        diarization = await asyncio.to_thread(labels.diarize_file, service.diarizer(), path, speech)
        entries = [dataclasses.replace(e, words=()) for e in labels.label(entries, diarization, numbered=True)]
    text = (render_file_text(entries, languages) if entries
            else '<div class="rt-empty">No speech was found in this recording.</div>')
    kept = ""
    if service.history is not None and entries:
        try:
            await asyncio.to_thread(service.history.save, "file", entries, max(covered, duration or 0),
                                    language, Path(path).name, Path(path))
            kept = ' <span class="rt-kept">kept in the History tab</span>'
        except Exception as exc:
            kept = f' <span class="rt-error">not kept in the history: {html.escape(str(exc))}</span>'
    yield (render_progress(done, segments.cut, False, max(covered, duration or 0), duration), text,
           render_downloads(entries, language) + kept)


def render_notice(text: str | None) -> str:
    """Why a browser here may not connect (no TURN relay, relay broken, demo full), or nothing."""
    return f'<div class="rt-notice" role="alert">{html.escape(text)}</div>' if text else ""


async def connection_outputs(rtc: WebRTC, value: Any) -> AsyncIterator[tuple[Any, ...]]:
    """The additional outputs of the connection `value` names, until it ends, then those still queued.

    fastrtc's own `on_additional_outputs` streams from a defaultdict: an output event the page starts just after
    the connection was cleaned up (a stop while a "fetch_output" message was on its way) creates a fresh queue
    that nothing ever ends, and since the page's output event runs once at a time, no later session of that page
    showed anything. Here an ended or unknown connection has no outputs, and the last ones queued before the end
    (a final delivered as the user stops) are still given."""
    webrtc_id = getattr(value, "webrtc_id", value)
    queue = rtc.additional_outputs.get(webrtc_id) if isinstance(webrtc_id, str) else None
    if queue is None:
        return
    while not queue.quit.is_set():  # clean_up sets it as it drops the queue; so does the page's stop
        try:
            yield (await asyncio.wait_for(queue.queue.get(), 0.1)).args
        except TimeoutError:
            continue
    while not queue.queue.empty():
        yield queue.queue.get_nowait().args


class PageTranscripts:
    """What the page shows of a live session: its transcript joined after those of the earlier sessions of the same
    page that it carries on from (the user started again after a stop or a dropped connection; Clear starts
    afresh), later sessions' times shifted to follow on, and the language each final event reported per line.
    The page renders it and the `/transcript/{id}.{ext}` downloads read it."""

    def __init__(self, service: TranscriptionService) -> None:
        self.service = service
        self.earlier: dict[str, tuple[str, ...]] = {}
        self.languages: dict[str, dict[int, str]] = {}

    def _prune(self) -> None:
        for table in (self.earlier, self.languages):
            for sid in [sid for sid in table if self.service.snapshot(sid) is None]:
                del table[sid]

    def carry_on(self, previous: str | None, session_id: str) -> None:
        """`session_id` continues the page's transcript that `previous` (its last session, if any) held."""
        if not previous or previous == session_id or session_id in self.earlier:
            return
        if self.service.snapshot(previous) is None:
            return
        self._prune()
        self.earlier[session_id] = (*self.earlier.get(previous, ()), previous)

    def note(self, session_id: str, event: dict[str, Any]) -> None:
        if event.get("type") == "final" and event.get("language"):
            self.languages.setdefault(session_id, {})[int(event["segment"])] = str(event["language"])

    def forget(self, session_id: str) -> None:
        self.earlier.pop(session_id, None)
        self.languages.pop(session_id, None)

    def joined(self, session_id: str) -> tuple[TranscriptSnapshot, dict[int, str]] | None:
        """The joined snapshot and the language by (joined) segment number, or None for an unknown session."""
        current = self.service.snapshot(session_id)
        if current is None:
            return None
        parts = [(sid, snap) for sid in self.earlier.get(session_id, ())
                 if (snap := self.service.snapshot(sid)) is not None]
        if not parts:
            return current, dict(self.languages.get(session_id, {}))
        entries: list[Entry] = []
        languages: dict[int, str] = {}
        offset = 0.0
        partial = None
        for sid, snap in [*parts, (session_id, current)]:
            own = self.languages.get(sid, {})
            for e in snap.entries:
                if e.segment in own:
                    languages[len(entries)] = own[e.segment]
                entries.append(dataclasses.replace(e, segment=len(entries), start=round(e.start + offset, 3),
                                                   end=round(e.end + offset, 3)))
            if snap is current and current.partial is not None:
                p = current.partial
                partial = dataclasses.replace(p, segment=len(entries), start=p.start + offset, end=p.end + offset)
            offset = entries[-1].end if entries else offset
        return TranscriptSnapshot(tuple(entries), partial), languages

    def snapshot(self, session_id: str) -> TranscriptSnapshot | None:
        joined = self.joined(session_id)
        return joined[0] if joined else None


def build_page(service: TranscriptionService, turn: Turn | None = None,
               transcripts: PageTranscripts | None = None,
               more_tabs: Callable[[gr.Blocks], None] | None = None) -> tuple[gr.Blocks, WebRTC]:
    """The page; `more_tabs` adds tabs after Live and File (inside the page's `gr.Tabs`; given the page, for its
    load event)."""
    settings = service.settings
    transcripts = transcripts or PageTranscripts(service)
    turn = turn or Turn(settings)
    rtc = {"iceServers": turn.stun}  # per connection, turn.attach() hands out fresh TURN credentials
    engine = service.engine
    languages = engine.languages
    multilingual = len(languages) > 1
    chosen = settings.language if settings.language in languages else DETECT if multilingual else languages[0]
    theme = gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])
    head = f"<script>{(ASSETS / 'app.js').read_text()}</script>"
    with gr.Blocks(title="Real-time transcription", theme=theme, css=(ASSETS / "style.css").read_text(),
                   head=head, analytics_enabled=False) as page:
        gr.HTML("<h1 class='rt-title'>Real-time transcription</h1>", elem_id="rt-header")
        gr.HTML('<div id="rt-connection" role="status" aria-live="polite"></div>', elem_id="rt-connection-box")
        with gr.Tabs(elem_id="rt-tabs"):
            with gr.Tab("Live", id="live", elem_id="rt-tab-live"):
                gr.HTML("<p class='rt-intro'>Speak into your microphone; tentative words are grey, final text "
                        "settles when you pause. <a href='?view=captions'>Captions view</a></p>")
                with gr.Row():
                    with gr.Column(scale=1, min_width=220):
                        picker = gr.Dropdown(
                            language_choices(languages),
                            value=chosen,
                            label="Language",
                            info=None if multilingual else "this model is English-only",
                            interactive=multilingual,
                            filterable=True,
                            elem_id="rt-language",
                        )
                        translate = gr.Checkbox(False, label="Translate to English", visible=engine.translates,
                                                info="finals and partials in English", elem_id="rt-translate")
                        speakers = gr.Checkbox(True, label="Speaker labels", visible=settings.diarize,
                                               info="who spoke each line", elem_id="rt-speakers")
                        vocabulary = gr.Textbox(settings.vocabulary, label="Vocabulary", max_lines=2,
                                                placeholder="names and terms, comma-separated",
                                                info="words the speech may hold that the model may not know",
                                                elem_id="rt-vocabulary")
                        waiting = gr.Dropdown(list(TURN_CHOICES), value=page_turn(settings.end_of_turn),
                                              label="A line ends at", visible=end_of_turn.available(),
                                              info="a pause inside a sentence waits for the rest of it",
                                              elem_id="rt-end-of-turn")
                        audio = WebRTC(
                            label="Microphone",
                            modality="audio",
                            mode="send",
                            rtc_configuration=rtc,
                            server_rtc_configuration=rtc,
                            track_constraints=TRACK_CONSTRAINTS,
                            full_screen=False,
                            elem_id="rt-webrtc",
                        )
                        with gr.Row():
                            copy = gr.Button("Copy text", elem_id="rt-copy", size="sm")
                            clear = gr.Button("Clear", elem_id="rt-clear", size="sm")
                        with gr.Row(visible=settings.diarize):
                            rename = gr.Textbox(label="Rename a speaker", placeholder="Speaker 1 = Alice",
                                                elem_id="rt-rename", scale=3)
                            rename_button = gr.Button("Rename", elem_id="rt-rename-button", size="sm", scale=1)
                    with gr.Column(scale=3, min_width=280):
                        notice = gr.HTML(render_notice(turn.notice(None)), elem_id="rt-notice")
                        transcript = gr.HTML(render_transcript(None), elem_id="rt-transcript")
                        status = gr.HTML(render_status(service, None, None), elem_id="rt-status")
            with gr.Tab("File", id="file", elem_id="rt-tab-file"):
                upload = gr.File(label=f"Recording ({', '.join(t[1:] for t in FILE_TYPES)})",
                                 file_types=FILE_TYPES, type="filepath", elem_id="rt-file-input")
                file_language = gr.HTML(render_file_language(languages, chosen), elem_id="rt-file-language")
                file_progress = gr.HTML("", elem_id="rt-file-progress")
                file_text = gr.HTML(render_file_text([], {}), elem_id="rt-file-text")
                file_downloads = gr.HTML("", elem_id="rt-file-downloads")
            if more_tabs is not None:
                more_tabs(page)
        session_state = gr.State(None)

        audio.stream(
            TranscriptionHandler(service),
            inputs=[audio],
            outputs=[audio],
            concurrency_limit=settings.concurrency_limit,
            time_limit=(settings.session_time_limit + TIME_LIMIT_BACKSTOP_S) if settings.session_time_limit else None,
        )
        turn.attach(audio)

        primed: set[str] = set()

        def on_output(previous: str | None, language: str | None, translating: bool, labelling: bool, waits: str,
                      terms: str, event: dict[str, Any], session_id: str) -> tuple[str, str, str, str]:
            if session_id not in primed and (session := service.sessions.get(session_id)) is not None:
                primed.intersection_update(service.sessions)
                primed.add(session_id)  # its first event (speech started): the inputs as the stream started
                apply_page_inputs(service, session, language, translating, labelling, waits, terms)
            transcripts.carry_on(previous, session_id)
            transcripts.note(session_id, event)
            joined = transcripts.joined(session_id)
            page_html = render_transcript(*joined) if joined else render_transcript(None)
            return page_html, render_status(service, session_id, event), session_id, ""

        async def outputs(value: Any, previous: str | None, language: str | None, translating: bool,
                          labelling: bool, waits: str, terms: str) -> AsyncIterator[tuple[str, str, str, str]]:
            async for event, session_id in connection_outputs(audio, value):
                yield on_output(previous, language, translating, labelling, waits, terms, event, session_id)

        # the inputs are read when a stream's outputs start: the page's last session, which a new one carries on
        # from, and the picker and toggle as they were then (later changes: on_pick, on the session in session_state)
        audio.state_change(outputs, inputs=[audio, session_state, picker, translate, speakers, waiting, vocabulary],
                           outputs=[transcript, status, session_state, notice], concurrency_limit=None, queue=True,
                           show_progress="minimal", trigger_mode="once")

        async def on_upload(path: str | None, language: str | None, labelling: bool,
                            terms: str) -> AsyncIterator[tuple[str, str, str]]:
            async for out in transcribe_upload(service, path, language, labelling, terms):
                yield out

        upload.change(on_upload, inputs=[upload, picker, speakers, vocabulary],
                      outputs=[file_progress, file_text, file_downloads],
                      concurrency_limit=settings.concurrency_limit, show_progress="hidden")
        def on_pick(session_id: str | None, language: str | None, translating: bool, labelling: bool,
                    waits: str, terms: str) -> str:
            if session_id and (session := service.sessions.get(session_id)) is not None:
                apply_page_inputs(service, session, language, translating, labelling, waits, terms)  # from the next job
            return render_file_language(languages, language)

        # the vocabulary box when it is left or submitted, not at each keystroke (a request each)
        for trigger in (picker.change, translate.change, speakers.change, waiting.change, vocabulary.blur,
                        vocabulary.submit):
            trigger(on_pick, inputs=[session_state, picker, translate, speakers, waiting, vocabulary],
                    outputs=[file_language], queue=False, show_progress="hidden")

        def on_rename(session_id: str | None, asked: str) -> tuple[str, str]:
            match = RENAME.match(asked or "")
            joined = transcripts.joined(session_id) if session_id else None
            if session_id and match and joined:
                # a label in an earlier session of the page is renamed there too
                for sid in (*transcripts.earlier.get(session_id, ()), session_id):
                    service.rename_speaker(sid, match["old"], match["new"])
                joined = transcripts.joined(session_id)
            return (render_transcript(*joined) if joined else render_transcript(None)), ""

        rename_button.click(on_rename, inputs=[session_state, rename], outputs=[transcript, rename], queue=False)
        rename.submit(on_rename, inputs=[session_state, rename], outputs=[transcript, rename], queue=False)
        copy.click(None, js=COPY_JS)

        def on_load(request: gr.Request) -> str:
            return render_notice(turn.notice(request.headers.get("host")))

        async def on_start(request: gr.Request) -> str:
            # runs beside the component's own turn() call: the same (cached) credentials, the same verdict
            try:
                await turn.ice_servers()
            except TurnError:
                pass
            if len(audio.pcs) >= settings.concurrency_limit:
                n = settings.concurrency_limit
                return render_notice(f"This demo is full: {n} session{'s' if n != 1 else ''} at a time, all in use. "
                                     "Try again in a minute, or duplicate the Space to run your own.")
            return render_notice(turn.notice(request.headers.get("host")))

        page.load(on_load, outputs=[notice], queue=False, show_progress="hidden")
        audio.start_recording(on_start, outputs=[notice], queue=False, show_progress="hidden")

        def on_clear(session_id: str | None) -> tuple[str, str]:
            if session_id:
                service.clear(session_id)
                transcripts.forget(session_id)
            return render_transcript(None), render_status(service, session_id, None)

        clear.click(on_clear, inputs=[session_state], outputs=[transcript, status], queue=False)
    return page, audio
