"""The page's History tab: the sessions the history keeps (realtime/store), newest first, searched by the words
said; one opened to read with its speakers and times, retitled, downloaded in the four formats, or deleted; with
its audio kept, transcribed again with a model chosen (its earlier texts kept as versions, each one readable).

With `--api-key` the tab asks for the key before it lists anything; without a history it says why there is none.
"""

from __future__ import annotations

import asyncio
import html
import time
from typing import Any

import gradio as gr

from ..config import Settings
from ..live.retranscribe import Retranscriber
from ..live.service import TranscriptionService
from ..live.transcript import Entry
from ..store import Recorder, Store, StoredSession, Version
from .access import is_key, session_token
from .api_fields import APIError
from .history import retranscribe
from .ui import render_downloads, render_file_text

LISTED = 50


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


def _length(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def choice_label(s: StoredSession) -> str:
    """One session in the list: when, how long, its title or first words, its speakers, and how it ended."""
    parts = [_when(s.started_at), _length(s.duration), s.title or s.preview or "(no speech)"]
    if s.speakers:
        parts.append(", ".join(s.speakers))
    if s.state != "ended":
        parts.append(s.state)
    return " · ".join(parts)


def render_off(settings: Settings, store: Store | None) -> str:
    """What the tab says of where sessions are kept, or why none are."""
    if store is not None:
        where = {"sqlite": "in this server's data folder", "postgresql": "in PostgreSQL"}.get(store.dialect, "")
        return (f'<p class="rt-history-note">Every session is kept {where}; search the words said, open one to read '
                "it, rename, download or delete it.</p>")
    if settings.space_id and not settings.history and not settings.api_key:
        why = ("this Space keeps none without an API key (REALTIME_API_KEY), or every visitor could read every "
               "session")
    elif settings.space_id:
        why = "this Space has no persistent storage" if settings.history else "REALTIME_HISTORY is false"
    else:
        why = "the app was started with --no-history"
    return (f'<p class="rt-history-note">No history: {why}. Transcripts are kept in memory until they age out; '
            "download them from the Live tab.</p>")


def render_audio_link(settings: Settings, recorder: Recorder | None, session_id: str) -> str:
    """A link to the session's kept audio (`--keep-audio`), where there is some."""
    if recorder is None or recorder.audio_file(session_id) is None:
        return ""
    query = f"?token={session_token(session_id)}" if settings.api_key else ""
    sid = html.escape(session_id)
    link = f'<a href="v1/transcripts/{sid}/audio{query}" download="{sid}.ogg">.ogg</a>'
    return f' <span class="rt-downloads">audio {link}</span>'


def version_choices(summary: StoredSession, versions: list[Version]) -> list[tuple[str, str]]:
    """The texts a session has had, newest first: its own, then its versions (the live draft last)."""
    now = [(f"current · {summary.model}", "current")]
    live = summary.source in ("webrtc", "realtime")
    return now + [(f"version {v.number} · {'live draft' if v.number == 1 and live else 'earlier'} · {v.model} · "
                   f"{_when(v.made_at)}", str(v.number)) for v in reversed(versions)]


def build_history_tab(tab: gr.Tab, service: TranscriptionService, store: Store | None,
                      recorder: Recorder | None = None, passes: Retranscriber | None = None,
                      page: gr.Blocks | None = None) -> None:
    """The tab's components and events, inside its `gr.Tab` context: it lists the sessions when the `page` loads
    and when the tab is selected (a click on the tab while the page is still starting sends no select event). The
    tab must render its children with the page (`render_children=True`): Gradio mounts an inactive tab's components
    only when it is selected and drops updates sent to them before, and the select event's answer can come before
    they are mounted. `recorder` has the sessions' audio where it is kept, `passes` transcribes it again."""
    settings = service.settings
    passes = passes or Retranscriber(service)
    gr.HTML(render_off(settings, store), elem_id="rt-history-note")
    with gr.Row():
        key = gr.Textbox(label="API key", type="password", visible=bool(settings.api_key and store is not None),
                         elem_id="rt-history-key", scale=1)
        query = gr.Textbox(label="Search", placeholder="words said", visible=store is not None,
                           elem_id="rt-history-search", scale=3)
        search = gr.Button("Search", size="sm", visible=store is not None, elem_id="rt-history-search-button",
                           scale=1)
    listing = gr.Radio([], label="Sessions, newest first", visible=store is not None, elem_id="rt-history-list")
    with gr.Column(visible=False, elem_id="rt-history-session") as opened:
        with gr.Row():
            title = gr.Textbox(label="Title", elem_id="rt-history-title", scale=3)
            retitle = gr.Button("Rename", size="sm", elem_id="rt-history-rename", scale=1)
            delete = gr.Button("Delete", size="sm", variant="stop", elem_id="rt-history-delete", scale=1)
        downloads = gr.HTML("", elem_id="rt-history-downloads")
        with gr.Row(visible=False, elem_id="rt-history-again-row") as again_row:
            model = gr.Dropdown(passes.models(), value=passes.models()[0], label="Model", scale=2,
                                elem_id="rt-history-model")
            again = gr.Button("Transcribe again", size="sm", elem_id="rt-history-again", scale=1)
        again_status = gr.HTML("", elem_id="rt-history-again-status")
        version = gr.Dropdown([], label="Text", visible=False, elem_id="rt-history-version")
        text = gr.HTML("", elem_id="rt-history-text")
    if store is None:
        return

    def links(summary: StoredSession, entries: tuple[Entry, ...]) -> str:
        """The four downloads of a session's text, and its audio where it is kept."""
        return render_downloads(list(entries), summary.language) + render_audio_link(settings, recorder, summary.id)

    def allowed(given: str | None) -> bool:
        return not settings.api_key or is_key(given or "", settings.api_key)

    async def listed(given: str | None, q: str | None, keep: str | None = None) -> dict[str, Any]:
        if not allowed(given):
            return gr.update(choices=[], value=None, label="Sessions: enter the API key")
        found = await asyncio.to_thread(store.sessions, q or None, LISTED)
        choices = [(choice_label(s), s.id) for s in found]
        label = (f"Sessions with “{q.strip()}”" if q and q.strip() else "Sessions, newest first") + \
            ("" if found else ": none")
        return gr.update(choices=choices, value=keep if keep in {c[1] for c in choices} else None, label=label)

    async def on_list(given: str | None, q: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
        return await listed(given, q), gr.update(visible=False)

    async def on_open(given: str | None, session_id: str | None) -> tuple[Any, ...]:
        found = await asyncio.to_thread(store.session, session_id) if session_id and allowed(given) else None
        if found is None:
            return gr.update(visible=False), "", "", "", gr.update(visible=False), gr.update(visible=False), ""
        summary, entries = found
        versions = await asyncio.to_thread(store.versions, summary.id)
        kept = recorder is not None and recorder.audio_file(summary.id) is not None and summary.state != "live"
        return (gr.update(visible=True), summary.title or "", links(summary, entries),
                render_file_text(list(entries), {}), gr.update(visible=kept),
                gr.update(choices=version_choices(summary, versions), value="current", visible=bool(versions)), "")

    async def on_version(given: str | None, session_id: str | None, number: str | None) -> str:
        if not session_id or not allowed(given):
            return ""
        if number and number != "current":
            kept = {str(v.number): v for v in await asyncio.to_thread(store.versions, session_id)}
            return render_file_text(list(kept[number].entries), {}) if number in kept else ""
        found = await asyncio.to_thread(store.session, session_id)
        return render_file_text(list(found[1]), {}) if found else ""

    async def on_again(given: str | None, session_id: str | None, chosen: str | None) -> tuple[Any, ...]:
        if not session_id or not allowed(given):
            return (gr.update(),) * 3 + ("",)
        try:
            number, summary, entries = await retranscribe(service, store, recorder, passes, session_id, chosen)
        except APIError as exc:
            return (gr.update(),) * 3 + (f'<span class="rt-error">{html.escape(exc.message)}</span>',)
        versions = await asyncio.to_thread(store.versions, session_id)
        done = (f'<span class="rt-kept">transcribed again with {html.escape(summary.model)}; the text before is '
                f"version {number}</span>")
        return (links(summary, entries), render_file_text(list(entries), {}),
                gr.update(choices=version_choices(summary, versions), value="current", visible=True), done)

    async def on_retitle(given: str | None, session_id: str | None, new: str | None,
                         q: str | None) -> dict[str, Any]:
        if session_id and allowed(given):
            await asyncio.to_thread(store.retitle, session_id, new or "")
        return await listed(given, q, keep=session_id)

    async def on_delete(given: str | None, session_id: str | None,
                        q: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
        if session_id and allowed(given) and await asyncio.to_thread(store.delete, session_id) and recorder:
            recorder.forget([session_id])
        return await listed(given, q), gr.update(visible=False)

    for trigger in (tab.select, search.click, query.submit, key.submit, *([page.load] if page is not None else [])):
        trigger(on_list, inputs=[key, query], outputs=[listing, opened], queue=False)
    listing.input(on_open, inputs=[key, listing],
                  outputs=[opened, title, downloads, text, again_row, version, again_status], queue=False)
    version.input(on_version, inputs=[key, listing, version], outputs=[text], queue=False)
    again.click(lambda: '<span class="rt-progress-note">transcribing again…</span>', outputs=[again_status],
                queue=False).then(on_again, inputs=[key, listing, model], outputs=[downloads, text, version,
                                                                                     again_status])
    retitle.click(on_retitle, inputs=[key, listing, title, query], outputs=[listing], queue=False)
    title.submit(on_retitle, inputs=[key, listing, title, query], outputs=[listing], queue=False)
    delete.click(on_delete, inputs=[key, listing, query], outputs=[listing, opened], queue=False)

