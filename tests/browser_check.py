"""Drive the real page in headless Chromium with a WAV as the fake microphone; write what happened as JSON.

tests/page_check.py runs `transcribe` against its default app (the `synth` scenario, read by tests/test_page.py);
standalone, in a loopback-only network namespace:
    unshare --net bash -c 'ip link set lo up && exec python tests/browser_check.py --wav W --out O --shot S'
launches `python app.py --ice-loopback` (conftest.launch) for it. The page is opened, "start stream" clicked,
#rt-transcript polled until every sentence has its final line (`--expect`), a full-page screenshot taken and
every request recorded. FLAGS, KEEP_PCS and FRAMES are the browser flags, the peer-connection hook and the frame
rate every page check uses.
"""

from __future__ import annotations

import argparse
import base64
import json
import time
from pathlib import Path
from typing import Any

from playwright.sync_api import Playwright, sync_playwright

from conftest import launch, stop

FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream", "--allow-loopback-in-peer-connection",
    "--autoplay-policy=no-user-gesture-required", "--disable-features=WebRtcHideLocalIpsWithMdns",
]
# Keep every RTCPeerConnection the page makes (to read the chosen ICE candidate pair afterwards) and every data
# channel they open, with the messages each received (FastRTC's server says "fetch_output" over it for each output).
KEEP_PCS = """(() => { const Orig = window.RTCPeerConnection; window.__pcs = []; window.__dcs = [];
  window.RTCPeerConnection = function (...a) { const pc = new Orig(...a); window.__pcs.push(pc);
    const open = pc.createDataChannel.bind(pc);
    pc.createDataChannel = (...d) => { const dc = open(...d); const kept = { dc, messages: 0 };
      dc.addEventListener("message", () => { kept.messages += 1; }); window.__dcs.push(kept); return dc; };
    return pc; };
  window.RTCPeerConnection.prototype = Orig.prototype; })();"""
CONNECTION_STATE = """async () => ({
  pcs: window.__pcs.map((pc) => [pc.connectionState, pc.iceConnectionState]),
  channels: window.__dcs.map((k) => [k.dc.label, k.dc.readyState, k.messages]),
  packets_sent: await Promise.all(window.__pcs.map(async (pc) => [...(await pc.getStats()).values()]
    .filter((s) => s.type === "outbound-rtp").reduce((n, s) => n + (s.packetsSent ?? 0), 0))) })"""
"""Each peer connection's states, each data channel's state and messages received, and the audio packets each
connection sent: what a page that shows no text was doing (`KEEP_PCS` first)."""
FRAMES = """(() => { const raf = window.requestAnimationFrame.bind(window);
  window.requestAnimationFrame = (cb) => setTimeout(() => raf(cb), 250); })();"""
"""Animation frames a quarter of a second apart, not at the display's rate. A headless browser paints the page's
microphone level and idle wave (FastRTC's, redrawn every frame) for no one, and at the display's rate that painting
was most of a streaming page's CPU (docs/testing.md), taken from the apps under test on the same cores. Nothing a
check reads depends on the frame rate: lines, progress and downloads are DOM updates, and every wait polls the DOM."""
READ = """() => { const box = document.getElementById("rt-transcript");
  const texts = (sel) => [...box.querySelectorAll(sel)].map((e) => e.textContent.trim()).filter(Boolean);
  return { finals: texts(".rt-final"), partial: texts(".rt-committed, .rt-tentative"),
           errors: texts(".rt-error"), up: window.__pcs.some((pc) => pc.connectionState === "connected") }; }"""
PLAY_ONCE_CONNECTED = """((b64) => { const open = navigator.mediaDevices.getUserMedia.bind(navigator.mediaDevices);
  navigator.mediaDevices.getUserMedia = async (c) => {
    if (!c || !c.audio) return open(c);
    const ctx = new AudioContext(); const out = ctx.createMediaStreamDestination();
    const wav = await ctx.decodeAudioData(Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0)).buffer);
    const wait = setInterval(() => {
      if (!window.__pcs.some((pc) => pc.connectionState === "connected")) return;
      clearInterval(wait); const src = ctx.createBufferSource(); src.buffer = wav; src.connect(out); src.start();
    }, 20);
    return out.stream; }; })"""
