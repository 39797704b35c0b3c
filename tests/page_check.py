"""Drive every part of the page in headless Chromium against launched apps; write what happened as JSON.

Run by tests/test_page.py inside a loopback-only network namespace:
    unshare --net bash -c 'ip link set lo up && exec python tests/page_check.py --mic W --upload F --out O --shots D'
The default app (`python app.py --ice-loopback`, conftest.launch) and one browser whose fake microphone loops
`--mic`:
- `live`: the live view transcribes the microphone; lines, downloads (fetched from the page), the copy button;
  then stop and start again: does the transcript carry on;
- `captions`: `?view=captions` while it transcribes: which lines are visible and how large;
- `file`: the file tab and its drop zone reached with the keyboard, `--upload` given, every progress state the
  page shows recorded until done;
- `phone`: a phone-sized viewport, both tabs: does anything overflow sideways;
- `synth`: a browser of its own whose microphone plays `--synth` once (tests/browser_check.py `transcribe`): the
  final lines, the ICE pairs, the requests, a screenshot;
- `drop`: the live view transcribing, then the app is killed: what the page says and what it keeps;
- `history`: the app started again on the same data folder, twice: its History tab (search, open, retitle,
  download, delete, a session transcribed again with base and its live draft read back), and what the second
  restart still shows.
The live scenario also records the language picker of the default (English-only) model. Beside them, in a thread
of their own, each with its own browser, two more apps, launched at the start and used one after the other:
- `language` (with `--language-mic`): an app on the multilingual base model (`--model base`) and a browser whose
  microphone loops `--language-mic` (German): German picked with the keyboard, the live view transcribing, then
  Translate to English switched on mid-session; before the live session, the file tab is given `--language-upload`
  with German picked;
- `speakers` (with `--speakers-mic`): an app with speaker labels (`--diarize`) and a browser whose microphone loops
  people taking turns: the file tab (given the same recording) and the live view label who spoke each line, and a
  speaker renamed on the page is renamed in the download.
Every request any page makes is recorded. Every wait is for something the page shows, with a deadline that only a
fault reaches.
"""

from __future__ import annotations

import argparse
import base64
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from browser_check import CONNECTION_STATE, FLAGS, FRAMES, KEEP_PCS, TIMEOUT_S, transcribe
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, sync_playwright
from playwright.sync_api import Error as PlaywrightError

from conftest import App, launch, stop

LINES = """(sel) => [...document.querySelectorAll(`${sel} .rt-line`)].map((l) => ({
  time: l.querySelector(".rt-time")?.textContent.trim() ?? "",
  lang: l.querySelector(".rt-lang")?.textContent.trim() ?? "",
  speaker: l.querySelector(".rt-speaker")?.textContent.trim() ?? "",
  colour: l.querySelector(".rt-speaker") ? getComputedStyle(l.querySelector(".rt-speaker")).backgroundColor : "",
  final: l.querySelector(".rt-final")?.textContent.trim() ?? "",
  partial: !!l.querySelector(".rt-committed, .rt-tentative"),
  visible: l.offsetParent !== null && l.getBoundingClientRect().height > 0,
  font_px: parseFloat(getComputedStyle(l).fontSize) }))"""
FETCH = """async (hrefs) => { const out = {};
  for (const [ext, href] of Object.entries(hrefs)) { const r = await fetch(href);
    out[ext] = { status: r.status, type: r.headers.get("content-type"), text: await r.text() }; }
  return out; }"""
LINKS = """(sel) => Object.fromEntries([...document.querySelectorAll(`${sel} .rt-downloads a`)].map(
  (a) => [a.getAttribute("download").split(".").pop(), a.getAttribute("href")]))"""
PROGRESS = """() => { const p = document.querySelector("#rt-file-progress .rt-progress");
  const bar = p?.querySelector("progress");
  return { state: p?.dataset.state ?? null, done: +(p?.dataset.done ?? 0), total: +(p?.dataset.total ?? 0),
           value: bar ? bar.value : null, label: p?.innerText.trim() ?? "",
           error: document.querySelector("#rt-file-progress .rt-progress-error")?.innerText ?? null,
           lines: [...document.querySelectorAll("#rt-file-text .rt-final")].map((e) => e.textContent.trim()) }; }"""
