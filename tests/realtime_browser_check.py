"""OpenAI's Realtime browser example in headless Chromium against the app: a WAV as the fake microphone.

Run by tests/test_realtime_api.py inside a loopback-only network namespace:
    unshare --net bash -c 'ip link set lo up && exec python tests/realtime_browser_check.py --wav W --out O --key K \
        --expect TEXT'
It launches `python app.py --ice-loopback --api-key K` (conftest.launch) and opens a small page, served by
Playwright under the app's origin, that does what OpenAI's browser example does: fetch an ephemeral client secret
(here the page holds the key; a real page asks its own backend), add the microphone track, open the `oai-events`
data channel, POST the SDP offer to /v1/realtime/calls with the secret and read the events off the channel, until
every item is completed and they read the recording's text (a busy server's VAD may close the last item seconds
after the audio ends: the check waits for what it needs to see, not for a fixed time).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from playwright.sync_api import Route, sync_playwright

from conftest import launch, stop

FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream", "--allow-loopback-in-peer-connection",
    "--autoplay-policy=no-user-gesture-required", "--disable-features=WebRtcHideLocalIpsWithMdns",
]
PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>realtime transcription</title></head><body>
<pre id="log"></pre>
<script>
window.__events = [];
window.__error = null;
async function start(key) {
  const r = await fetch("/v1/realtime/client_secrets", {method: "POST",
    headers: {Authorization: `Bearer ${key}`, "Content-Type": "application/json"},
    body: JSON.stringify({session: {type: "transcription", audio: {input: {transcription: {language: "en"}}}}})});
  const secret = (await r.json()).value;
  const pc = new RTCPeerConnection({iceServers: []});
  window.__pc = pc;
  const mic = await navigator.mediaDevices.getUserMedia({audio: true});
  pc.addTrack(mic.getTracks()[0]);
  const dc = pc.createDataChannel("oai-events");
  dc.addEventListener("message", (e) => {
    const event = JSON.parse(e.data);
    window.__events.push([performance.now() / 1000, event]);
    if (event.type === "conversation.item.input_audio_transcription.completed")
      document.getElementById("log").textContent += event.transcript + "\\n";
  });
  await pc.setLocalDescription(await pc.createOffer());
  const answer = await fetch("/v1/realtime/calls", {method: "POST", body: pc.localDescription.sdp,
    headers: {Authorization: `Bearer ${secret}`, "Content-Type": "application/sdp"}});
  if (answer.status !== 201) throw new Error(`calls answered ${answer.status}: ${await answer.text()}`);
  await pc.setRemoteDescription({type: "answer", sdp: await answer.text()});
}
</script></body></html>"""
PAIRS = """async () => { const out = []; const stats = [...(await window.__pc.getStats()).values()];
  const byId = Object.fromEntries(stats.map((s) => [s.id, s]));
  for (const s of stats) if (s.type === "candidate-pair" && s.state === "succeeded" && s.nominated)
    out.push([byId[s.localCandidateId]?.address, byId[s.remoteCandidateId]?.address]);
  return out; }"""


def heard(events: list[dict[str, Any]], expect: str, max_wer: float) -> bool:
    """Every item the server VAD opened is stopped and completed, and together they read `expect` within
    `max_wer`: the recording has been heard to its end."""
    from realtime.bench.synth import wer

    kinds = [e["type"] for e in events]
    started = kinds.count("input_audio_buffer.speech_started")
    done = kinds.count("conversation.item.input_audio_transcription.completed")
    text = " ".join(e["transcript"] for e in events
                    if e["type"] == "conversation.item.input_audio_transcription.completed")
    return started >= 1 and kinds.count("input_audio_buffer.speech_stopped") == started == done and \
        wer(expect, text) <= max_wer


def run(wav: Path, key: str, timeout: float, expect: str, max_wer: float) -> dict[str, Any]:
    result: dict[str, Any] = {"requests": [], "console": [], "events": []}
    app = launch(wav.parent, "--api-key", key)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                        args=[*FLAGS, f"--use-file-for-fake-audio-capture={wav.resolve()}%noloop"])
            page = browser.new_page()
            page.on("request", lambda r: result["requests"].append(r.url))
            page.on("console", lambda m: result["console"].append(f"{m.type}: {m.text}"))

            def serve(route: Route) -> None:
                route.fulfill(status=200, content_type="text/html", body=PAGE)

            page.route(f"{app.url}/realtime-example.html", serve)
            page.goto(f"{app.url}/realtime-example.html", wait_until="load")
            started = time.monotonic()
            page.evaluate("(key) => start(key)", key)
            pairs: list[list[str]] = []
            while time.monotonic() - started < timeout:  # until the recording has been heard, however long that takes
                events = [e for _, e in page.evaluate("() => window.__events")]
                if events and not pairs:  # the connection is up: its pair, read while it is (a busy run's call may
                    pairs = page.evaluate(PAIRS)  # be over by the time the last item completes)
                if heard(events, expect, max_wer):
                    break
                page.wait_for_timeout(200)
            result["events"] = page.evaluate("() => window.__events")
            result["ice_pairs"] = pairs or page.evaluate(PAIRS)
            result["transcript"] = page.inner_text("#log")
            browser.close()
    finally:
        stop(app)
        result["app_log"] = app.log.read_text()[-4000:]
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wav", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--expect", required=True, help="the recording's text: the check ends once it has been heard")
    ap.add_argument("--max-wer", type=float, default=0.25, help="how close the completed transcripts must come")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds after the start: reached only on a fault")
    a = ap.parse_args()
    a.out.write_text(json.dumps(run(a.wav, a.key, a.timeout, a.expect, a.max_wer), indent=1))


if __name__ == "__main__":
    main()
