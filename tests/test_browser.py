"""End to end in headless Chromium: a WAV as the fake microphone, the real page, the real engine, loopback only.

tests/browser_check.py does the work inside a fresh network namespace that has only `lo` (so neither the
browser nor the server can reach another address); these tests compose the speech and check its result.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any
from urllib.parse import urlsplit

import pytest

from conftest import ARTIFACTS, ROOT
from speech import SENTENCES, Speech, compose, wer

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
SHOT = ARTIFACTS / "browser-transcript.png"
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Speech, dict[str, Any]]:
    for tool in ("/usr/bin/chromium", "unshare", "ip"):
        assert shutil.which(tool), f"{tool} is required (apt-get install chromium util-linux iproute2)"
    import playwright.sync_api  # noqa: F401  (an ImportError fails the test; it must not skip)

    tmp = tmp_path_factory.mktemp("browser")
    speech = compose(tmp / "speech.wav", SENTENCES[:3], gaps=1.2, lead=1.0, tail=2.0)
    ARTIFACTS.mkdir(exist_ok=True)
    for old in ARTIFACTS.glob("browser-*.png"):
        old.unlink()
    out = tmp / "result.json"
    check = [sys.executable, str(ROOT / "tests" / "browser_check.py"), "--wav", str(speech.path),
             "--out", str(out), "--shot", str(SHOT), "--expect", str(len(speech.texts))]
    proc = subprocess.run(["unshare", "--net", "bash", "-c", 'ip link set lo up && exec "$@"', "netns", *check],
                          cwd=ROOT, capture_output=True, text=True, timeout=280,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and out.exists(), f"browser check failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    r = json.loads(out.read_text())
    print(f"\npage load {r['page_load_s']:.1f} s, mic access -> start {r['access_to_start_s']:.2f} s; start click -> "
          f"connected {r.get('connected_s')} s, first text {r['first_text_s']} s, final text {r['final_text_s']} s\n"
          f"finals appeared at {r['timeline']} s; ICE pairs {r['ice_pairs']}\nheard: {' '.join(r['finals'])}")
    return speech, r


def test_page_transcribes_fake_microphone(run: tuple[Speech, dict[str, Any]]) -> None:
    speech, r = run
    hyp = " ".join(r["finals"])
    assert not r["errors"], r["errors"]
    assert wer(speech.text, hyp) <= 0.35, f"WER too high: {hyp!r} vs {speech.text!r}\n{r['app_log']}"
    assert r["ice_pairs"] and all(a in LOOPBACK for pair in r["ice_pairs"] for a in pair), r["ice_pairs"]
    assert SHOT.exists() and SHOT.stat().st_size > 0


def test_page_makes_no_external_requests(run: tuple[Speech, dict[str, Any]]) -> None:
    outside = [u for u in run[1]["requests"] if urlsplit(u).scheme not in ("data", "blob")
               and urlsplit(u).hostname not in LOOPBACK]
    assert not outside, f"the page asked for non-loopback URLs: {outside}"