FILE_DONE = """() => !!document.querySelector("#rt-file-progress .rt-progress-error")
  || (document.querySelector("#rt-file-progress .rt-progress")?.dataset.state === "done"
      && document.querySelectorAll("#rt-file-downloads .rt-downloads a").length >= 4)"""
"""The file tab has shown its last update: done with the downloads (the progress reads done one update before
them), or an error."""
WATCH_PROGRESS = f"""(() => {{ window.__progress = []; const read = {PROGRESS};
  const key = (s) => [s.done, s.total, s.state, s.lines.length, !!s.error].join();
  new MutationObserver(() => {{ const s = read(), last = window.__progress.at(-1);
    if (s.state !== null && (!last || key(last) !== key(s))) window.__progress.push(s); }})
    .observe(document, {{ childList: true, subtree: true, characterData: true, attributes: true }}); }})();"""
"""Every progress state the file tab shows, in order, as the page renders it (window.__progress): none is missed
between two reads."""
OVERFLOW = """() => ({ width: innerWidth, scroll: document.documentElement.scrollWidth,
  wide: [...document.querySelectorAll(
    "#rt-webrtc, #rt-language, #rt-transcript, #rt-status, #rt-file-input, #rt-tabs button")]
    .filter((e) => e.offsetParent !== null).map((e) => [e.id || e.textContent.trim(), e.getBoundingClientRect().right])
    .filter(([, right]) => right > innerWidth + 1) })"""


PICKER = """() => { const box = document.querySelector("#rt-language input");
  const toggle = document.querySelector("#rt-translate input[type=checkbox]");
  return { present: !!box, value: box?.value ?? null, disabled: box ? box.disabled : null,
           visible: !!box && box.offsetParent !== null,
           translate: !!toggle && toggle.offsetParent !== null, translating: !!toggle?.checked }; }"""


DEADLINE_S = 300.0
"""How long a scenario waits for a line or a file's progress to show: reached only when something is wrong, not
when the machine is busy (the multilingual model live on a loaded 2-core machine took over 2 minutes to a first
final)."""


def finals(page: Page) -> list[str]:
    return [line["final"] for line in page.evaluate(LINES, "#rt-transcript") if line["final"]]


def start_live(context: BrowserContext, url: str, before: Callable[[Page], None] | None = None) -> Page:
    """A page on `url` streaming its microphone; `before(page)` runs once the page is up, before it starts."""
    page = context.new_page()
    page.add_init_script(KEEP_PCS)
    page.goto(url, wait_until="load")
    access = page.locator("#rt-webrtc").get_by_role("button", name="Click to Access Microphone")
    access.wait_for(state="visible", timeout=30_000)
    if before is not None:
        before(page)
    access.click()
    page.locator('#rt-webrtc button[aria-label="start stream"]').click(timeout=10_000)
    return page


def wait_finals(page: Page, n: int, timeout: float) -> list[str]:
    """The final lines once there are `n` (or what there is after `timeout`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(finals(page)) < n:
        page.wait_for_timeout(200)
    return finals(page)


def shows(page: Page, condition: str, timeout: float, arg: Any = None) -> bool:
    """Whether the page comes to satisfy `condition` (a JS function of `arg`) within `timeout` seconds."""
    try:
        page.wait_for_function(condition, arg=arg, timeout=timeout * 1000)
        return True
    except PlaywrightError:
        return False


def record_console(page: Page, sink: list[str]) -> None:
    """The page's console messages from now on, each with the time it came, into `sink`."""
    page.on("console", lambda m: sink.append(f"{time.monotonic():.1f} {m.text[:300]}"))