"""The microphone as a recording played once from the moment the page's peer connection is up (silence before):
Chromium's fake device plays its file from the moment the page asks for the microphone, and on a loaded machine
the connection can come up after the recording is over (`KEEP_PCS` first)."""
PAIRS = """async () => { const out = [];
  for (const pc of window.__pcs) { const stats = [...(await pc.getStats()).values()];
    const byId = Object.fromEntries(stats.map((s) => [s.id, s]));
    for (const s of stats) if (s.type === "candidate-pair" && s.state === "succeeded" && s.nominated)
      out.push([byId[s.localCandidateId]?.address, byId[s.remoteCandidateId]?.address]); }
  return out; }"""


def transcribe(p: Playwright, url: str, wav: Path, shot: Path, expect: int, timeout: float) -> dict[str, Any]:
    """The page at `url` in a browser of its own whose microphone plays `wav` once (`PLAY_ONCE_CONNECTED`): "start
    stream" clicked, #rt-transcript read until `expect` final lines show and no partial (or `timeout` seconds pass),
    a full-page screenshot to `shot` (and the transcript with a partial after a final to browser-partial.png beside
    it), every request recorded."""
    result: dict[str, Any] = {"requests": [], "console": [], "first_text_s": None, "final_text_s": None,
                              "timeline": []}
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=FLAGS)
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.add_init_script(KEEP_PCS)
        page.add_init_script(f"{PLAY_ONCE_CONNECTED}({json.dumps(base64.b64encode(wav.read_bytes()).decode())});")
        page.add_init_script(FRAMES)
        page.on("request", lambda r: result["requests"].append(r.url))
        page.on("websocket", lambda ws: result["requests"].append(ws.url))
        page.on("console", lambda m: result["console"].append(f"{m.type}: {m.text}"))
        t0 = time.monotonic()
        page.goto(url, wait_until="load")
        # The component first asks for the microphone ("Click to Access Microphone"), then shows "start stream".
        access = page.locator("#rt-webrtc").get_by_role("button", name="Click to Access Microphone")
        access.wait_for(state="visible", timeout=30_000)
        result["page_load_s"] = time.monotonic() - t0
        access.click()
        accessed = time.monotonic()
        button = page.locator('#rt-webrtc button[aria-label="start stream"]')
        button.click(timeout=10_000)
        clicked = time.monotonic()
        result["access_to_start_s"] = clicked - accessed
        state: dict[str, Any] = {"finals": [], "partial": [], "errors": []}
        partial_shot = False
        while time.monotonic() - clicked < timeout:
            now_state = page.evaluate(READ)
            now = time.monotonic()
            if "connected_s" not in result and now_state.pop("up"):
                result["connected_s"] = round(now - clicked, 2)
            if result["first_text_s"] is None and (now_state["finals"] or now_state["partial"]):
                result["first_text_s"] = round(now - clicked, 2)
            if now_state["finals"] != state["finals"]:
                result["final_text_s"] = round(now - clicked, 2)
                result["timeline"].append([round(now - clicked, 2), len(now_state["finals"])])
            if not partial_shot and now_state["finals"] and len(now_state["partial"]) == 2:
                page.locator("#rt-transcript").screenshot(path=str(shot.with_name("browser-partial.png")))
                partial_shot = True
            state = now_state
            if len(state["finals"]) >= expect and not state["partial"]:  # every sentence has its final
                break
            page.wait_for_timeout(100)
        result.update(state, ice_pairs=page.evaluate(PAIRS))
        page.screenshot(path=str(shot), full_page=True)
        result["status"] = page.inner_text("#rt-status")
    finally:
        browser.close()
    return result


def run(wav: Path, shot: Path, expect: int, timeout: float) -> dict[str, Any]:
    """`transcribe` against an app of its own (`python app.py --ice-loopback`), with the app's log."""
    result: dict[str, Any] = {}
    app = launch(wav.parent)
    try:
        with sync_playwright() as p:
            result = transcribe(p, app.url, wav, shot, expect, timeout)
    finally:
        stop(app)
        result["app_log"] = app.log.read_text()[-4000:]
    return result


TIMEOUT_S = 150.0
"""Seconds after the click for every final to show: reached only when something is wrong."""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wav", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shot", type=Path, required=True)
    ap.add_argument("--expect", type=int, default=1, help="final lines to wait for")
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S,
                    help="seconds after the click for every final to show (reached only when something is wrong)")
    a = ap.parse_args()
    a.out.write_text(json.dumps(run(a.wav, a.shot, a.expect, a.timeout), indent=1))


if __name__ == "__main__":
    main()
