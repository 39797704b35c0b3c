"""The page: a `gr.Blocks` around fastrtc's `WebRTC` audio component, and the transcript's HTML."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import gradio as gr
from fastrtc import WebRTC

from .access import session_token
from .handler import TranscriptionHandler
from .service import TranscriptionService
from .transcript import TranscriptSnapshot
from .turn import Turn, TurnError

ASSETS = Path(__file__).resolve().parent.parent / "assets"
TRACK_CONSTRAINTS = {
    "echoCancellation": False,
    "noiseSuppression": False,
    "autoGainControl": False,
    "sampleRate": {"ideal": 48000},
    "sampleSize": {"ideal": 16},
    "channelCount": {"exact": 1},
}
TIME_LIMIT_BACKSTOP_S = 15.0  # fastrtc's own hang-up, after SessionLimits has ended the session with a message


def _clock(seconds: float) -> str:
    m, s = divmod(max(0.0, seconds), 60)
    return f"{int(m):02d}:{s:04.1f}"


def render_transcript(snapshot: TranscriptSnapshot | None) -> str:
    if snapshot is None or (not snapshot.entries and snapshot.partial is None):
        return '<div class="rt-empty">Press the microphone button and speak; words appear here as you talk.</div>'
    lines = []
    for e in snapshot.entries:
        when = f'<span class="rt-time">{_clock(e.start)} → {_clock(e.end)}</span>'
        if e.kind == "error":
            lines.append(f'<div class="rt-line">{when}<span class="rt-error">⚠ {html.escape(e.text)}</span></div>')
        elif e.text:
            lines.append(f'<div class="rt-line">{when}<span class="rt-final">{html.escape(e.text)}</span></div>')
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
    if event and event.get("type") == "closed":
        parts.append(f'<span class="rt-badge rt-closed">{html.escape(str(event.get("message")))}</span>')
    if session_id:
        sid = html.escape(session_id)
        query = f"?token={session_token(session_id)}" if service.settings.api_key else ""
        parts.append(f'<a href="transcript/{sid}.txt{query}" download="transcript.txt">download .txt</a>')
        parts.append(f'<a href="transcript/{sid}.srt{query}" download="transcript.srt">download .srt</a>')
    return " ".join(parts)


def render_notice(text: str | None) -> str:
    """Why a browser here may not connect (no TURN relay, relay broken, demo full), or nothing."""
    return f'<div class="rt-notice" role="alert">{html.escape(text)}</div>' if text else ""


def build_page(service: TranscriptionService, turn: Turn | None = None) -> tuple[gr.Blocks, WebRTC]:
    settings = service.settings
    turn = turn or Turn(settings)
    rtc = {"iceServers": turn.stun}  # per connection, turn.attach() hands out fresh TURN credentials
    theme = gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])
    head = f"<script>{(ASSETS / 'app.js').read_text()}</script>"
    with gr.Blocks(title="Real-time transcription", theme=theme, css=(ASSETS / "style.css").read_text(),
                   head=head, analytics_enabled=False) as page:
        gr.HTML("<h2 style='margin:0'>Real-time transcription</h2>"
                "<p style='margin:0.2rem 0 0.6rem'>Speak into your microphone; tentative words are grey, "
                "final text settles when you pause.</p>")
        with gr.Row():
            with gr.Column(scale=1, min_width=220):
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
                clear = gr.Button("Clear", elem_id="rt-clear", size="sm")
            with gr.Column(scale=3):
                notice = gr.HTML(render_notice(turn.notice(None)), elem_id="rt-notice")
                transcript = gr.HTML(render_transcript(None), elem_id="rt-transcript")
                status = gr.HTML(render_status(service, None, None), elem_id="rt-status")
        session_state = gr.State(None)

        audio.stream(
            TranscriptionHandler(service),
            inputs=[audio],
            outputs=[audio],
            concurrency_limit=settings.concurrency_limit,
            time_limit=(settings.session_time_limit + TIME_LIMIT_BACKSTOP_S) if settings.session_time_limit else None,
        )
        turn.attach(audio)

        def on_output(event: dict[str, Any], session_id: str) -> tuple[str, str, str, str]:
            page_html = render_transcript(service.snapshot(session_id))
            return page_html, render_status(service, session_id, event), session_id, ""

        audio.on_additional_outputs(on_output, outputs=[transcript, status, session_state, notice],
                                    concurrency_limit=None, queue=True)

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
            return render_transcript(None), render_status(service, session_id, None)

        clear.click(on_clear, inputs=[session_state], outputs=[transcript, status], queue=False)
    return page, audio