def live(context: BrowserContext, app: App, shots: Path) -> dict[str, Any]:
    picker: dict[str, Any] = {}
    console: list[str] = []
    page = start_live(context, app.url, lambda pg: picker.update(pg.evaluate(PICKER)))
    record_console(page, console)
    page.evaluate("""() => { let last = -1; new MutationObserver(() => {
        const n = document.querySelectorAll("#rt-transcript .rt-final").length;
        if (n !== last) { last = n; console.log(`rt-finals ${n}`); } }).observe(document.body,
        { childList: true, subtree: true, characterData: true }); }""")
    r: dict[str, Any] = {"picker": picker, "finals": wait_finals(page, 2, DEADLINE_S), "console": console}
    r["lines"] = page.evaluate(LINES, "#rt-transcript")
    r["status"] = page.inner_text("#rt-status")
    r["connection"] = page.evaluate(CONNECTION_STATE)
    links = page.evaluate(LINKS, "#rt-status")
    r["links"] = links
    r["downloads"] = page.evaluate(FETCH, links)
    shown = finals(page)
    page.focus("#rt-copy")
    page.keyboard.press("Enter")
    shows(page, "() => !!document.getElementById('rt-say')?.textContent", 10)
    r["copied"] = page.evaluate("() => navigator.clipboard.readText()")
    r["shown_at_copy"] = shown
    r["said"] = page.evaluate("() => document.getElementById('rt-say')?.textContent ?? ''")
    page.screenshot(path=str(shots / "page-live.png"))
    # stop, then start again: the page carries on in the same transcript, and so do its downloads
    button = page.locator('#rt-webrtc button[aria-label="start stream"]')  # the audio component's one toggle
    button.click(timeout=10_000)
    page.wait_for_function("""() => /record/i.test(document.querySelector(
        '#rt-webrtc button[aria-label="start stream"]').textContent)""", timeout=10_000)
    # the stopped session's lines stay; a page on a busy machine may still be re-rendering them (ci14: none shown
    # 1.5 s after the stop, both there after the restart)
    r["restart_before"] = wait_finals(page, len(shown), 30)
    r["restart_before_lines"] = page.evaluate(LINES, "#rt-transcript")
    r["restart_before_status"] = page.inner_text("#rt-status")
    console.append(f"{time.monotonic():.1f} -- started again")
    button.click(timeout=10_000)
    # the new session's links show with its first event, after the last outputs of the stopped one (the page's
    # output event runs once at a time): the next final line is the new session's
    r["restart_opened"] = shows(page, """(old) => { const a = document.querySelector(
        '#rt-status .rt-downloads a[download$=".txt"]'); return !!a && a.getAttribute("href") !== old; }""",
                                DEADLINE_S, links.get("txt"))
    r["restart_after"] = wait_finals(page, len(finals(page)) + 1, DEADLINE_S)
    r["restart_lines"] = page.evaluate(LINES, "#rt-transcript")
    r["restart_downloads"] = page.evaluate(FETCH, page.evaluate(LINKS, "#rt-status"))
    r["restart_links"] = page.evaluate(LINKS, "#rt-status")
    page.close()
    return r


def captions(context: BrowserContext, app: App, shots: Path) -> dict[str, Any]:
    console: list[str] = []
    page = start_live(context, f"{app.url}/?view=captions", lambda p: record_console(p, console))
    seen: list[list[str]] = []
    deadline = time.monotonic() + DEADLINE_S
    lines: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        lines = page.evaluate(LINES, "#rt-transcript")
        visible = [line["final"] or "(partial)" for line in lines if line["visible"]]
        if visible and (not seen or seen[-1] != visible):
            seen.append(visible)
        if sum(1 for line in lines if line["final"]) >= 4:
            break
        page.wait_for_timeout(200)
    # what the page said (its status line is hidden in this view), for a run that shows no line
    r: dict[str, Any] = {"lines": lines, "seen": seen, "console": console[-40:],
                         "status": page.evaluate("() => document.querySelector('#rt-status')?.textContent ?? ''"),
                         "connection": page.evaluate(CONNECTION_STATE)}
    r["hidden"] = page.evaluate("""() => ["#rt-header", "#rt-status", "#rt-copy"].map(
        (s) => document.querySelector(s)?.offsetParent === null)""")
    r["control_visible"] = page.locator("#rt-webrtc").is_visible()
    page.screenshot(path=str(shots / "page-captions.png"))
    page.close()
    return r


def file_tab(browser: Browser, app: App, upload: Path, requests: list[str], shots: Path) -> dict[str, Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.add_init_script(FRAMES)
    context.on("request", lambda q: requests.append(q.url))
    page = context.new_page()
    page.add_init_script(WATCH_PROGRESS)
    page.on("websocket", lambda ws: requests.append(ws.url))
    page.goto(app.url, wait_until="load")
    page.locator("#rt-webrtc").get_by_role("button", name="Click to Access Microphone").wait_for(timeout=30_000)
    r: dict[str, Any] = {"tabs": 0}
    page.locator("body").focus()
    for presses in range(1, 60):
        page.keyboard.press("Tab")
        focused = page.evaluate("() => [document.activeElement.getAttribute('role'), "
                                "document.activeElement.textContent.trim()]")
        if focused == ["tab", "File"]:
            r["tabs"] = presses
            break
    page.keyboard.press("Enter")
    try:
        page.locator("#rt-file-input").wait_for(state="visible", timeout=10_000)
        r["input_reached"] = True
    except PlaywrightError:
        r["input_reached"] = False
    # on to the drop zone (a button that opens the file chooser) with Tab; the file is then given to its input
    r["focus_path"] = []
    for _ in range(20):
        page.keyboard.press("Tab")
        r["focus_path"].append(page.evaluate("() => document.activeElement.getAttribute('aria-label') || "
                                             "document.activeElement.textContent.trim().slice(0, 30)"))
        if page.evaluate("() => !!document.activeElement.closest('#rt-file-input')"):
            break
    page.locator("#rt-file-input input[type=file]").set_input_files(str(upload))
    r["mid_shot"] = shows(page, """() => window.__progress.some((s) => s.state === "running" && s.done >= 1
        && s.lines.length)""", DEADLINE_S)
    if r["mid_shot"]:
        page.screenshot(path=str(shots / "page-file.png"))
    shows(page, FILE_DONE, DEADLINE_S)
    links = page.evaluate(LINKS, "#rt-file-downloads")
    r.update(states=page.evaluate("() => window.__progress"), final=page.evaluate(PROGRESS),
             lines=page.evaluate(LINES, "#rt-file-text"),
             downloads={ext: base64.b64decode(href.split(",", 1)[1]).decode() for ext, href in links.items()
                        if href.startswith("data:")}, link_schemes=[h.split(":", 1)[0] for h in links.values()])
    context.close()
    return r


def phone(browser: Browser, app: App, requests: list[str], shots: Path) -> dict[str, Any]:
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True,
                                  device_scale_factor=2)
    context.add_init_script(FRAMES)
    context.on("request", lambda q: requests.append(q.url))
    page = context.new_page()
    page.goto(app.url, wait_until="load")
    access = page.locator("#rt-webrtc").get_by_role("button", name="Click to Access Microphone")
    access.wait_for(timeout=30_000)
    r: dict[str, Any] = {"live": page.evaluate(OVERFLOW)}
    box = access.bounding_box()
    r["access_box"] = box
    page.screenshot(path=str(shots / "page-phone.png"))
    page.get_by_role("tab", name="File").tap()
    page.locator("#rt-file-input").wait_for(state="visible", timeout=10_000)
    r["file"] = page.evaluate(OVERFLOW)
    context.close()
    return r


def drop(context: BrowserContext, app: App, shots: Path) -> dict[str, Any]:
    page = start_live(context, app.url)
    r: dict[str, Any] = {"before": wait_finals(page, 1, DEADLINE_S)}
    r["connection_before"] = page.evaluate(CONNECTION_STATE)
    r["status_before"] = page.inner_text("#rt-status")
    app.proc.kill()
    app.proc.wait(10)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not page.inner_text("#rt-connection").strip():
        page.wait_for_timeout(250)
    r["notice"] = page.inner_text("#rt-connection").strip()
    r["after"] = finals(page)
    r["connection"] = page.evaluate(CONNECTION_STATE)
    page.screenshot(path=str(shots / "page-dropped.png"))
    page.close()
    return r


HISTORY = """() => ({ choices: [...document.querySelectorAll("#rt-history-list label")].map((l) => l.innerText.trim()),
  label: document.querySelector("#rt-history-list .block-title, #rt-history-list [data-testid=block-info]")
    ?.innerText.trim() ?? "",
  opened: document.querySelector("#rt-history-session")?.offsetParent != null,
  title: document.querySelector("#rt-history-title textarea, #rt-history-title input")?.value ?? null })"""


def history_tab(page: Page, word: str, shots: Path | None) -> dict[str, Any]:
    """The History tab: listed when selected; searched for `word`; the newest match opened (its lines and srt)."""
    r: dict[str, Any] = {}
    shows(page, "() => document.querySelectorAll('#rt-history-list label').length > 0", 30)
    r["before_click"] = page.evaluate(HISTORY)  # listed when the page loaded, the tab not selected yet
    page.get_by_role("tab", name="History").click()
    shows(page, "() => document.querySelectorAll('#rt-history-list label').length > 0", 30)
    r["listed"] = page.evaluate(HISTORY)
    box = page.locator("#rt-history-search textarea, #rt-history-search input").first
    box.fill(word)
    box.press("Enter")
    shows(page, "(w) => (document.querySelector('#rt-history-list')?.innerText ?? '').includes(w)", 30, word)
    r["searched"] = page.evaluate(HISTORY)
    page.locator("#rt-history-list label").first.click()
    shows(page, "() => document.querySelectorAll('#rt-history-downloads .rt-downloads a').length >= 4", 30)
    r["lines"] = page.evaluate(LINES, "#rt-history-text")
    links = page.evaluate(LINKS, "#rt-history-downloads")
    r["srt"] = base64.b64decode(links["srt"].split(",", 1)[1]).decode() if links.get("srt", "").startswith(
        "data:") else None
    r["opened"] = page.evaluate(HISTORY)
    if shots is not None:
        page.screenshot(path=str(shots / "page-history.png"))
    return r


TEXT = "() => document.querySelector('#rt-history-text')?.innerText ?? ''"


def transcribe_again(page: Page) -> dict[str, Any]:
    """In the History tab, the newest session not retitled whose audio is kept: its lines, then "Transcribe again"
    with the default model (base): what the tab says, its lines after, and its first text (version 1: the live draft,
    or an upload's first reading) read back from the Text menu."""
    r: dict[str, Any] = {"without_audio": []}
    labels = page.locator("#rt-history-list label")
    for i in range(labels.count()):
        label = labels.nth(i).inner_text().strip()
        if "Weekly standup" in label:
            continue
        before = page.evaluate(TEXT)
        labels.nth(i).click()
        shows(page, f"(t) => ({TEXT})() !== t", 30, before)
        if page.locator("#rt-history-again").is_visible():
            r["session"] = label
            break
        r["without_audio"].append(label)
    else:
        return r
    r["before"] = page.evaluate(LINES, "#rt-history-text")
    page.locator("#rt-history-again").click()
    shows(page, "() => (document.querySelector('#rt-history-again-status')?.innerText ?? '').includes('again with')",
          300)
    r["status"] = page.locator("#rt-history-again-status").inner_text().strip()
    r["after"] = page.evaluate(LINES, "#rt-history-text")
    menu = page.locator("#rt-history-version input").first
    menu.click()
    options = page.locator("ul[role=listbox] li")
    r["versions"] = [o.strip() for o in options.all_inner_texts()]
    before = page.evaluate(TEXT)
    options.filter(has_text="version 1").first.click()
    shows(page, f"(t) => ({TEXT})() !== t", 30, before)
    r["draft"] = page.evaluate(LINES, "#rt-history-text")
    return r


def default_data(out: Path) -> dict[str, str]:
    """The default app's data folder, its own: the other apps (launched beside it in the same folder) keep theirs
    apart, so that its History tab shows its sessions only; it keeps each session's audio (`--keep-audio`)."""
    return {"REALTIME_DATA_DIR": str(out.parent / "default-data"), "REALTIME_KEEP_AUDIO": "1"}


def history(p: Playwright, out: Path, word: str, shots: Path) -> dict[str, Any]:
    """After the default app was killed (`drop`): the app started again on the same data folder, its History tab
    (its sessions from before the kill, the one killed interrupted): a word searched, the match opened, retitled,
    its srt downloaded; another session deleted. Then a second restart: the title and the deletion stayed, and
    the search, the opening and the download work again."""
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=FLAGS)
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    r: dict[str, Any] = {"word": word}
    for round_ in ("restarted", "again"):
        app = launch(out.parent, env=default_data(out))
        try:
            page = context.new_page()
            page.goto(app.url, wait_until="load")
            seen = history_tab(page, word, shots if round_ == "restarted" else None)
            if round_ == "restarted":
                title = page.locator("#rt-history-title textarea, #rt-history-title input").first
                title.fill("Weekly standup")
                page.locator("#rt-history-rename").click()
                shows(page, "() => document.querySelector('#rt-history-list')?.innerText.includes('Weekly standup')",
                      30)
                seen["retitled"] = page.evaluate(HISTORY)
                box = page.locator("#rt-history-search textarea, #rt-history-search input").first
                box.fill("")
                box.press("Enter")
                shows(page, "(n) => document.querySelectorAll('#rt-history-list label').length > n", 30,
                      len(seen["searched"]["choices"]))
                page.locator("#rt-history-list label").last.click()
                shows(page, "() => document.querySelector('#rt-history-session')?.offsetParent != null", 30)
                seen["deleting"] = page.evaluate(HISTORY)["choices"][-1]
                page.locator("#rt-history-delete").click()
                shows(page, "(gone) => ![...document.querySelectorAll('#rt-history-list label')].some("
                      "(l) => l.innerText.trim() === gone)", 30, seen["deleting"])
                seen["deleted"] = page.evaluate(HISTORY)
                seen["transcribed_again"] = transcribe_again(page)
            page.close()
            r[round_] = seen
        finally:
            stop(app)
    browser.close()
    return r


def english(lines: list[str]) -> bool:
    """Whether the last line has at least two of English's commonest short words (a wait condition only)."""
    words = set(" ".join(lines[-1:]).lower().replace(",", " ").replace(".", " ").split())
    return len(words & {"the", "of", "you", "and", "to", "a", "in", "is", "that", "for", "it", "if"}) >= 2


def poll_file(page: Page, timeout: float) -> dict[str, Any]:
    """The file tab's progress once it is done (or failed, or `timeout` passed)."""
    shows(page, FILE_DONE, timeout)
    return page.evaluate(PROGRESS)


def language(p: Playwright, app: App, mic: Path, upload: Path, requests: list[str], shots: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    marks: dict[str, float] = {}
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                args=[*FLAGS, f"--use-file-for-fake-audio-capture={mic.resolve()}"])
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.add_init_script(FRAMES)
    context.on("request", lambda q: requests.append(q.url))
    r: dict[str, Any] = {"marks": marks}

    def pick_german(page: Page) -> None:
        r["picker"] = page.evaluate(PICKER)
        page.focus("#rt-language input")  # the keyboard: type over the value to filter, then pick the match
        page.keyboard.press("ControlOrMeta+a")
        page.keyboard.type("Germ")
        page.keyboard.press("ArrowDown")
        page.keyboard.press("Enter")
        page.keyboard.press("Tab")
        shows(page, f"() => ({PICKER})().value === 'German (de)'", 10)
        r["chosen"] = page.evaluate(PICKER)
        page.get_by_role("tab", name="File").click()  # before the live session: the file lane waits behind it
        shows(page, "() => document.querySelector('#rt-file-language')?.innerText.includes('German (de)')", 10)
        page.locator("#rt-file-input input[type=file]").set_input_files(str(upload))
        r["file"] = poll_file(page, DEADLINE_S)
        r["file_lines"] = page.evaluate(LINES, "#rt-file-text")
        r["file_note"] = page.inner_text("#rt-file-language")
        marks["file"] = round(time.monotonic() - t0, 1)
        page.get_by_role("tab", name="Live").click()

    page = start_live(context, app.url, pick_german)
    page.on("websocket", lambda ws: requests.append(ws.url))
    wait_finals(page, 1, DEADLINE_S)
    r["german"] = page.evaluate(LINES, "#rt-transcript")
    marks["german"] = round(time.monotonic() - t0, 1)
    r["toggled_at"] = len([line for line in r["german"] if line["final"]])
    page.focus("#rt-translate input[type=checkbox]")
    page.keyboard.press("Space")
    r["toggled"] = page.evaluate(PICKER)
    # segments queued before the toggle keep German: wait for a final that reads as English
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline and not english(finals(page)[r["toggled_at"]:][-1:]):
        page.wait_for_timeout(200)
    r["translated"] = page.evaluate(LINES, "#rt-transcript")
    marks["translated"] = round(time.monotonic() - t0, 1)
    page.screenshot(path=str(shots / "page-language.png"))
    context.close()
    browser.close()
    return r


def speakers(p: Playwright, app: App, mic: Path, requests: list[str], shots: Path,
             until: str | None = None) -> dict[str, Any]:
    """A browser whose microphone loops a conversation: the file tab labels the conversation's lines; the live
    view labels its finals (with `until`, also a labelled final line that says it), a speaker is renamed, and the
    download has the name."""
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                args=[*FLAGS, f"--use-file-for-fake-audio-capture={mic.resolve()}"])
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.add_init_script(FRAMES)
    context.on("request", lambda q: requests.append(q.url))
    r: dict[str, Any] = {}

    def upload_first(page: Page) -> None:
        r["toggle"] = page.evaluate("""() => { const t = document.querySelector("#rt-speakers input");
            return { visible: !!t && t.offsetParent !== null, checked: !!t?.checked }; }""")
        page.get_by_role("tab", name="File").click()  # before the live session: the file lane waits behind it
        page.locator("#rt-file-input input[type=file]").set_input_files(str(mic))
        r["file"] = poll_file(page, DEADLINE_S)
        r["file_lines"] = page.evaluate(LINES, "#rt-file-text")
        page.get_by_role("tab", name="Live").click()

    page = start_live(context, app.url, upload_first)
    page.on("websocket", lambda ws: requests.append(ws.url))
    # once four voices have spoken: every one of those lines labelled (the microphone goes on, and on a busy
    # machine a newer final may always be waiting for the speaker model)
    deadline = time.monotonic() + DEADLINE_S
    r["settled"] = 0
    while time.monotonic() < deadline:
        lines = [x for x in page.evaluate(LINES, "#rt-transcript") if x["final"]]
        if not r["settled"] and len(lines) >= 5:
            r["settled"] = len(lines)
        if r["settled"] and all(x["speaker"] for x in lines[:r["settled"]]):
            break
        page.wait_for_timeout(300)
    while until and time.monotonic() < deadline:
        if any(until in x["final"] and x["speaker"] for x in page.evaluate(LINES, "#rt-transcript")):
            page.wait_for_timeout(2000)  # a later window of that segment may still revise its turns
            break
        page.wait_for_timeout(300)
    r["lines"] = page.evaluate(LINES, "#rt-transcript")
    page.screenshot(path=str(shots / "page-speakers.png"))
    page.fill("#rt-rename textarea, #rt-rename input", "Speaker 1 = Alice")
    page.keyboard.press("Enter")
    page.wait_for_function("""() => [...document.querySelectorAll("#rt-transcript .rt-speaker")]
        .some((e) => e.textContent.trim() === "Alice")""", timeout=20_000)
    r["renamed"] = page.evaluate(LINES, "#rt-transcript")
    r["downloads"] = page.evaluate(FETCH, page.evaluate(LINKS, "#rt-status"))
    context.close()
    browser.close()
    return r


Scenario = tuple[str, Callable[[], dict[str, Any]]]


def run_all(scenarios: list[Scenario], results: dict[str, Any], only: list[str] | None) -> None:
    """Each scenario in order, its result (or the exception it raised: the next one still runs) and its seconds
    into `results`."""
    for name, run in scenarios:
        if only and name not in only:
            continue
        t0 = time.monotonic()
        try:
            results[name] = run()
        except Exception as exc:  # recorded for the test to report
            results[name] = {"exception": repr(exc)}
        results["timings"][name] = round(time.monotonic() - t0, 1)


OTHER_APPS = {"language": ("--model", "base"), "speakers": ("--diarize",)}
"""The apps of the scenarios beside the default app's, by scenario: each launched at the start (their start-up
overlaps the default app's scenarios), then used one after the other."""


def other_apps(a: argparse.Namespace, results: dict[str, Any]) -> None:
    """The multilingual app's and the speaker-labelling app's scenarios, one after the other (in a thread of their
    own, with their own Playwright), each app stopped once its scenario is done."""
    mics = {"language": a.language_mic, "speakers": a.speakers_mic}
    names = [n for n in OTHER_APPS if mics[n] and (not a.only or n in a.only)]
    if not names:
        return
    starting = ThreadPoolExecutor(len(names))
    t0 = time.monotonic()
    launches = {n: starting.submit(launch, a.out.parent, *OTHER_APPS[n]) for n in names}
    starting.shutdown(wait=False)
    scenarios: dict[str, Callable[[Playwright, App], dict[str, Any]]] = {
        "language": lambda p, app: language(p, app, a.language_mic, a.language_upload, results["requests"],
                                            a.artifacts),
        "speakers": lambda p, app: speakers(p, app, a.speakers_mic, results["requests"], a.shots,
                                            a.speakers_until),
    }
    apps: list[App] = []
    try:
        with sync_playwright() as p:
            for name in names:
                try:
                    app = launches[name].result()
                except Exception as exc:
                    results[name] = {"exception": f"the app ({' '.join(OTHER_APPS[name])}) did not start: {exc!r}"}
                    continue
                apps.append(app)
                results["timings"][f"{name}_app_ready"] = round(time.monotonic() - t0, 1)
                results["origins"].append(app.url)
                try:
                    run_all([(name, lambda run=scenarios[name], app=app: run(p, app))], results, None)
                finally:
                    stop(app)
                    results[f"{name}_app_log"] = app.log.read_text()[-6000:]
    finally:
        for future in launches.values():  # an app still starting when a scenario before it failed
            if not future.cancel():
                try:
                    app = future.result()
                except Exception:
                    continue
                if app not in apps:
                    stop(app)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mic", type=Path, required=True, help="the fake microphone (16-bit WAV, looped)")
    ap.add_argument("--upload", type=Path, required=True, help="the recording the file tab is given")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shots", type=Path, required=True, help="folder for the README's screenshots")
    ap.add_argument("--artifacts", type=Path, required=True, help="folder for the other screenshots")
    ap.add_argument("--language-mic", type=Path, help="the multilingual app's browser's microphone (German, looped)")
    ap.add_argument("--language-upload", type=Path, help="the recording its file tab is given (not German)")
    ap.add_argument("--speakers-mic", type=Path, help="the speaker-labelling app's browser's microphone: people "
                    "taking turns (looped); also its file tab's upload")
    ap.add_argument("--speakers-until", help="words of a line the speaker-labelling app's live view must show, "
                                             "labelled, before its lines are read")
    ap.add_argument("--synth", type=Path, required=True, help="sentences a browser of its own plays once")
    ap.add_argument("--synth-shot", type=Path, required=True, help="its screenshot")
    ap.add_argument("--synth-expect", type=int, required=True, help="its sentences (final lines to wait for)")
    ap.add_argument("--only", nargs="*", help="run only these scenarios")
    a = ap.parse_args()
    results: dict[str, Any] = {"requests": [], "timings": {}, "origins": []}  # origins: each app's address
    other = threading.Thread(target=other_apps, args=(a, results))
    other.start()
    try:
        app = launch(a.out.parent, env=default_data(a.out))
        results["origin"] = app.url
        results["origins"].append(app.url)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                            args=[*FLAGS, f"--use-file-for-fake-audio-capture={a.mic.resolve()}"])
                context = browser.new_context(viewport={"width": 1280, "height": 800})
                context.add_init_script(FRAMES)
                context.grant_permissions(["clipboard-read", "clipboard-write"], origin=app.url)
                context.on("request", lambda q: results["requests"].append(q.url))
                context.on("page", lambda pg: pg.on("websocket", lambda ws: results["requests"].append(ws.url)))
                run_all([
                    ("live", lambda: live(context, app, a.shots)),
                    ("captions", lambda: captions(context, app, a.shots)),
                    ("file", lambda: file_tab(browser, app, a.upload, results["requests"], a.shots)),
                    ("phone", lambda: phone(browser, app, results["requests"], a.artifacts)),
                    ("synth", lambda: transcribe(p, app.url, a.synth, a.synth_shot, a.synth_expect, TIMEOUT_S)),
                    ("drop", lambda: drop(context, app, a.artifacts)),  # it kills the app
                ], results, a.only)
                browser.close()
                # the app killed, started again on its data folder: the History tab, a word of the live view searched
                said = " ".join(results.get("live", {}).get("finals") or results.get("drop", {}).get("before") or [])
                word = max(("".join(c for c in w if c.isalpha()) for w in said.split()), key=len, default="")
                run_all([("history", lambda: history(p, a.out, word, a.shots))], results, a.only)
        finally:
            stop(app)
            results["app_log"] = app.log.read_text()[-6000:]
    finally:
        other.join()
    a.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
